"""dynamic_rnn, bidirectional_dynamic_rnn and raw_rnn at their edges, against
tf.compat.v1.nn's functions on the same cells: the shortest lengths (0, 1 and
2 steps) with every kind of cell in every mode, and closures the op cannot
trace, which only run eagerly.

The op traces one step of the cell (`op/probe.py`) before any loop runs. In a
TF1 graph that trace is the cell's first call after it is built, and
tf_keras's legacy cells (`tf.compat.v1.nn.rnn_cell`) cache the variable scope
of that call, with its graph, entering it again on every later call outside
a function: a one-step run (no loop, the cell called in the caller's graph)
returned the trace's tensors ("... is not an element of this graph"), and so
did every later call of the cell. Eagerly the op runs its loops as one traced
function, so a `loop_fn` or cell reading an eager TensorArray (or a Python
list) at the step's index cannot be traced: raw_rnn and dynamic_rnn then run
as TensorFlow runs them, eagerly.
"""

import numpy as np
import pytest
import tensorflow as tf
from tf_keras.src.layers.rnn import legacy_cell_wrappers
from tf_keras.src.layers.rnn import legacy_cells as rnn_cell

import keras
import tf_recurrent
from tf_recurrent.compat import dynamic
from conftest import assert_all_close, pairwise

B, D, H = 3, 4, 5
V1 = tf.compat.v1.nn
ZERO = tf.UnconnectedGradients.ZERO


def make_cell(kind):
  """A fresh cell of `kind`, float32."""
  legacy = {
      "legacy_lstm": lambda: rnn_cell.LSTMCell(H, use_peepholes=True),
      "legacy_gru": lambda: rnn_cell.GRUCell(H),
      "legacy_multi": lambda: rnn_cell.MultiRNNCell(
          [rnn_cell.LSTMCell(3), rnn_cell.BasicRNNCell(H)]),
      # Residual needs the output size of the inputs.
      "legacy_residual": lambda: legacy_cell_wrappers.ResidualWrapper(
          rnn_cell.GRUCell(D)),
  }
  if kind == "keras_lstm_relu":  # Keras 3, on the op.
    return keras.layers.LSTMCell(H, activation="relu")
  return legacy[kind]()


CELLS = ["legacy_gru", "legacy_multi", "legacy_residual", "keras_lstm_relu"]


def variables_of(cell):
  """The cell's trainable tf.Variables (a Keras 3 one wraps its own)."""
  return [v.value if isinstance(v, keras.Variable) else v
          for v in cell.trainable_variables]


def initial_state(cell, listed=True):
  """The zero state, as TF1 code passes it (tf.compat.v1.nn's dynamic_rnn
  needs it for a Keras 3 cell, whose state it cannot make, and a list where
  Keras's state_size is an int; its raw_rnn, the state_size's structure)."""
  state = dynamic._initial_state(cell, B, tf.float32)
  if (listed and isinstance(cell, keras.layers.Layer) and
      not tf.nest.is_nested(state)):
    return [state]
  return state


def run_functional(lib, fn, cell, x, lengths, steps):
  """`lib`'s `fn` (dynamic, bidirectional or raw; lib is tf_recurrent or
  tf.compat.v1.nn) on batch-major `x`: a flat list of its results."""
  state0 = initial_state(cell, listed=fn != "raw")
  if fn == "dynamic":
    return tf.nest.flatten(lib.dynamic_rnn(
        cell, x, sequence_length=lengths, initial_state=state0))
  if fn == "bidirectional":
    return tf.nest.flatten(lib.bidirectional_dynamic_rnn(
        cell, cell, x, sequence_length=lengths, initial_state_fw=state0,
        initial_state_bw=state0))
  # raw: TensorFlow's own example, the inputs read from a TensorArray.
  inputs_ta = tf.TensorArray(tf.float32, size=steps).unstack(
      tf.transpose(x, [1, 0, 2]))
  ends = tf.constant([steps] * B) if lengths is None else lengths

  def loop_fn(time, cell_output, cell_state, loop_state):
    # A Keras GRUCell returns its state as a list, its state_size an int.
    state = state0 if cell_output is None else tf.nest.pack_sequence_as(
        state0, tf.nest.flatten(cell_state))
    finished = time >= ends
    next_input = tf.cond(tf.reduce_all(finished), lambda: tf.zeros([B, D]),
                         lambda: inputs_ta.read(time))
    return finished, next_input, state, cell_output, loop_state

  emit_ta, state, _ = lib.raw_rnn(cell, loop_fn)
  return [emit_ta.stack()] + tf.nest.flatten(state)


def dense(gradients):
  """Gradients as tensors (tf.gather's are IndexedSlices)."""
  return [tf.convert_to_tensor(g) for g in gradients]


def loss_of(values):
  return sum(tf.reduce_sum(tf.sin(v) * (1.0 + i))
             for i, v in enumerate(values))


def both(mode, kind, fn, steps, lengths):
  """(ours, theirs): each a pair (values, gradients of inputs and the cell's
  variables), and the graph of a call of the cell made after both, in the
  caller's graph."""
  x = np.random.default_rng(steps).normal(size=[B, steps, D]).astype(
      np.float32)

  def build(cell):
    inputs = tf.constant(x)
    lens = None if lengths is None else tf.constant(lengths)
    results = []
    for lib in (tf_recurrent, V1):  # Ours first: it builds the cell.
      with tf.GradientTape() as tape:
        tape.watch(inputs)
        values = run_functional(lib, fn, cell, inputs, lens, steps)
        loss = loss_of(values)
      sources = [inputs] + variables_of(cell)
      if tf.executing_eagerly() or tf.inside_function():
        grads = tape.gradient(loss, sources, unconnected_gradients=ZERO)
      else:
        grads = tf.gradients(loss, sources, unconnected_gradients=ZERO)
      results.append((values, grads))
    after, _ = cell(tf.zeros([B, D]), initial_state(cell))
    return results, after

  if mode == "tf1":
    with tf.Graph().as_default() as graph:
      results, after = build(make_cell(kind))
      assert tf.nest.flatten(after)[0].graph is graph
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        return session.run(results)
  cell = make_cell(kind)
  if mode == "function":  # The cell's variables made outside, on its build.
    cell_input = tf.zeros([B, D])
    cell(cell_input, initial_state(cell)) if not isinstance(
        cell, keras.layers.Layer) else cell.build(cell_input.shape)
    return tf.function(lambda: build(cell)[0], autograph=False)()
  return build(cell)[0]


def where(kind, mode, fn, steps, lengths):
  # TensorFlow's raw_rnn with no steps learns no input shape, and its
  # bidirectional_dynamic_rnn builds a cell with two sets of inputs.
  # raw_rnn (the dearest: it runs its loop twice) only in TF1 graphs, with
  # two cells: in a tf.function it is test_dynamic.py's, eagerly below's.
  # Eagerly at no steps with lengths given, TensorFlow's
  # bidirectional_dynamic_rnn raises ("seq_dim must be < input rank": its
  # outputs stack to a [0] tensor): test_bidirectional_at_no_steps_eagerly
  # checks ours there.
  return not any((
      fn == "raw" and steps == 0,
      fn == "bidirectional" and kind == "legacy_residual",
      fn == "raw" and (mode != "tf1" or
                       kind not in ("legacy_multi", "keras_lstm_relu")),
      fn == "bidirectional" and mode == "eager" and steps == 0 and
      lengths is not None))


@pytest.mark.parametrize("kind,mode,fn,steps,lengths", pairwise(
    CELLS, ["tf1", "eager", "function"], ["dynamic", "bidirectional", "raw"],
    [0, 1, 2], [None, "given"], where=where,
    edges=[(kind, "tf1", "dynamic", 1, None)
           for kind in ("legacy_lstm", "legacy_gru", "legacy_multi")]))
def test_short_sequences_match_compat_v1(kind, mode, fn, steps, lengths):
  """At T = 1 in a TF1 graph, a legacy cell's outputs and final state were
  the probe's trace's tensors (their graph `one_step`), which Session.run
  refused, and so were the cell's later calls."""
  lengths = None if lengths is None else [steps, 0, min(steps, 1)]
  (ours, our_grads), (theirs, their_grads) = both(mode, kind, fn, steps,
                                                  lengths)
  assert len(ours) == len(theirs)
  # Eagerly TensorFlow stacks no steps into a [0] tensor, ours [B, 0, H].
  ours, theirs = zip(*[(a, b) if np.size(a) or np.size(b) else (0.0, 0.0)
                       for a, b in zip(ours, theirs)])
  assert_all_close(ours, theirs, 1e-5)
  assert_all_close(our_grads, their_grads, 1e-4)


@pytest.mark.parametrize("kind", ["legacy_multi", "keras_lstm_relu"])
def test_bidirectional_at_no_steps_eagerly(kind):
  """No steps, lengths given, eagerly (where tf.compat.v1.nn's raises): no
  outputs, each direction's final state its initial state, and the
  gradients of a loss of them: the states' own weights, nothing else."""
  cell = make_cell(kind)
  x = tf.zeros([B, 0, D])
  state0 = initial_state(cell, listed=True)
  with tf.GradientTape() as tape:
    tape.watch([x, state0])
    (out_fw, out_bw), (final_fw, final_bw) = (
        tf_recurrent.bidirectional_dynamic_rnn(
            cell, cell, x, sequence_length=tf.constant([0] * B),
            initial_state_fw=state0, initial_state_bw=state0))
    weights = [tf.constant(np.random.default_rng(i).normal(size=v.shape),
                           tf.float32)
               for i, v in enumerate(tf.nest.flatten(state0))]
    loss = sum(tf.reduce_sum(w * (f + 2.0 * b)) for w, f, b in zip(
        weights, tf.nest.flatten(final_fw), tf.nest.flatten(final_bw)))
  assert out_fw.shape[:2] == out_bw.shape[:2] == (B, 0)
  assert_all_close(tf.nest.flatten(final_fw), tf.nest.flatten(state0), 0.0)
  assert_all_close(tf.nest.flatten(final_bw), tf.nest.flatten(state0), 0.0)
  grads = tape.gradient(loss, [x, state0] + variables_of(cell),
                        unconnected_gradients=ZERO)
  assert grads[0].shape == (B, 0, D)
  assert_all_close(tf.nest.flatten(grads[1]), [3.0 * w for w in weights],
                   1e-6)
  assert_all_close(dense(grads[2:]), [tf.zeros_like(v)
                                      for v in variables_of(cell)], 0.0)


# Closures an eager step reads at the step's index.

CLOSURES = ["tensor_array", "python_list", "numpy_index", "eager_tensor",
            "variable"]


def closure_reader(kind, x):
  """`read(t) -> x[t]` through a closure of `kind` over time-major `x`. The
  first three only an eager step can use (the op's trace cannot), the other
  two are graph values a trace captures."""
  if kind == "tensor_array":
    return tf.TensorArray(x.dtype, size=x.shape[0]).unstack(x).read
  if kind == "python_list":
    rows = tf.unstack(x)
    return lambda t: rows[t]
  if kind == "numpy_index":
    return lambda t: x[int(t.numpy())]
  if kind == "variable":
    x = tf.Variable(x, trainable=False)
  return lambda t: tf.gather(x, t)


def raw_reading(lib, cell, kind, x, lengths):
  """TensorFlow's testRawRNN loop_fn, its inputs read through `kind`."""
  read = closure_reader(kind, x)
  state0 = initial_state(cell, listed=False)

  def loop_fn(time, cell_output, cell_state, loop_state):
    state = state0 if cell_output is None else tf.nest.pack_sequence_as(
        state0, tf.nest.flatten(cell_state))
    finished = time >= lengths
    next_input = tf.cond(tf.reduce_all(finished), lambda: tf.zeros([B, D]),
                         lambda: read(time))
    return finished, next_input, state, cell_output, loop_state

  emit_ta, state, _ = lib.raw_rnn(cell, loop_fn)
  return [emit_ta.stack()] + tf.nest.flatten(state)


@pytest.mark.parametrize("kind,closure", [
    ("keras_lstm", "tensor_array"), ("keras_gru", "tensor_array"),
    ("legacy_lstm", "python_list"), ("keras_gru", "numpy_index"),
    ("keras_lstm", "eager_tensor"), ("legacy_lstm", "variable")])
def test_raw_rnn_eagerly_reading_a_closure_matches_compat_v1(kind, closure):
  """TensorFlow's testRawRNN eagerly, a Keras 3 LSTMCell or GRUCell: the op
  traced loop_fn, where an eager TensorArray cannot be read at a symbolic
  index (OperatorNotAllowedInGraphError). What only an eager step can use
  now runs eagerly, as tf.compat.v1.nn.raw_rnn runs it; the rest on the op."""
  cell = (keras.layers.LSTMCell(H) if kind == "keras_lstm" else
          keras.layers.GRUCell(H) if kind == "keras_gru" else
          rnn_cell.LSTMCell(H))
  x = tf.constant(np.random.default_rng(5).normal(size=[6, B, D]),
                  tf.float32)
  lengths = tf.constant([6, 2, 4])
  results = []
  for lib in (tf_recurrent, V1):
    with tf.GradientTape() as tape:
      tape.watch(x)
      values = raw_reading(lib, cell, closure, x, lengths)
      loss = loss_of(values)
    results.append((values, dense(tape.gradient(
        loss, [x] + variables_of(cell), unconnected_gradients=ZERO))))
  (ours, our_grads), (theirs, their_grads) = results
  assert_all_close(ours, theirs, 1e-5)
  assert_all_close(our_grads, their_grads, 1e-4)
  if closure in ("tensor_array", "eager_tensor"):  # Gradients reach x.
    assert np.abs(our_grads[0]).sum() > 0


class EagerOnlyCell(keras.layers.Layer):
  """A GRU cell scaling its input by a Python float read with `.numpy()`
  (or branching on a tensor as a Python bool): only an eager step runs it."""

  def __init__(self, how, **kwargs):
    super().__init__(**kwargs)
    self.how = how
    self.gru = keras.layers.GRUCell(H)
    self.state_size = self.output_size = H

  def get_initial_state(self, batch_size):
    return tf.zeros([batch_size, H])

  def build(self, input_shape):
    self.gru.build(input_shape)

  def call(self, inputs, states):
    if self.how == "numpy":
      inputs = inputs * float(tf.reduce_max(inputs).numpy() > 0.5)
    elif tf.reduce_max(inputs) > 0.5:  # A tensor as a Python bool.
      inputs = inputs * 2.0
    return self.gru(inputs, states)


@pytest.mark.parametrize("how", ["numpy", "python_if"])
def test_dynamic_rnn_eagerly_with_a_cell_only_an_eager_step_runs(how):
  """dynamic_rnn eagerly over such a cell runs it eagerly (TensorFlow's
  dynamic_rnn does) instead of failing in the op's trace."""
  cell = EagerOnlyCell(how)
  x = tf.constant(np.random.default_rng(6).normal(size=[B, 4, D]),
                  tf.float32)
  lengths = tf.constant([4, 1, 3])
  state0 = tf.zeros([B, H])
  results = []
  for lib in (tf_recurrent, V1):
    with tf.GradientTape() as tape:
      tape.watch(x)
      values = tf.nest.flatten(lib.dynamic_rnn(
          cell, x, sequence_length=lengths, initial_state=state0))
      loss = loss_of(values)
    results.append((values, dense(tape.gradient(
        loss, [x] + variables_of(cell)))))
  assert_all_close(results[0], results[1], 1e-5)
