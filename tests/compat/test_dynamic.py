"""dynamic_rnn, bidirectional_dynamic_rnn and raw_rnn against a float64
static unroll, TensorFlow's own rnn_test.py cases, and tf.compat.v1.nn."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent.compat import dynamic
from tf_peers import rnn_cell
from conftest import (GRAPH_MODES, assert_all_close, in_mode, loss_weights,
                      static_unroll, values_and_grads, weighted_sum)

F64 = "float64"
B, D, H = 3, 4, 5


class MinimalRNNCell(keras.layers.Layer):
  """The cell of Keras's RNN guide: state_size and call, nothing else."""

  def __init__(self, units, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.state_size = units

  def build(self, input_shape):
    # Fixed weights, the same in every graph.
    rng = np.random.default_rng(input_shape[-1])
    self.kernel = self.add_weight(
        shape=(input_shape[-1], self.units), name="kernel",
        initializer=keras.initializers.Constant(
            rng.normal(size=(input_shape[-1], self.units)) * 0.6))
    self.recurrent_kernel = self.add_weight(
        shape=(self.units, self.units), name="recurrent_kernel",
        initializer=keras.initializers.Constant(
            rng.normal(size=(self.units, self.units)) * 0.6))

  def call(self, inputs, states):
    prev = states[0] if isinstance(states, (list, tuple)) else states
    output = tf.tanh(tf.matmul(inputs, self.kernel) +
                     tf.matmul(prev, self.recurrent_kernel))
    return output, [output]


class TupleCell:
  """An RNNCell-protocol object: tuple state, nested output, nested input."""

  def __init__(self, seed=0, nested_inputs=False):
    rng = np.random.default_rng(seed)
    self.nested_inputs = nested_inputs
    self.w = tf.Variable(rng.normal(size=[D, H]) * 0.5, name="w")
    self.v = tf.Variable(rng.normal(size=[2, 3]) * 0.5, name="v")
    self.u = tf.Variable(rng.normal(size=[H, H]) * 0.5, name="u")
    self.variables = [self.w, self.v, self.u]

  state_size = (H, 3)
  output_size = (H, (2,))

  def zero_state(self, batch_size, dtype):
    return (tf.zeros([batch_size, H], dtype), tf.zeros([batch_size, 3], dtype))

  def __call__(self, inputs, state):
    x, extra = inputs if self.nested_inputs else (inputs, None)
    h = tf.tanh(x @ self.w + state[0] @ self.u)
    c = state[1] + tf.reduce_sum(h, -1, keepdims=True)
    if extra is not None:
      c = c + extra @ self.v
    return (h, (h[:, :2] * c[:, :2],)), (h, tf.sin(c))


class NoisyCell(TupleCell):
  """TupleCell drawing a stateful random number that it multiplies by zero:
  the same math, but a step the op cannot recompute, so dynamic_rnn runs it
  under ordinary autodiff (the fallback of tf_keras's DropoutWrapper)."""

  def __call__(self, inputs, state):
    output, (h, c) = super().__call__(inputs, state)
    return output, (h + 0.0 * tf.random.uniform([], dtype=h.dtype), c)


def make_cell(kind):
  if kind == "lstm":  # Fast path: the layers' chunked loop.
    return keras.layers.LSTMCell(H, dtype=F64)
  if kind == "gru":
    return keras.layers.GRUCell(H, dtype=F64)
  if kind == "simple":  # Built-in step on the op.
    return keras.layers.SimpleRNNCell(H, dtype=F64)
  if kind == "lstm_relu":  # Generic path from here on.
    return keras.layers.LSTMCell(H, activation="relu", dtype=F64)
  if kind == "stacked":
    return keras.layers.StackedRNNCells(
        [keras.layers.LSTMCell(3, dtype=F64), keras.layers.GRUCell(H, dtype=F64)],
        dtype=F64)
  if kind == "user":
    return MinimalRNNCell(H, dtype=F64)
  if kind == "tuple":
    return TupleCell()
  if kind == "nested":
    return TupleCell(nested_inputs=True)
  if kind == "noisy":  # Ordinary autodiff.
    return NoisyCell()
  raise ValueError(kind)


def cell_variables(cell):
  """The cell's trainable tf.Variables (Keras's wrap one in `.value`)."""
  if isinstance(cell, TupleCell):  # NoisyCell too.
    return list(cell.variables)
  return [v.value for v in cell.trainable_variables]


def case(kind, seq_len, seed=0):
  rng = np.random.default_rng(seed)
  x = tf.constant(rng.normal(size=[seq_len, B, D]), tf.float64)
  if kind == "nested":
    x = (x, tf.constant(rng.normal(size=[seq_len, B, 2]), tf.float64))
  cell = make_cell(kind)
  state0 = dynamic._initial_state(cell, B, tf.float64)
  state0 = tf.nest.map_structure(
      lambda s: tf.constant(rng.normal(size=s.shape), tf.float64), state0)
  return cell, x, state0


def reference(cell, x, state0, lengths):
  """dynamic_rnn's contract as a Python loop over time-major inputs."""
  first = tf.nest.map_structure(lambda v: tf.zeros(v.shape[1:], v.dtype), x)
  zero_out = tf.nest.map_structure(tf.zeros_like, cell(first, state0)[0])

  def cell_fn(theta, s, x_t):
    del theta
    out, new = cell(x_t, s["cell"])
    new = tf.nest.pack_sequence_as(s["cell"], tf.nest.flatten(new))
    return {"cell": new, "out": out}, None

  rows, final = static_unroll({}, {"cell": state0, "out": zero_out}, x, cell_fn,
                              sequence_length=lengths)
  return rows["out"], final["cell"]


def numpy(struct):
  """Eager tensors as arrays, usable in any graph."""
  return tf.nest.map_structure(lambda v: None if v is None else v.numpy(),
                               struct)


def swap(struct):
  return tf.nest.map_structure(
      lambda v: tf.transpose(v, [1, 0] + list(range(2, v.shape.rank))), struct)


def check_against_unroll(mode, kind, lengths, time_major, seq_len=5):
  """Ours in `mode` against the unroll: outputs, final state, and gradients
  of inputs, initial state and cell variables. In "tf1" the cell is made in
  the graph and the unroll runs on a copy of its weights."""
  cell, x, state0 = case(kind, seq_len)
  reference(cell, x, state0, lengths)  # Builds the cell.
  made = {}

  def build(watch):
    ours, inputs, initial = cell, x, state0
    if mode == "tf1":
      ours, inputs, initial = case(kind, seq_len)
      dynamic._build(ours, tf.nest.map_structure(lambda v: v.shape[1:], inputs))
      made["cell"] = ours
    watch((inputs, initial))
    out, state = tf_recurrent.dynamic_rnn(
        ours, inputs if time_major else swap(inputs), sequence_length=lengths,
        initial_state=initial, time_major=time_major)
    if not time_major:
      out = swap(out)
    variables = cell_variables(ours)
    return ((out, state, [tf.convert_to_tensor(v) for v in variables]),
            weighted_sum((out, state), weights),
            tf.nest.flatten((inputs, initial, variables)))

  weights = numpy(loss_weights(reference(cell, x, state0, lengths), seed=3))
  values, grads = values_and_grads(mode, build)
  n_vars = len(cell_variables(cell))
  for v, w in zip(cell_variables(cell), values[len(values) - n_vars:]):
    v.assign(w)  # The same weights ("tf1" made fresh ones).
  with tf.GradientTape() as tape:
    tape.watch((x, state0))
    want = reference(cell, x, state0, lengths)
    loss = weighted_sum(want, weights)
  want_grads = tape.gradient(loss, (x, state0, cell_variables(cell)),
                             unconnected_gradients="zero")
  assert_all_close(values[:len(values) - n_vars], tf.nest.flatten(want), 1e-10)
  assert_all_close(grads, tf.nest.flatten(want_grads), 1e-9)


ALL_CELLS = ["lstm", "gru", "simple", "lstm_relu", "stacked", "user", "tuple",
             "nested", "noisy"]


@pytest.mark.parametrize("kind", ALL_CELLS)
@pytest.mark.parametrize("lengths,time_major", [(None, False),
                                                ([5, 0, 3], True)])
def test_matches_unroll_every_cell(kind, lengths, time_major):
  check_against_unroll("function", kind, lengths, time_major)


@pytest.mark.parametrize("kind", ["lstm", "simple", "tuple", "user", "noisy"])
@pytest.mark.parametrize("mode", ["eager", "xla", "tf1"])
def test_matches_unroll_every_mode(mode, kind):
  check_against_unroll(mode, kind, [5, 2, 5], False)


@pytest.mark.parametrize("kind", ["lstm", "user"])
@pytest.mark.parametrize("lengths", [None, [4, 4, 4], [0, 0, 0]])
def test_matches_unroll_lengths_all_equal_and_zero(kind, lengths):
  check_against_unroll("function", kind, lengths, False, seq_len=4)


@pytest.mark.parametrize("kind", ["lstm", "gru", "tuple"])
@pytest.mark.parametrize("seq_len", [0, 1])
def test_zero_and_one_steps(kind, seq_len):
  check_against_unroll("function", kind, [seq_len] * B, True, seq_len=seq_len)
  check_against_unroll("eager", kind, None, False, seq_len=seq_len)


def test_unrecomputable_cells_fall_back_to_autodiff(monkeypatch):
  """A cell drawing stateful random numbers (and a TensorArray state) runs
  under ordinary autodiff, logging why once; any other cell stays on the
  op."""
  fallbacks, logged = [], []
  real = dynamic._autodiff
  monkeypatch.setattr(dynamic, "_autodiff",
                      lambda *a: fallbacks.append(a[-1]) or real(*a))
  monkeypatch.setattr(dynamic, "_warned", set())
  monkeypatch.setattr(dynamic.logging, "warning",
                      lambda *a: logged.append(a[0] % a[1:]))
  for kind in ("noisy", "noisy", "tuple"):
    cell, x, state0 = case(kind, 3)
    tf_recurrent.dynamic_rnn(cell, x, initial_state=state0, time_major=True)
  assert len(fallbacks) == 2 and "stateful random ops" in fallbacks[0]
  assert len(logged) == 1 and "NoisyCell under ordinary autodiff" in logged[0]


def test_fallback_loops_run_steps_one_by_one():
  """The autodiff fallback's loops run one step at a time (TensorFlow's
  default lets 32 run ahead): a step's random draw does not depend on the
  state, so steps running ahead would take the seeded stream's numbers in
  scheduling order, and a seeded DropoutWrapper would not reproduce."""
  with tf.Graph().as_default() as graph:
    cell, x, state0 = case("noisy", 3)
    tf_recurrent.dynamic_rnn(cell, x, initial_state=state0, time_major=True)

    def loop_fn(time, output, state, loop_state):
      del output, loop_state
      state = state0 if state is None else state
      return (tf.fill([B], time >= 3), x[0], state, None, None)

    tf_recurrent.raw_rnn(NoisyCell(), loop_fn)
  def draws(loop):
    body = graph._get_function(loop.get_attr("body").name)  # pylint: disable=protected-access
    return any(node.op == "RandomUniform" for node in body.definition.node_def)

  loops = [o for o in graph.get_operations()
           if o.type in ("While", "StatelessWhile") and draws(o)]
  assert [o.get_attr("parallel_iterations") for o in loops] == [1, 1, 1]


def test_exact_eager_call_leaves_the_threads_call_options_as_they_were():
  """An RNNCell object's eager call turns Grappler's arithmetic optimizer
  off for the op's function only: the thread's function-call options are
  restored as they were (None: they follow the context's config)."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  thread = context.context()._thread_local_data  # pylint: disable=protected-access
  thread.function_call_options = None
  cell, x, state0 = case("tuple", 3)
  tf_recurrent.dynamic_rnn(cell, x, initial_state=state0, time_major=True)
  assert thread.function_call_options is None


def test_unknown_time_and_batch_while_tracing():
  cell, x, state0 = case("lstm", 6)
  lengths = tf.constant([6, 3, 0])
  reference(cell, x, state0, lengths)  # Builds the cell.

  @tf.function(input_signature=[tf.TensorSpec([None, None, D], tf.float64),
                                tf.TensorSpec([None], tf.int32)])
  def run(x_bm, lens):
    out, state = tf_recurrent.dynamic_rnn(cell, x_bm, sequence_length=lens,
                                          dtype=tf.float64)
    assert out.shape.as_list() == [None, None, H]
    assert state[0].shape.as_list() == [None, H]
    return out, state

  out, state = run(swap(x), lengths)
  zero_state = [tf.zeros([B, H], tf.float64)] * 2
  want_out, want_state = reference(cell, x, zero_state, lengths)
  assert_all_close((swap(out), state), (want_out, want_state), 1e-10)


# Bidirectional.


def reverse(struct, lengths):
  if lengths is None:
    return tf.nest.map_structure(lambda v: tf.reverse(v, [0]), struct)
  return tf.nest.map_structure(
      lambda v: tf.reverse_sequence(v, lengths, seq_axis=0, batch_axis=1),
      struct)


@pytest.mark.parametrize("kinds", [("lstm", "gru"), ("tuple", "user")])
@pytest.mark.parametrize("lengths,time_major", [(None, True),
                                                ([5, 2, 0], False)])
def test_bidirectional_matches_two_unrolls(kinds, lengths, time_major):
  cell_fw, x, s_fw = case(kinds[0], 5, seed=1)
  cell_bw, _, s_bw = case(kinds[1], 5, seed=2)
  with tf.GradientTape() as tape:
    tape.watch((x, s_fw, s_bw))
    out_fw, st_fw = reference(cell_fw, x, s_fw, lengths)
    out_bw, st_bw = reference(cell_bw, reverse(x, lengths), s_bw, lengths)
    want = ((out_fw, reverse(out_bw, lengths)), (st_fw, st_bw))
    weights = loss_weights(want, seed=4)
    loss = weighted_sum(want, weights)
  sources = (x, s_fw, s_bw, cell_variables(cell_fw), cell_variables(cell_bw))
  want_grads = tape.gradient(loss, sources, unconnected_gradients="zero")

  def build(watch):
    watch((x, s_fw, s_bw))
    (o_fw, o_bw), states = tf_recurrent.bidirectional_dynamic_rnn(
        cell_fw, cell_bw, x if time_major else swap(x),
        sequence_length=lengths, initial_state_fw=s_fw, initial_state_bw=s_bw,
        time_major=time_major)
    if not time_major:
      o_fw, o_bw = swap(o_fw), swap(o_bw)
    got = ((o_fw, o_bw), states)
    return got, weighted_sum(got, weights), sources

  values, grads = values_and_grads("function", build)
  assert_all_close(values, tf.nest.flatten(want), 1e-10)
  assert_all_close(grads, want_grads, 1e-9)


# TensorFlow's tensorflow/python/kernel_tests/nn_ops/rnn_test.py, ported:
# its cells and numbers, run against tf_recurrent.dynamic_rnn. (Its
# TensorArray-state cases are not ported: the op carries tensors only.)


class Plus1RNNCell:
  """RNN Cell generating (output, new_state) = (input + 1, state + 1)."""

  output_size = 5
  state_size = 5

  def zero_state(self, batch_size, dtype):
    return tf.zeros([batch_size, 5], dtype)

  def __call__(self, input_, state):
    return (input_ + 1, state + 1)


class ScalarStateRNNCell:
  """RNN Cell generating (output, new_state) = (input, state + 1)."""

  output_size = 1
  state_size = tf.TensorShape([])

  def zero_state(self, batch_size, dtype):
    del batch_size, dtype
    return tf.zeros([], dtype=tf.int32)

  def __call__(self, input_, state):
    return (input_, state + 1)


class UnbalancedOutputRNNCell(ScalarStateRNNCell):
  """RNN Cell generating (output, new_state) = ((input, [input, input]), state
  + 1)."""

  output_size = (tf.TensorShape(1), tf.TensorShape(2))

  def __call__(self, input_, state):
    concatenated = tf.concat((input_, input_), axis=-1)
    return (input_, concatenated), state + 1


@pytest.mark.parametrize("graph", [False, True])
def test_tf_invalid_sequence_length_shape(graph):
  def run():
    inputs = [tf.constant(np.ones((3, 4)))] if not graph else [
        tf.compat.v1.placeholder(tf.float32, shape=(3, 4))]
    with pytest.raises(ValueError, match="must be a vector"):
      tf_recurrent.dynamic_rnn(Plus1RNNCell(), tf.stack(inputs),
                               dtype=tf.float32, sequence_length=[[4]])
  if graph:
    with tf.Graph().as_default():
      run()
  else:
    run()


def test_sequence_length_of_unknown_rank_checked_when_run():
  """Issue 49 kind 1: TF1's lengths placeholder without a shape is taken,
  its rank and length checked when the graph runs."""
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, shape=(2, 3, 5))
    lengths = tf.compat.v1.placeholder(tf.int64)
    outputs, state = tf_recurrent.dynamic_rnn(
        Plus1RNNCell(), x, sequence_length=lengths, dtype=tf.float32)
    assert outputs.shape == (2, 3, 5) and state.shape == (2, 5)
    with pytest.raises(ValueError, match="but saw float32 of unknown rank"):
      tf_recurrent.dynamic_rnn(
          Plus1RNNCell(), x, dtype=tf.float32,
          sequence_length=tf.compat.v1.placeholder(tf.float32))
    with tf.compat.v1.Session() as session:
      feed = {x: np.zeros([2, 3, 5])}
      got, _ = session.run((outputs, state), {lengths: [3, 1], **feed})
      np.testing.assert_array_equal(got[:, :, 0], [[1, 1, 1], [1, 0, 0]])
      for bad in ([[3, 1]], [3, 1, 2]):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="sequence_length must be a vector of "
                           "length batch_size"):
          session.run(outputs, {lengths: bad, **feed})


def test_tf_batch_size_from_input():
  cell = Plus1RNNCell()
  inputs = np.zeros((3, 4, 5), dtype=np.float32)
  initial_state = np.zeros((3, 5), dtype=np.float32)
  outputs, state = tf_recurrent.dynamic_rnn(cell, inputs, dtype=tf.float32)
  assert outputs.shape[0] == 3 and state.shape[0] == 3
  outputs, state = tf_recurrent.dynamic_rnn(cell, inputs,
                                            initial_state=initial_state)
  assert outputs.shape[0] == 3 and state.shape[0] == 3
  with tf.Graph().as_default():
    inputs = tf.compat.v1.placeholder(tf.float32, shape=(None, 4, 5))
    outputs, state = tf_recurrent.dynamic_rnn(cell, inputs, dtype=tf.float32)
    assert outputs.shape.dims[0].value is None
    assert state.shape.dims[0].value is None
    outputs, state = tf_recurrent.dynamic_rnn(
        cell, inputs,
        initial_state=tf.compat.v1.placeholder(tf.float32, shape=(None, 5)))
    assert outputs.shape.dims[0].value is None
    assert state.shape.dims[0].value is None


def run_on_1234(cell, graph):
  """rnn_test.py's run: inputs [[[1], [2], [3], [4]]], eagerly or fed to a
  placeholder in a TF1 Session."""
  feed = np.array([[[1], [2], [3], [4]]], dtype=np.float32)
  if not graph:
    return tf_recurrent.dynamic_rnn(cell, feed, dtype=tf.float32,
                                    sequence_length=[4])
  with tf.Graph().as_default():
    inputs = tf.compat.v1.placeholder(tf.float32, shape=(1, 4, 1))
    outputs, state = tf_recurrent.dynamic_rnn(
        cell, inputs, dtype=tf.float32, sequence_length=[4])
    with tf.compat.v1.Session() as sess:
      return sess.run([outputs, state], feed_dict={inputs: feed})


@pytest.mark.parametrize("graph", [False, True])
def test_tf_scalar_state_is_accepted(graph):
  outputs, state = run_on_1234(ScalarStateRNNCell(), graph)
  np.testing.assert_array_equal([[[1], [2], [3], [4]]], outputs)
  np.testing.assert_array_equal(4, state)


@pytest.mark.parametrize("graph", [False, True])
def test_tf_unbalanced_output_is_accepted(graph):
  outputs, state = run_on_1234(UnbalancedOutputRNNCell(), graph)
  assert isinstance(outputs, tuple)
  np.testing.assert_array_equal([[[1], [2], [3], [4]]], outputs[0])
  np.testing.assert_array_equal([[[1, 1], [2, 2], [3, 3], [4, 4]]], outputs[1])
  np.testing.assert_array_equal(4, state)


def test_scalar_state_advances_while_any_example_runs():
  outputs, state = tf_recurrent.dynamic_rnn(
      ScalarStateRNNCell(), tf.ones([3, 4, 1]), dtype=tf.float32,
      sequence_length=[1, 3, 0])
  assert int(state) == 3
  np.testing.assert_array_equal(outputs[:, :, 0], [[1, 0, 0, 0], [1, 1, 1, 0],
                                                   [0, 0, 0, 0]])


# The contract's errors, raised before anything runs.


def test_errors_name_the_argument():
  x = tf.ones([2, 3, 4])
  with pytest.raises(TypeError, match="cell must be an RNN cell"):
    tf_recurrent.dynamic_rnn(lambda a, b: (a, b), x, dtype=tf.float32)
  with pytest.raises(TypeError, match="cell_bw must be an RNN cell"):
    tf_recurrent.bidirectional_dynamic_rnn(Plus1RNNCell(), object(), x,
                                           dtype=tf.float32)
  with pytest.raises(TypeError, match="cell must be an RNN cell"):
    tf_recurrent.raw_rnn(object(), lambda *a: a)
  with pytest.raises(TypeError, match="loop_fn must be a callable"):
    tf_recurrent.raw_rnn(Plus1RNNCell(), None)
  for empty in (None, [], ()):
    with pytest.raises(ValueError, match="inputs must not be None or empty"):
      tf_recurrent.dynamic_rnn(Plus1RNNCell(), empty, dtype=tf.float32)
  with pytest.raises(ValueError, match="you must give a dtype"):
    tf_recurrent.dynamic_rnn(Plus1RNNCell(), x)
  with pytest.raises(ValueError, match="initial_state must hold 2 tensor"):
    tf_recurrent.dynamic_rnn(keras.layers.LSTMCell(3), x,
                             initial_state=tf.zeros([2, 3]))
  with pytest.raises(ValueError, match=r"initial_state_fw\[1\] must have shape"):
    tf_recurrent.bidirectional_dynamic_rnn(
        keras.layers.LSTMCell(3), Plus1RNNCell(), x, dtype=tf.float32,
        initial_state_fw=(tf.zeros([2, 3]), tf.zeros([2, 7])))
  with pytest.raises(ValueError, match="sequence_length must be a vector"):
    tf_recurrent.dynamic_rnn(Plus1RNNCell(), x, dtype=tf.float32,
                             sequence_length=3)
  with pytest.raises(ValueError, match="sequence_length has 3 entries"):
    tf_recurrent.dynamic_rnn(Plus1RNNCell(), x, dtype=tf.float32,
                             sequence_length=[1, 2, 3])
  with pytest.raises(ValueError, match="inputs must have shape"):
    tf_recurrent.dynamic_rnn(Plus1RNNCell(), tf.ones([3]), dtype=tf.float32)


# Every mode: TF1 scope, tf.distribute, SavedModel.


def test_tf1_scope_is_the_variable_scope():
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, None, D])
    cell = keras.layers.GRUCell(H)
    out, _ = tf_recurrent.dynamic_rnn(cell, x, dtype=tf.float32,
                                      scope="encoder")
    fw, bw = keras.layers.LSTMCell(H), keras.layers.LSTMCell(H)
    (o_fw, o_bw), _ = tf_recurrent.bidirectional_dynamic_rnn(
        fw, bw, x, dtype=tf.float32, sequence_length=[3, 1])
    names = [v.name for v in tf.compat.v1.global_variables()]
    for scope, c in (("encoder/", cell), ("bidirectional_rnn/fw/", fw),
                     ("bidirectional_rnn/bw/", bw)):
      assert len(c.trainable_weights) == 3
      assert all(v.value.name.startswith(scope)
                 for v in c.trainable_weights), names
    grads = tf.compat.v1.gradients(
        tf.reduce_sum(out) + tf.reduce_sum(o_fw) + tf.reduce_sum(o_bw),
        [x] + cell.trainable_variables + fw.trainable_variables)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      results = session.run(grads, {x: np.ones([2, 3, D], np.float32)})
  assert all(np.abs(g).sum() > 0 for g in results)


def test_mirrored_strategy_matches_single_device():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
  strategy = tf.distribute.MirroredStrategy(devices)
  x = tf.constant(np.random.default_rng(0).normal(size=[2, 4, D]), tf.float32)
  with strategy.scope():
    cells = [keras.layers.LSTMCell(H), MinimalRNNCell(H)]
    for cell in cells:
      cell.build((None, D))

  def step():
    with tf.GradientTape() as tape:
      loss = 0.0
      for cell in cells:
        out, _ = tf_recurrent.dynamic_rnn(cell, x, sequence_length=[4, 2],
                                          dtype=tf.float32)
        loss += tf.reduce_sum(out ** 2)
    return tape.gradient(loss, [v for c in cells for v in c.trainable_variables])

  per_replica = strategy.run(tf.function(step))
  want = step()
  results = strategy.experimental_local_results(per_replica)
  assert len(results) == len(devices)
  for grads in results:
    assert_all_close(grads, want, 1e-5)


def test_saved_model_round_trip(tmp_path):
  class Encoder(tf.Module):

    def __init__(self):
      super().__init__()
      self.fw = keras.layers.LSTMCell(H)
      self.bw = MinimalRNNCell(H)
      self.fw.build((None, D))
      self.bw.build((None, D))

    @tf.function(input_signature=[tf.TensorSpec([None, None, D]),
                                  tf.TensorSpec([None], tf.int32)])
    def __call__(self, x, lengths):
      (fw, bw), _ = tf_recurrent.bidirectional_dynamic_rnn(
          self.fw, self.bw, x, sequence_length=lengths, dtype=tf.float32)
      return tf.concat([fw, bw], -1)

  module = Encoder()
  tf.saved_model.save(
      module, str(tmp_path),
      options=tf.saved_model.SaveOptions(experimental_custom_gradients=True))
  loaded = tf.saved_model.load(str(tmp_path))
  x = tf.constant(np.random.default_rng(1).normal(size=[2, 5, D]), tf.float32)
  lengths = tf.constant([5, 3])
  results = []
  for fn in (module, loaded):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = fn(x, lengths)
    results.append((y, tape.gradient(y, x)))
  assert_all_close(results[1], results[0], 1e-5)


# raw_rnn.


def seed_dynamic_rnn_via_raw_rnn(cell, inputs, sequence_length, batch_size,
                                 input_depth, read_tensor_array=True):
  """The contract's example: dynamic_rnn written with raw_rnn (reading a
  TensorArray, or the tensor itself)."""
  max_time = inputs.shape[0]
  inputs_ta = tf.TensorArray(dtype=inputs.dtype, size=max_time)
  inputs_ta = inputs_ta.unstack(inputs)
  read = inputs_ta.read if read_tensor_array else lambda t: tf.gather(inputs, t)

  def loop_fn(time, cell_output, cell_state, loop_state):
    emit_output = cell_output  # == None for time == 0
    if cell_output is None:  # time == 0
      next_cell_state = dynamic._initial_state(cell, batch_size, inputs.dtype)
    else:
      next_cell_state = cell_state
    elements_finished = (time >= sequence_length)
    finished = tf.reduce_all(elements_finished)
    next_input = tf.cond(
        finished,
        lambda: tf.zeros([batch_size, input_depth], dtype=inputs.dtype),
        lambda: read(time))
    next_loop_state = None
    return (elements_finished, next_input, next_cell_state,
            emit_output, next_loop_state)

  outputs_ta, final_state, _ = tf_recurrent.raw_rnn(cell, loop_fn)
  return outputs_ta.stack(), final_state


@pytest.mark.parametrize("mode", ["function", "tf1"])
@pytest.mark.parametrize("kind", ["lstm", "user"])
@pytest.mark.parametrize("read_tensor_array", [True, False])
def test_raw_rnn_seed_example_equals_dynamic_rnn(mode, kind, read_tensor_array):
  """Outputs, final state and gradients (cell variables and inputs, read
  through the TensorArray or as a tensor) equal."""
  made = {} if mode == "tf1" else {"case": case(kind, 5)}
  if made:
    reference(*made["case"][:2], dynamic._initial_state(made["case"][0], B,
                                                        tf.float64), None)

  def build(watch):
    cell, inputs, _ = made.get("case") or case(kind, 5)
    lengths = tf.constant([5, 2, 3])
    watch(inputs)
    raw_out, raw_state = seed_dynamic_rnn_via_raw_rnn(
        cell, inputs, lengths, B, D, read_tensor_array)
    dyn_out, dyn_state = tf_recurrent.dynamic_rnn(
        cell, inputs, sequence_length=lengths, dtype=tf.float64,
        time_major=True)
    sines = lambda s: sum(tf.reduce_sum(tf.sin(v) * (1.0 + tf.cast(i, v.dtype)))
                          for i, v in enumerate(tf.nest.flatten(s)))
    loss = sines((raw_out, raw_state)) - sines((dyn_out, dyn_state))
    sources = cell_variables(cell) + [inputs]
    return ((raw_out, raw_state), (dyn_out, dyn_state)), loss, sources

  values, grads = values_and_grads(mode, build)
  half = len(values) // 2
  assert values[0].shape == (5, B, H)
  assert_all_close(values[:half], values[half:], 1e-12)
  assert np.abs(values[0]).sum() > 0
  assert_all_close(grads, [np.zeros_like(g) for g in grads], 1e-12)


BUDGET = (6, 5, 7)  # Examples 0 and 2 stop on the predicate, at steps 2 and 6.


class NoisyMinimalRNNCell(MinimalRNNCell):
  """MinimalRNNCell drawing a stateful random number times zero: raw_rnn
  runs it under ordinary autodiff (its fallback), the same math."""

  def call(self, inputs, states):
    output, _ = super().call(inputs, states)
    output = output + 0.0 * tf.random.uniform([], dtype=output.dtype)
    return output, [output]


def decoder_case(noisy=False):
  """A decoder feeding its output back, stopping per example once the output's
  first unit turns negative (or after a step budget)."""
  cell = (NoisyMinimalRNNCell if noisy else MinimalRNNCell)(H, dtype=F64)
  rng = np.random.default_rng(7)
  start = tf.constant(rng.normal(size=[B, H]), tf.float64)
  state0 = tf.constant(rng.normal(size=[B, H]), tf.float64)
  proj = tf.constant(rng.normal(size=[H, H]), tf.float64)
  budget = tf.constant(BUDGET)

  def loop_fn(time, cell_output, cell_state, loop_state):
    if cell_output is None:
      return (time >= budget, start, state0, None, tf.zeros([B], tf.float64))
    stop = tf.logical_or(cell_output[:, 0] < 0.0, time >= budget)
    next_input = tf.tanh(cell_output @ proj)
    emit = cell_output * 2.0
    return stop, next_input, cell_state, emit, loop_state + cell_output[:, 1]

  return cell, start, state0, proj, loop_fn


def decoder_unroll(cell, start, state0, proj, budget=BUDGET):
  """The decoder as a Python loop of TF1's pseudo-code, eagerly."""
  finished = np.zeros([B], bool)
  x, state, total, rows, t = start, state0, tf.zeros([B], tf.float64), [], 0
  while not finished.all():
    out, new_state = cell(x, state)
    new_state = new_state[0]
    t += 1
    stop = (out[:, 0].numpy() < 0.0) | (t >= np.array(budget))
    keep = tf.constant(finished)[:, None]
    state = tf.where(keep, state, new_state)
    rows.append(tf.where(keep, tf.zeros_like(out), out * 2.0))
    total = total + out[:, 1]
    x = tf.tanh(out @ proj)
    finished = finished | stop
  return tf.stack(rows), state, total


@pytest.mark.parametrize("mode", ["eager", "function", "tf1"])
@pytest.mark.parametrize("noisy", [False, True])
def test_raw_rnn_decoder_matches_unroll(mode, noisy, monkeypatch):
  """Also the fallback (noisy): ordinary autodiff's gradients equal too."""
  fallbacks = []
  real = dynamic._raw_autodiff
  monkeypatch.setattr(dynamic, "_raw_autodiff",
                      lambda *a: fallbacks.append(1) or real(*a))
  outside = decoder_case(noisy) if mode != "tf1" else None
  if outside:
    outside[0].build((B, H))

  def build(watch):
    cell, start, state0, proj, loop_fn = outside or decoder_case(noisy)
    if not cell.built:
      cell.build((B, H))
    watch((start, state0, proj))
    emit_ta, state, total = tf_recurrent.raw_rnn(cell, loop_fn)
    got = (emit_ta.stack(), state, total,
           [tf.convert_to_tensor(v) for v in cell_variables(cell)])
    return (got, weighted_sum(got[:3], weights),
            tf.nest.flatten((start, state0, proj, cell_variables(cell))))

  cell, start, state0, proj, _ = decoder_case()
  cell.build((B, H))
  weights = numpy(loss_weights(decoder_unroll(cell, start, state0, proj), 8))
  values, grads = values_and_grads(mode, build)
  for v, w in zip(cell_variables(cell), values[3:]):
    v.assign(w)  # The weights the mode's cell made.
  with tf.GradientTape() as tape:
    tape.watch((start, state0, proj))
    want = decoder_unroll(cell, start, state0, proj)
    loss = weighted_sum(want, weights)
  want_grads = tape.gradient(loss, (start, state0, proj, cell_variables(cell)),
                             unconnected_gradients="zero")
  assert bool(fallbacks) == noisy
  assert want[0].shape[0] == 6  # Example 2 stopped on the predicate.
  np.testing.assert_array_equal(np.abs(want[0][2:, 0]).sum(-1), 0)
  assert_all_close(values[:3], tf.nest.flatten(want), 1e-10)
  assert_all_close(grads, tf.nest.flatten(want_grads), 1e-9)


def test_raw_rnn_all_finished_at_start_and_errors():
  cell = keras.layers.GRUCell(H)
  x0, s0 = tf.ones([2, D]), tf.ones([2, H])

  def done(time, cell_output, cell_state, loop_state):
    del time, cell_output, cell_state
    return tf.constant([True, True]), x0, s0, None, loop_state

  emit_ta, state, loop_state = tf_recurrent.raw_rnn(cell, done)
  assert emit_ta.stack().shape == [0, 2, H] and loop_state is None
  np.testing.assert_array_equal(state, s0)

  def bad_input(time, cell_output, cell_state, loop_state):
    del cell_state, loop_state
    nested = cell_output is not None
    return (tf.fill([2], time >= 3), (x0, x0) if nested else x0, s0, None,
            None)

  with pytest.raises(ValueError, match="loop_fn returned a next_input"):
    tf_recurrent.raw_rnn(cell, bad_input)

  def bad_finished(time, cell_output, cell_state, loop_state):
    del cell_output, cell_state, loop_state
    return tf.fill([2, 1], time >= 3), x0, s0, None, None

  with pytest.raises(ValueError, match="finished as a"):
    tf_recurrent.raw_rnn(cell, bad_finished)

  with pytest.raises(ValueError, match="raw_rnn cannot run under jit_compile"):
    tf.function(lambda: tf_recurrent.raw_rnn(cell, done)[1],
                jit_compile=True)()


# Against tf.compat.v1.nn with tf_keras's legacy cells (tf.compat.v1.nn.rnn_cell
# under TF_USE_LEGACY_KERAS=1; imported in-process, tests/compat/tf_peers.py).


def _check_against_compat_v1(make, run_ours, run_theirs, x):
  cell = make()
  results = []
  # One tape per implementation (test_recurrent covers persistent tapes).
  for run in (run_theirs, run_ours):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = run(cell)
      loss = sum(tf.reduce_sum(tf.sin(v)) for v in tf.nest.flatten(out))
    variables = [v for c in (cell if isinstance(cell, tuple) else (cell,))
                 for v in c.trainable_variables]
    results.append((out, tape.gradient(
        loss, [x] + variables,
        unconnected_gradients=tf.UnconnectedGradients.ZERO)))
  (theirs, theirs_grads), (ours, ours_grads) = results
  tf.nest.assert_same_structure(ours, theirs)
  assert variables and all(v.trainable for v in variables)
  for a, b in zip(tf.nest.flatten(ours), tf.nest.flatten(theirs)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  for a, b in zip(ours_grads, theirs_grads):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_matches_compat_v1_with_tf_keras_legacy_cells():
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=[3, 6, 4]), tf.float32)
  lengths = tf.constant([6, 0, 2])
  check = functools.partial(_check_against_compat_v1, x=x)
  assert rnn_cell.LSTMCell.__module__.startswith("tf_keras")
  makes = [lambda: rnn_cell.LSTMCell(5, use_peepholes=True),
           lambda: rnn_cell.GRUCell(5),
           lambda: rnn_cell.MultiRNNCell([rnn_cell.LSTMCell(3),
                                          rnn_cell.BasicRNNCell(4)])]
  for make, time_major in ((makes[0], False), (makes[2], True)):
    xs = tf.transpose(x, [1, 0, 2]) if time_major else x
    kw = dict(sequence_length=lengths, dtype=tf.float32,
              time_major=time_major)
    check(make, lambda c, xs=xs, kw=kw: tf_recurrent.dynamic_rnn(c, xs, **kw),
          lambda c, xs=xs, kw=kw: tf.compat.v1.nn.dynamic_rnn(c, xs, **kw))
  for make in makes[:1]:
    check(lambda: (make(), makes[1]()),
          lambda c: tf_recurrent.bidirectional_dynamic_rnn(
              c[0], c[1], x, sequence_length=lengths, dtype=tf.float32),
          lambda c: tf.compat.v1.nn.bidirectional_dynamic_rnn(
              c[0], c[1], x, sequence_length=lengths, dtype=tf.float32))

  def seed_loop(cell):
    inputs_ta = tf.TensorArray(tf.float32, size=6).unstack(
        tf.transpose(x, [1, 0, 2]))
    def loop_fn(time, cell_output, cell_state, loop_state):
      del loop_state
      state = (cell.zero_state(3, tf.float32) if cell_output is None
               else cell_state)
      finished = time >= lengths
      next_input = tf.cond(tf.reduce_all(finished),
                           lambda: tf.zeros([3, 4]),
                           lambda: inputs_ta.read(tf.minimum(time, 5)))
      return finished, next_input, state, cell_output, None
    return loop_fn

  for make in makes[:1]:
    check(make,
          lambda c: tf.function(lambda: (lambda r: (r[0].stack(), r[1]))(
              tf_recurrent.raw_rnn(c, seed_loop(c))))(),
          lambda c: (lambda r: (r[0].stack(), r[1]))(
              tf.compat.v1.nn.raw_rnn(c, seed_loop(c))))


def test_matches_compat_v1_with_keras3_cells_given_their_initial_state():
  """tf.compat.v1.nn runs Keras 3 cells when given their initial state."""
  x = tf.constant(np.random.default_rng(2).normal(size=[3, 5, D]), tf.float32)
  lengths = [5, 0, 3]
  for cell in (keras.layers.GRUCell(H),
               keras.layers.LSTMCell(H, activation="relu")):
    state0 = dynamic._initial_state(cell, 3, tf.float32)
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(x)
      ours = tf_recurrent.dynamic_rnn(cell, x, sequence_length=lengths,
                                      initial_state=state0)
      theirs = tf.compat.v1.nn.dynamic_rnn(
          cell, x, sequence_length=lengths,
          initial_state=state0 if tf.nest.is_nested(state0) else [state0])
      theirs = (theirs[0], tf.nest.pack_sequence_as(
          state0, tf.nest.flatten(theirs[1])))
      loss_o = sum(tf.reduce_sum(tf.sin(v)) for v in tf.nest.flatten(ours))
      loss_t = sum(tf.reduce_sum(tf.sin(v)) for v in tf.nest.flatten(theirs))
    assert_all_close(ours, theirs, 1e-5)
    sources = [x] + cell.trainable_variables
    assert_all_close(tape.gradient(loss_o, sources),
                     tape.gradient(loss_t, sources), 1e-4)


def test_variables_built_once_and_dispatch(monkeypatch):
  """The cell's variables are created once; built-ins take the fast path."""
  def no_generic(*args):
    raise AssertionError("a plain LSTMCell ran on the generic path")

  monkeypatch.setattr(dynamic, "_generic", no_generic)
  cell = keras.layers.LSTMCell(H)
  x = tf.ones([2, 3, D])
  for lengths in (None, [3, 1]):
    tf_recurrent.dynamic_rnn(cell, x, dtype=tf.float32,
                             sequence_length=lengths)
  assert len(cell.weights) == 3 and all(v.trainable for v in cell.weights)
  cell, x, state0 = case("lstm", 3)
  reference(cell, x, state0, None)
  assert dynamic._fast(cell, tf.ones([3, B, D], tf.float64), None,
                       state0) is not None
  assert dynamic._fast(make_cell("lstm_relu"), tf.ones([3, B, D], tf.float64),
                       None, state0) is None


@pytest.mark.parametrize("mode", GRAPH_MODES[:3])
def test_in_mode_smoke_with_nested_inputs(mode):
  cell, x, state0 = case("nested", 3)
  want = reference(cell, x, state0, None)

  def run():
    return tf_recurrent.dynamic_rnn(cell, swap(x), initial_state=state0)

  out, state = in_mode(mode, run)()
  assert_all_close((swap(out), state), want, 1e-10)
