"""A second-order gradient through a hand-written first-order gradient
(`op/first_order.py`) reports itself for every source that reaches the first
order: an InvalidArgumentError naming the cause, or NaN under XLA, which
drops assertions; never None and never a number. Each source is asked alone:
asked together, one source's error hides another's None. The first order
under the same two tapes is the float64 unroll's.

A source reaches the first order through the forward pass's inputs (theta,
state0, inputs, closed-over tensors, variables, a closed-over TensorArray,
complex leaves) or only through the upstream gradient (a loss linear in the
op's outputs, whose weights are the source).
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent.chunked import fused_lstm
from tf_recurrent.chunked import sequence
from conftest import assert_all_close, in_mode, static_unroll

T, B, D = 4, 2, 3
_rng = np.random.default_rng(11)
VALUES = {
    "inputs": _rng.normal(size=[T, B, D]),
    "state0": _rng.normal(size=[B, D]),
    "theta": _rng.normal(size=[D]) * 0.7,
    "captured": _rng.normal(size=[D]),
    "complex": _rng.normal(size=[D]) * 0.5,
    "tensor_array": _rng.normal(size=[T, B, D]) * 0.5,
    "upstream": _rng.normal(size=[T, B, D]),
    "upstream_final": _rng.normal(size=[B, D]),
}
VARIABLE = _rng.normal(size=[D]) * 0.3
# Random weights of the first-order gradients in the scalar differentiated
# again (all ones could let a wrong second order through).
FIRST_WEIGHTS = [_rng.normal(size=VALUES[k].shape) for k in
                 ("theta", "state0", "inputs", "captured", "complex",
                  "tensor_array")] + [_rng.normal(size=[D])]
OP_SOURCES = ["inputs", "state0", "theta", "captured", "variable", "complex",
              "tensor_array", "upstream"]


def op_loss(sources, variable, unrolled=False):
  """A loss linear in the op's rows and final state (so that the upstream
  gradient is the source "upstream", not a function of the op's outputs),
  of a cell reading every kind of source."""
  z = tf.complex(sources["complex"], 0.5 * sources["complex"])
  # Eagerly the op cannot trace an eager TensorArray's read (test_probe.py):
  # its rows are then a closed-over tensor.
  read = (tf.TensorArray(tf.float64, size=T).unstack(
      sources["tensor_array"]).read if not tf.executing_eagerly() else
          lambda t: tf.gather(sources["tensor_array"], t))
  c = sources["captured"]

  def cell(theta, h, step):
    x_t, t = step
    rotated = tf.math.real(theta["z"] * tf.cast(h, tf.complex128))
    pre = (h * theta["w"] + x_t * c + variable + 0.3 * rotated +
           read(t))
    return tf.tanh(pre), []

  theta = {"w": sources["theta"], "z": z}
  inputs = (sources["inputs"], tf.range(T))
  run = static_unroll if unrolled else tf_recurrent.recurrent
  acc, final = run(theta, sources["state0"], inputs, cell)
  return (tf.reduce_sum(acc * sources["upstream"]) +
          tf.reduce_sum(final * sources["upstream_final"]))


def first_order_of(loss_fn, sources, variable):
  """The first-order gradients (every source but the upstream's) and their
  weighted sum, recorded on the tapes around this call."""
  watched = [sources[k] for k in ("theta", "state0", "inputs", "captured",
                                  "complex", "tensor_array")]
  with tf.GradientTape() as tape:
    tape.watch(watched)
    loss = loss_fn(sources)
  grads = [tf.convert_to_tensor(g)  # tf.gather's are IndexedSlices.
           for g in tape.gradient(loss, watched + [variable])]
  total = tf.add_n([tf.reduce_sum(g * w) for g, w in zip(grads, FIRST_WEIGHTS)])
  return grads, total


def second_order_report(value):
  """'NaN' for an all-NaN gradient, else what it is."""
  if value is None:
    return "None"
  value = np.asarray(value)
  return "NaN" if np.isnan(value).all() else f"a number {value.ravel()[:3]}"


@pytest.fixture(scope="module")
def reference():
  """The first order of the float64 unroll, by GradientTape."""
  sources = {k: tf.constant(v) for k, v in VALUES.items()}
  variable = tf.Variable(VARIABLE)
  grads, _ = first_order_of(lambda s: op_loss(s, variable, unrolled=True),
                            sources, variable)
  return grads


def op_second_orders_xla():
  """(first order, {source: second order}) in one XLA-compiled function,
  the tapes inside (a TensorArray cannot cross into an outer tape's
  gradient: TensorFlow has no TensorList at the XLA/TF boundary)."""
  sources = {k: tf.constant(v) for k, v in VALUES.items()}
  variable = tf.Variable(VARIABLE)

  @tf.function(jit_compile=True, autograph=False)
  def run(sources):
    with tf.GradientTape(persistent=True) as outer:
      outer.watch(list(sources.values()))
      grads, total = first_order_of(lambda s: op_loss(s, variable), sources,
                                    variable)
    return grads, {name: outer.gradient(
        total, variable if name == "variable" else sources[name])
                   for name in OP_SOURCES}

  grads, second = run(sources)
  return grads, {name: second_order_report(value)
                 for name, value in second.items()}


def op_second_orders_tf2(mode):
  """(first order, {source: second order or the error}) in a TF2 mode: the
  loss in `mode`, both tapes around it."""
  if mode == "xla":
    return op_second_orders_xla()
  sources = {k: tf.constant(v) for k, v in VALUES.items()}
  variable = tf.Variable(VARIABLE)
  loss = in_mode(mode, lambda s: op_loss(s, variable))
  with tf.GradientTape(persistent=True) as outer:
    outer.watch(list(sources.values()))
    grads, total = first_order_of(loss, sources, variable)
  reports = {}
  for name in OP_SOURCES:
    source = variable if name == "variable" else sources[name]
    try:
      reports[name] = second_order_report(outer.gradient(total, source))
    except tf.errors.InvalidArgumentError as e:
      assert "hand-written first-order gradient" in e.message
      reports[name] = "error"
  return grads, reports


def op_second_orders_tf1():
  """The same in a TF1 graph, by tf.gradients, each run on its own."""
  with tf.Graph().as_default():
    sources = {k: tf.constant(v) for k, v in VALUES.items()}
    variable = tf.compat.v1.Variable(VARIABLE, use_resource=True)
    watched = [sources[k] for k in ("theta", "state0", "inputs", "captured",
                                    "complex", "tensor_array")]
    grads = tf.gradients(op_loss(sources, variable), watched + [variable])
    total = tf.add_n([tf.reduce_sum(g * w)
                      for g, w in zip(grads, FIRST_WEIGHTS)])
    second = {name: tf.gradients(
        total, variable if name == "variable" else sources[name])[0]
              for name in OP_SOURCES}
    reports = {}
    with tf.compat.v1.Session() as session:
      session.run(variable.initializer)
      first = session.run(grads)
      for name, tensor in second.items():
        if tensor is None:
          reports[name] = "None"
          continue
        try:
          reports[name] = second_order_report(session.run(tensor))
        except tf.errors.InvalidArgumentError as e:
          assert "hand-written first-order gradient" in e.message
          reports[name] = "error"
  return first, reports


@pytest.mark.parametrize("mode", ["eager", "function", "xla", "tf1"])
def test_op_second_order_reports_itself_for_every_source(mode, reference):
  """Complex leaves and a closed-over TensorArray fell out of the guard's
  anchor (it kept floating-point tensors only): their sources' second order
  was None (TF1, eager) or a finite number (XLA). Under XLA a persistent
  tape around a step reading a variable or a TensorArray failed to compile
  the first order (TensorFlow readied the forward loop for a gradient of
  its own, accumulating every intermediate)."""
  first, reports = (op_second_orders_tf1() if mode == "tf1" else
                    op_second_orders_tf2(mode))
  assert_all_close(first, reference, tol=1e-10)
  want = "NaN" if mode == "xla" else "error"
  assert reports == {name: want for name in OP_SOURCES}


# The built-in cells' loops (chunked/sequence.py, and TensorFlow's fused LSTM
# kernels, chunked/fused_lstm.py: float32 outside XLA) guard theirs too.

H = 5
LSTM_VALUES = {
    "inputs": _rng.normal(size=[T, B, D]),
    "state0": _rng.normal(size=[B, H]),
    "kernel": _rng.normal(size=[D, 4 * H]) * 0.5,
    "recurrent_kernel": _rng.normal(size=[H, 4 * H]) * 0.5,
    "bias": _rng.normal(size=[4 * H]) * 0.5,
    "upstream": _rng.normal(size=[T, B, H]),
}
LSTM_SOURCES = ["inputs", "state0", "kernel", "upstream"]


def lstm_loss(sources, dtype, unrolled=False):
  """A loss linear in a built-in LSTM's outputs (the upstream gradient is
  the source "upstream"); its state0 is h0 = c0 = the source "state0"."""
  s = {k: tf.cast(v, dtype) for k, v in sources.items()}
  weights = {k: s[k] for k in ("kernel", "recurrent_kernel", "bias")}
  if unrolled:
    h = c = s["state0"]
    rows = []
    for t in range(T):
      z = s["inputs"][t] @ weights["kernel"] + h @ weights[
          "recurrent_kernel"] + weights["bias"]
      i, f, g, o = tf.split(z, 4, axis=-1)
      c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
      h = tf.sigmoid(o) * tf.tanh(c)
      rows.append(h)
    outputs = tf.stack(rows)
  else:
    outputs, _ = sequence.run("lstm", s["inputs"], [s["state0"]] * 2,
                              weights)
  return tf.cast(tf.reduce_sum(outputs * s["upstream"]), tf.float64)


def lstm_second_orders(mode, dtype):
  """(first order, {source: second order or the error}) of the built-in
  LSTM's loop in `mode`."""
  sources = {k: tf.constant(v) for k, v in LSTM_VALUES.items()}
  firsts = [k for k in sources if k != "upstream"]
  weights = [np.random.default_rng(12).normal(size=LSTM_VALUES[k].shape)
             for k in firsts]

  def first_order(sources, loss_fn):
    with tf.GradientTape() as tape:
      tape.watch([sources[k] for k in firsts])
      loss = loss_fn(sources)
    grads = tape.gradient(loss, [sources[k] for k in firsts])
    return grads, tf.add_n([tf.reduce_sum(g * w.astype(np.float64))
                            for g, w in zip(grads, weights)])

  if mode == "tf1":
    with tf.Graph().as_default():
      sources = {k: tf.constant(v) for k, v in LSTM_VALUES.items()}
      grads, total = first_order(sources, lambda s: lstm_loss(s, dtype))
      second = {k: tf.gradients(total, sources[k])[0] for k in LSTM_SOURCES}
      with tf.compat.v1.Session() as session:
        first = session.run(grads)
        reports = {}
        for name, tensor in second.items():
          try:
            reports[name] = second_order_report(
                None if tensor is None else session.run(tensor))
          except tf.errors.InvalidArgumentError as e:
            assert "hand-written first-order gradient" in e.message
            reports[name] = "error"
    return first, reports
  loss = in_mode(mode, lambda s: lstm_loss(s, dtype))
  with tf.GradientTape(persistent=True) as outer:
    outer.watch(list(sources.values()))
    first, total = first_order(sources, loss)
  reports = {}
  for name in LSTM_SOURCES:
    try:
      reports[name] = second_order_report(outer.gradient(total,
                                                         sources[name]))
    except tf.errors.InvalidArgumentError as e:
      assert "hand-written first-order gradient" in e.message
      reports[name] = "error"
  return first, reports


@pytest.mark.parametrize("mode,loop", [
    ("eager", "fused"), ("function", "chunked"), ("xla", "chunked"),
    ("tf1", "chunked"), ("tf1", "fused")])
def test_built_in_loops_second_order_reports_itself(mode, loop):
  dtype = tf.float32 if loop == "fused" else tf.float64
  sources = {k: tf.cast(v, dtype) for k, v in LSTM_VALUES.items()}
  if loop == "fused":
    weights = {k: sources[k] for k in ("kernel", "recurrent_kernel", "bias")}
    assert fused_lstm.applies("lstm", sources["inputs"], weights, False,
                              "graph", None, None, None)
  first, reports = lstm_second_orders(mode, dtype)
  with tf.GradientTape() as tape:
    watched = [tf.constant(v) for k, v in LSTM_VALUES.items()
               if k != "upstream"]
    tape.watch(watched)
    values = dict(zip([k for k in LSTM_VALUES if k != "upstream"], watched))
    values["upstream"] = tf.constant(LSTM_VALUES["upstream"])
    want = tape.gradient(lstm_loss(values, tf.float64, unrolled=True),
                         watched)
  assert_all_close(first, want, tol=1e-4 if loop == "fused" else 1e-10)
  want_report = "NaN" if mode == "xla" else "error"
  assert reports == {name: want_report for name in LSTM_SOURCES}


def test_persistent_tape_keeps_the_forward_loop_lean():
  """Under a persistent tape a step reading a variable made TensorFlow
  ready the op's forward loop for a gradient of its own: every step's
  intermediates pushed onto lists (the memory the op saves; under XLA a
  loop it could not compile). The loop now runs unrecorded."""
  variable = tf.Variable(VARIABLE)
  x, h0 = tf.constant(VALUES["inputs"]), tf.constant(VALUES["state0"])

  @tf.function(autograph=False)
  def first_order(x, h0):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch([x, h0])
      _, final = tf_recurrent.recurrent(
          (), h0, x, lambda _, h, x_t: (tf.tanh(h * variable + x_t), []))
    return tape.gradient(final, [x, h0, variable])

  graph = first_order.get_concrete_function(x, h0).graph
  pushes = [node.name for f in graph.as_graph_def().library.function
            for node in f.node_def if node.op == "TensorListPushBack"]
  assert not pushes
  assert all(g is not None for g in first_order(x, h0))
