"""What a cell closes over gets its gradient, in every mode, or a clear error.

One matrix: closure kinds (a tensor from an op, a constant, a TF1
placeholder, a variable read from an object, a variable in theta, a Python
value) x modes (eager, tf.function, XLA, a TF1 graph differentiated by
tf.gradients) x the default and a hand-written cell_grad, each against the
float64 static unroll differentiated by tf.GradientTape.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent.op.probe import UntraceableStepError
from conftest import MODES, assert_all_close, in_mode, static_unroll

KINDS = ("op", "constant", "placeholder", "object_variable",
         "theta_variable", "python")
STEPS, BATCH, DIM = 4, 2, 3
_rng = np.random.default_rng(7)
W = _rng.normal(size=[DIM]) * 0.8
C = _rng.normal(size=[DIM])
H0 = _rng.normal(size=[BATCH, DIM])
X = _rng.normal(size=[STEPS, BATCH, DIM])
ACC_WEIGHTS = _rng.normal(size=[STEPS, BATCH, DIM])
PYTHON_C = 0.7


def transform(kind, source):
  """The value the cell reads: an op applied to the source for "op"."""
  return tf.sin(source) if kind == "op" else source


def make_cell(read_c):
  """A cell `h = tanh(h * w + x * c)` reading c through `read_c(theta)`."""

  def cell(theta, state, x_t):
    h = tf.tanh(state * theta["w"] + x_t * read_c(theta))
    return h, {"h": h}

  def cell_grad(theta, state0, x_t, extras, dstate1):
    dpre = dstate1 * (1.0 - tf.square(extras["h"]))
    dtheta = {"w": tf.reduce_sum(dpre * state0, 0)}
    if "c" in theta:
      dtheta["c"] = tf.reduce_sum(dpre * x_t, 0)
    return dtheta, dpre * theta["w"], dpre * read_c(theta)

  return cell, cell_grad


def loss_of(acc, final):
  return (tf.reduce_sum(acc * tf.constant(ACC_WEIGHTS)) +
          tf.reduce_sum(final * final))


def build(kind, hand_written_grad, watch, new_variable):
  """The op on a cell closing over `kind`; returns (loss, sources, feed)."""
  w, h0, x = (tf.constant(v) for v in (W, H0, X))
  watch([w, h0, x])
  theta, feed, source = {"w": w}, {}, None
  if kind == "op":
    source = tf.constant(C)
    watch(source)
    closed = transform(kind, source)
  elif kind == "constant":
    source = closed = tf.constant(C)
    watch(source)
  elif kind == "placeholder":
    source = closed = tf.compat.v1.placeholder(tf.float64, [DIM])
    feed[source] = C
  elif kind == "object_variable":
    holder = type("Holder", (), {})()
    holder.v = source = new_variable()
    closed = None
  elif kind == "theta_variable":
    theta["c"] = source = new_variable()
  else:
    closed = PYTHON_C

  def read_c(theta):
    if kind == "object_variable":
      return holder.v
    return theta["c"] if "c" in theta else closed

  cell, cell_grad = make_cell(read_c)
  acc, final = tf_recurrent.recurrent(
      theta, h0, x, cell, cell_grad if hand_written_grad else None)
  sources = [w, h0, x] + ([source] if source is not None else [])
  return loss_of(acc, final), sources, feed


def reference(kind):
  """Loss and gradients of the float64 static unroll, by GradientTape."""
  w, h0, x = (tf.constant(v) for v in (W, H0, X))
  source = tf.constant(C)
  with tf.GradientTape() as tape:
    tape.watch([w, h0, x, source])
    c = PYTHON_C if kind == "python" else transform(kind, source)
    cell, _ = make_cell(lambda theta: c)
    acc, final = static_unroll({"w": w}, h0, x, cell)
    loss = loss_of(acc, final)
  sources = [w, h0, x] + ([] if kind == "python" else [source])
  return loss, tape.gradient(loss, sources)


def run_tf2(mode, kind, hand_written_grad):
  variable = tf.Variable(C)  # Variables are made outside any tf.function.

  def run():
    with tf.GradientTape() as tape:
      loss, sources, _ = build(kind, hand_written_grad, tape.watch,
                               lambda: variable)
    return loss, tape.gradient(loss, sources)

  return in_mode(mode, run)()


def run_tf1(kind, hand_written_grad):
  with tf.Graph().as_default():
    loss, sources, feed = build(kind, hand_written_grad, lambda _: None,
                                lambda: tf.Variable(C))
    grads = tf.gradients(loss, sources)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run((loss, grads), feed)


CAPTURE_ERRORS = {
    "op": "closes over tensors",
    "constant": "closes over tensors",
    "placeholder": "closes over tensors",
    "object_variable": "reads trainable variables",
}


# Placeholders exist only in TF1 graphs.
CASES = [(kind, mode) for kind in KINDS for mode in MODES + ("tf1",)
         if kind != "placeholder" or mode == "tf1"]


@pytest.mark.parametrize("hand_written_grad", [False, True])
@pytest.mark.parametrize("kind,mode", CASES)
def test_closure_gets_its_gradient_or_a_clear_error(kind, mode,
                                                    hand_written_grad):
  run = ((lambda: run_tf1(kind, hand_written_grad)) if mode == "tf1" else
         (lambda: run_tf2(mode, kind, hand_written_grad)))
  if hand_written_grad and kind in CAPTURE_ERRORS:
    # A custom cell_grad returns gradients for theta, state0 and inputs only.
    with pytest.raises(ValueError, match=CAPTURE_ERRORS[kind]):
      run()
    return
  loss, grads = run()
  want_loss, want_grads = reference(kind)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-10)
  assert_all_close(list(grads), want_grads, tol=1e-9)


def test_the_error_names_the_closure():
  with tf.Graph().as_default():
    scale = tf.constant(C, name="my_scale")
    cell, cell_grad = make_cell(lambda theta: scale)
    with pytest.raises(ValueError, match="my_scale.*Pass them in theta"):
      tf_recurrent.recurrent({"w": tf.constant(W)}, tf.constant(H0),
                             tf.constant(X), cell, cell_grad)


def eager_only_reader(kind, x):
  """`read(t) -> x[t]` as only an eager step can: eager TensorArray, Python
  list, `.numpy()` index."""
  if kind == "tensor_array":
    return tf.TensorArray(x.dtype, size=x.shape[0]).unstack(x).read
  if kind == "python_list":
    return tf.unstack(x).__getitem__
  return lambda t: x[int(t.numpy())]


@pytest.mark.parametrize("kind", ["tensor_array", "python_list", "numpy"])
def test_eager_call_names_what_only_an_eager_step_can_use(kind):
  """Eagerly the op traces its step: reading an eager TensorArray at the
  step's index raised OperatorNotAllowedInGraphError from deep in the trace.
  It is an UntraceableStepError (a TypeError) saying why and what to do;
  inside a tf.function the same cell reads graph values and runs."""
  x = tf.constant(X)

  def run():
    read = eager_only_reader(kind, x) if tf.executing_eagerly() else (
        lambda t: tf.gather(x, t))
    return tf_recurrent.recurrent(
        (), tf.constant(H0), tf.range(STEPS),
        lambda _, h, t: (tf.tanh(h + read(t)), []))[1]

  with pytest.raises(UntraceableStepError,
                     match="(?s)only an eager one.*Pass such values through"):
    run()
  assert issubclass(UntraceableStepError, TypeError)
  h = H0
  for t in range(STEPS):
    h = np.tanh(h + X[t])
  np.testing.assert_allclose(tf.function(run)(), h, rtol=1e-12)


def test_eager_call_keeps_a_step_bugs_own_error():
  """Any other error tracing the step raises is the step's own, as is."""
  with pytest.raises(TypeError, match="has no len") as raised:
    tf_recurrent.recurrent((), tf.constant(H0), tf.constant(X),
                           lambda _, h, x: (h + len(3), []))
  assert not isinstance(raised.value, UntraceableStepError)


@pytest.mark.parametrize("steps,built", [(0, True), (1, False), (1, True),
                                         (2, False)])
def test_tf1_layer_in_the_cell_lives_in_the_callers_graph(steps, built):
  """A tf_keras legacy layer (tf.compat.v1.layers) called in cell_fn in a
  TF1 graph: its first call in the probe's trace created its variables
  outside the graph's collections (TF1 optimizers would not train them),
  and the trace's graph was cached in its variable scope: the one-step run
  (T = 1) and every later call of the layer were built into the trace
  ("must be from the same graph"). Values and gradients equal the unroll's."""
  from tf_keras.src.legacy_tf_layers import core  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default() as graph:
    dense = core.Dense(DIM, dtype=tf.float64)
    h0, x = tf.constant(H0), tf.constant(X[:steps])
    if built:
      dense.build(h0.shape)
    cell = lambda _, h, x_t: (tf.tanh(dense(h) + x_t), [])
    acc, final = tf_recurrent.recurrent((), h0, x, cell)
    after = dense(h0)
    assert final.graph is graph and after.graph is graph
    variables = tf.compat.v1.trainable_variables()
    assert len(variables) == 2 and set(variables) == set(dense.weights)
    want_acc, want_final = static_unroll((), h0, x, cell)
    loss = lambda acc, final: (tf.reduce_sum(tf.sin(acc)) +
                               tf.reduce_sum(final * final))
    sources = [h0, x] + variables
    grads = tf.gradients(loss(acc, final), sources,
                         unconnected_gradients=tf.UnconnectedGradients.ZERO)
    want_grads = tf.gradients(
        loss(want_acc, want_final), sources,
        unconnected_gradients=tf.UnconnectedGradients.ZERO)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      got, want = session.run(((acc, final, grads),
                               (want_acc, want_final, want_grads)))
  assert_all_close(got, want, tol=1e-12)
