"""tf_recurrent.recurrent against a static Python unroll, in every mode."""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from conftest import (GRAPH_MODES, MODES, assert_all_close, assert_numerical_gradients,
                      elman_args, elman_cell, elman_grad, in_mode, loss_weights,
                      pairwise, recomputing_cell_grad, static_unroll,
                      values_and_grads, weighted_sum)

Theta = collections.namedtuple("Theta", "x")
Coeff = collections.namedtuple("Coeff", "coeff")


def poly_cell(theta, state, inputs):
  return {
      "value": state["value"] + inputs.coeff * state["x_power"],
      "x_power": state["x_power"] * theta.x,
  }, []


def test_polynomial_matches_upstream(mode):
  """The tf.contrib test: 1 + 2x + 3x^2 at x=2, and its gradients."""

  def run(x, coeff):
    with tf.GradientTape() as tape:
      tape.watch([x, coeff])
      acc, final = tf_recurrent.recurrent(
          Theta(x), {"value": tf.constant(0.0), "x_power": tf.constant(1.0)},
          Coeff(coeff), poly_cell)
    return acc, final, tape.gradient(final["value"], [x, coeff])

  acc, final, (dx, dcoeff) = in_mode(mode, run)(tf.constant(2.0),
                                                 tf.constant([1.0, 2.0, 3.0]))
  np.testing.assert_allclose(acc["value"], [1, 5, 17])
  np.testing.assert_allclose(acc["x_power"], [2, 4, 8])
  assert float(final["value"]) == 17.0
  assert isinstance(acc, dict)
  assert float(dx) == 14.0
  np.testing.assert_allclose(dcoeff, [1, 2, 4])


def value_and_grads(run_op, theta, state0, inputs, weights):
  """Loss over acc and final state, and its gradients w.r.t. every argument."""
  with tf.GradientTape() as tape:
    tape.watch([theta, state0, inputs])
    acc, final = run_op(theta, state0, inputs)
    loss = weighted_sum(acc, weights[0]) + weighted_sum(final, weights[1])
  return acc, final, tape.gradient(loss, [theta, state0, inputs])


def elman_weights(seq_len, state0):
  return (loss_weights({"h": tf.zeros([seq_len, 3, 5])}, 1),
          loss_weights(state0, 2))


@functools.lru_cache(maxsize=None)
def elman_reference(seq_len):
  """The unroll's rows, final state and gradients, shared by the modes and
  gradients."""
  theta, state0, inputs = elman_args(seq_len)

  def ref(t, s, x):
    return static_unroll(t, s, x, elman_cell)

  return value_and_grads(ref, theta, state0, inputs,
                         elman_weights(seq_len, state0))


# Modes x lengths x gradients: all pairs (the whole product with --full).
@pytest.mark.parametrize("mode,seq_len,hand_written_grad", pairwise(
    MODES, [1, 7], [False, True]))
def test_elman_matches_static_unroll(mode, seq_len, hand_written_grad):
  theta, state0, inputs = elman_args(seq_len)
  weights = elman_weights(seq_len, state0)
  grad = elman_grad if hand_written_grad else None

  def op(t, s, x):
    return tf_recurrent.recurrent(t, s, x, elman_cell, cell_grad=grad)

  got = in_mode(mode, lambda *a: value_and_grads(op, *a, weights))(
      theta, state0, inputs)
  assert_all_close(got, elman_reference(seq_len), tol=1e-9)


def test_numerical_gradients_float64():
  theta, state0, inputs = elman_args(4, batch=2, dim_in=2, dim_h=3)

  def loss(w, u, h0, x):
    acc, final = tf_recurrent.recurrent({"w": w, "u": u, "b": theta["b"]},
                                        {"h": h0}, x, elman_cell)
    return tf.reduce_sum(acc["h"] * acc["h"]) + tf.reduce_sum(final["h"])

  assert_numerical_gradients(loss,
                             [theta["w"], theta["u"], state0["h"], inputs])


def test_numerical_gradients_with_hand_written_grad_and_length():
  theta, state0, inputs = elman_args(5, batch=2, dim_in=2, dim_h=3)

  def loss(w, h0, x):
    acc, _ = tf_recurrent.recurrent({"w": w, "u": theta["u"], "b": theta["b"]},
                                    {"h": h0}, x, elman_cell, elman_grad,
                                    max_input_length=tf.constant(3))
    return tf.reduce_sum(tf.sin(acc["h"]))

  assert_numerical_gradients(loss, [theta["w"], state0["h"], inputs])


def max_input_length_weights(state0):
  return (loss_weights({"h": tf.zeros([6, 3, 5])}, 3), loss_weights(state0, 4))


@functools.lru_cache(maxsize=None)
def max_input_length_reference():
  """The 4-step unroll of 6 inputs, shared by the modes and length kinds."""
  theta, state0, inputs = elman_args(6)
  return value_and_grads(
      lambda t, s, x: static_unroll(t, s, x, elman_cell, num_steps=4),
      theta, state0, inputs, max_input_length_weights(state0))


@pytest.mark.parametrize("length_kind", ["python", "tensor"])
def test_max_input_length_zeros_past_the_end(mode, length_kind):
  theta, state0, inputs = elman_args(6)
  weights = max_input_length_weights(state0)

  def op(t, s, x):
    n = 4 if length_kind == "python" else tf.constant(4)
    return tf_recurrent.recurrent(t, s, x, elman_cell, max_input_length=n)

  got = in_mode(mode, lambda *a: value_and_grads(op, *a, weights))(
      theta, state0, inputs)
  assert_all_close(got, max_input_length_reference(), tol=1e-9)
  acc, _, (_, _, dinputs) = got
  assert np.all(np.asarray(acc["h"])[4:] == 0)
  assert np.all(np.asarray(dinputs)[4:] == 0)


def test_zero_steps_returns_state0_and_empty_accumulators(mode):
  theta, state0, _ = elman_args(1)
  inputs = tf.zeros([0, 3, 4], tf.float64)

  def run(t, s, x):
    with tf.GradientTape() as tape:
      tape.watch(s)
      acc, final = tf_recurrent.recurrent(t, s, x, elman_cell)
      loss = tf.reduce_sum(final["h"])
    return acc, final, tape.gradient(loss, s)

  acc, final, dstate0 = in_mode(mode, run)(theta, state0, inputs)
  assert acc["h"].shape == [0, 3, 5]
  assert_all_close(final, state0)
  np.testing.assert_allclose(dstate0["h"], np.ones([3, 5]))


def test_unknown_length_traces_once():
  traces = []

  def cell(theta, state, x):
    traces.append(1)
    return elman_cell(theta, state, x)

  theta, state0, _ = elman_args(1, dtype=tf.float32)
  spec = tf.TensorSpec([None, 3, 4], tf.float32)

  @tf.function(input_signature=[spec])
  def run(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      acc, _ = tf_recurrent.recurrent(theta, state0, x, cell)
      loss = tf.reduce_sum(acc["h"])
    return acc["h"], tape.gradient(loss, x)

  for seq_len in (2, 5, 9):
    x = tf.random.normal([seq_len, 3, 4])
    acc, dx = run(x)
    want_acc, _ = static_unroll(theta, state0, x, elman_cell)
    np.testing.assert_allclose(acc, want_acc["h"], rtol=1e-5, atol=1e-5)
    assert dx.shape == [seq_len, 3, 4]
  after_first = len(traces)
  run(tf.random.normal([4, 3, 4]))
  assert len(traces) == after_first
  assert run.experimental_get_tracing_count() == 1


def test_eager_calls_reuse_one_trace():
  traces = []

  def cell(theta, state, x):
    traces.append(1)
    return elman_cell(theta, state, x)

  theta, state0, inputs = elman_args(3)
  tf_recurrent.recurrent(theta, state0, inputs, cell)
  first = len(traces)
  for _ in range(3):
    tf_recurrent.recurrent(theta, state0, inputs, cell)
  # Each eager call traces one step to check it, but never the loops again.
  assert len(traces) - first == 3


def test_eager_calls_with_new_closures_of_one_computation_reuse_one_trace():
  """A fresh lambda per call (as the Keras layers make) computing the same
  step on the same objects is not traced again."""
  traces = []
  theta, state0, inputs = elman_args(3)

  def make_cell():
    def cell(theta, state, x):
      traces.append(1)
      return elman_cell(theta, state, x)
    return cell

  tf_recurrent.recurrent(theta, state0, inputs, make_cell())
  first = len(traces)
  for _ in range(3):
    tf_recurrent.recurrent(theta, state0, inputs, make_cell())
  assert len(traces) - first == 3


class ScaledCell:
  """A cell object whose weight, scale and mode can change between calls."""

  def __init__(self, weight):
    self.w = tf.Variable(weight, dtype=tf.float64)
    self.training = False

  def __call__(self, theta, state, x):
    if self.training:
      x = x * 2.0
    return state + x * self.w * SCALE, []


SCALE = 1.0


def eager_final_and_grad(cell, x):
  with tf.GradientTape() as tape:
    _, final = tf_recurrent.recurrent((), tf.constant(0.0, tf.float64), x,
                                      cell.__call__)
  return float(final), tape.gradient(final, cell.w)


@pytest.mark.parametrize("change", ["variable", "python_global", "flag"])
def test_eager_call_after_a_change_computes_what_the_cell_computes_now(
    change):
  """Issue 14 #2: an eager call must not reuse a trace of an older cell."""
  global SCALE
  x = tf.constant([1.0, 2.0, 3.0], tf.float64)
  cell = ScaledCell(1.0)
  assert eager_final_and_grad(cell, x)[0] == 6.0
  try:
    if change == "variable":
      cell.w = tf.Variable(2.0, dtype=tf.float64)
    elif change == "python_global":
      SCALE = 2.0
    else:
      cell.training = True
    final, grad = eager_final_and_grad(cell, x)
    want_final, want_grad = 12.0, (6.0 if change == "variable" else 12.0)
  finally:
    SCALE = 1.0
  assert final == want_final
  assert grad is not None and float(grad) == want_grad
  # And back: the first computation again.
  cell = ScaledCell(1.0)
  assert eager_final_and_grad(cell, x) == (6.0, 6.0)


def test_integer_leaves_are_carried_without_gradients(mode):

  def cell(theta, state, x):
    h = state["h"] * theta + x["x"] + tf.cast(x["id"], x["x"].dtype)
    return {"h": h, "count": state["count"] + 1}, []

  def run(theta, h0, x):
    with tf.GradientTape() as tape:
      tape.watch([theta, h0, x])
      acc, final = tf_recurrent.recurrent(
          theta, {"h": h0, "count": tf.constant(0)},
          {"x": x, "id": tf.range(4)}, cell)
      loss = tf.reduce_sum(acc["h"])
    return acc["count"], final["count"], tape.gradient(loss, [theta, h0, x])

  count, final_count, grads = in_mode(mode, run)(
      tf.constant(0.5, tf.float64), tf.constant([1.0, 2.0], tf.float64),
      tf.ones([4, 2], tf.float64))
  np.testing.assert_array_equal(count, [1, 2, 3, 4])
  assert int(final_count) == 4
  with tf.GradientTape() as tape:
    theta, h0, x = (tf.constant(0.5, tf.float64),
                    tf.constant([1.0, 2.0], tf.float64),
                    tf.ones([4, 2], tf.float64))
    tape.watch([theta, h0, x])
    acc, _ = static_unroll(theta, {"h": h0, "count": tf.constant(0)},
                           {"x": x, "id": tf.range(4)}, cell)
    loss = tf.reduce_sum(acc["h"])
  assert_all_close(grads, tape.gradient(loss, [theta, h0, x]), tol=1e-12)


def test_integer_inputs_and_theta_get_no_gradient():

  def cell(theta, state, inputs):
    scale = tf.cast(theta["k"], tf.float32)
    return state * theta["w"] + scale * tf.cast(inputs["id"], tf.float32) + inputs["x"], []

  theta = {"w": tf.constant(0.5), "k": tf.constant(2)}
  inputs = {"x": tf.ones([3]), "id": tf.range(3)}
  with tf.GradientTape() as tape:
    tape.watch([theta["w"], inputs["x"]])
    acc, _ = tf_recurrent.recurrent(theta, tf.constant(0.0), inputs, cell)
    loss = tf.reduce_sum(acc)
  dw, dx = tape.gradient(loss, [theta["w"], inputs["x"]])
  ref_w = tf.constant(0.5)
  with tf.GradientTape() as tape:
    tape.watch([ref_w, inputs["x"]])
    acc_ref, _ = static_unroll({"w": ref_w, "k": theta["k"]}, tf.constant(0.0),
                               inputs, cell)
    loss_ref = tf.reduce_sum(acc_ref)
  want = tape.gradient(loss_ref, [ref_w, inputs["x"]])
  assert_all_close([dw, dx], want)


@pytest.mark.parametrize("where", ["theta", "closure"])
@pytest.mark.parametrize("mode_", ["eager", "function"])
def test_variables_get_gradients(where, mode_):
  w = tf.Variable([[0.3, -0.2], [0.1, 0.4]], dtype=tf.float64)

  def cell(theta, state, x):
    weight = theta["w"] if where == "theta" else w
    return tf.tanh(tf.matmul(state, weight) + x), []

  theta = {"w": w} if where == "theta" else {}
  x = tf.constant(np.random.default_rng(0).normal(size=[5, 1, 2]))
  h0 = tf.ones([1, 2], tf.float64)

  def run():
    with tf.GradientTape() as tape:
      acc, final = tf_recurrent.recurrent(theta, h0, x, cell)
      loss = tf.reduce_sum(acc * acc) + tf.reduce_sum(final)
    return tape.gradient(loss, w)

  got = in_mode(mode_, run)()
  with tf.GradientTape() as tape:
    acc, final = static_unroll(theta, h0, x, cell)
    loss = tf.reduce_sum(acc * acc) + tf.reduce_sum(final)
  want = tape.gradient(loss, w)
  assert got is not None
  np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.parametrize("mode_", ["eager", "function"])
def test_closed_over_tensor_gets_its_gradient(mode_):
  x = tf.constant(np.random.default_rng(1).normal(size=[4, 2]))

  def run(scale):
    def cell(theta, state, x_t):
      return state * scale + x_t, []
    with tf.GradientTape() as tape:
      tape.watch(scale)
      acc, _ = tf_recurrent.recurrent({}, tf.ones([2], tf.float64), x, cell)
      loss = tf.reduce_sum(acc * acc)
    return tape.gradient(loss, scale)

  scale = tf.constant(0.7, tf.float64)
  got = in_mode(mode_, run)(scale)
  with tf.GradientTape() as tape:
    tape.watch(scale)
    acc, _ = static_unroll({}, tf.ones([2], tf.float64), x,
                           lambda t, s, x_t: (s * scale + x_t, []))
    loss = tf.reduce_sum(acc * acc)
  np.testing.assert_allclose(got, tape.gradient(loss, scale), rtol=1e-9)


def test_eager_closure_rebinding_is_not_stale():
  x = tf.ones([3, 2])
  for scale in (1.0, 2.0, 3.0):
    s = tf.constant(scale)
    _, final = tf_recurrent.recurrent(
        {}, tf.zeros([2]), x, lambda t, st, xt: (st * s + xt, []))
    np.testing.assert_allclose(final, [1 + scale + scale**2] * 2)


def test_recurrent_alias_is_the_same_callable():
  assert tf_recurrent.Recurrent is tf_recurrent.recurrent


def test_inside_mirrored_strategy_matches_single_device():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
  strategy = tf.distribute.MirroredStrategy(devices)
  theta, state0, inputs = elman_args(4, dtype=tf.float32)
  with strategy.scope():
    w = tf.Variable(theta["w"])

  def step():
    with tf.GradientTape() as tape:
      acc, _ = tf_recurrent.recurrent(
          {"w": w, "u": theta["u"], "b": theta["b"]}, state0, inputs,
          elman_cell)
      loss = tf.reduce_sum(acc["h"])
    return tape.gradient(loss, w)

  per_replica = strategy.run(tf.function(step))
  grads = strategy.experimental_local_results(per_replica)
  want = step()
  assert len(grads) == len(devices)
  for g in grads:
    np.testing.assert_allclose(g, want, rtol=1e-5)


def test_no_intermediates_are_kept_for_the_backward_pass():
  """The forward graph outputs states only: no per-step activation stacks."""
  theta, state0, inputs = elman_args(5, dtype=tf.float32)

  @tf.function
  def run(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      acc, _ = tf_recurrent.recurrent(theta, state0, x, elman_cell)
      loss = tf.reduce_sum(acc["h"])
    return tape.gradient(loss, x)

  graph = run.get_concrete_function(inputs).graph
  whiles = [op for op in graph.get_operations() if op.type in
            ("While", "StatelessWhile")]
  assert len(whiles) == 2  # one forward, one reverse loop
  forward = min(whiles, key=lambda op: op.name)
  # The forward loop carries counter, state and one accumulator per state
  # leaf, plus the inputs and theta it reads; autodiff of a while loop would
  # add an accumulator per intermediate.
  list_outputs = [t for t in forward.outputs if t.dtype == tf.variant]
  assert len(list_outputs) == 1


@pytest.mark.parametrize("jit", [False, True])
def test_extras_with_unknown_batch_and_length(jit):
  """A custom cell_grad's extras accumulate with shapes known only at run
  time, down to zero steps."""
  theta, _, _ = elman_args(1)
  spec = tf.TensorSpec([None, None, 4], tf.float64)

  @tf.function(input_signature=[spec], jit_compile=jit)
  def run(x):
    state0 = {"h": tf.zeros([tf.shape(x)[1], 5], tf.float64)}
    with tf.GradientTape() as tape:
      tape.watch(x)
      acc, final = tf_recurrent.recurrent(theta, state0, x, elman_cell,
                                          elman_grad)
      loss = tf.reduce_sum(acc["h"] ** 2) + tf.reduce_sum(final["h"])
    return acc["h"], tape.gradient(loss, x)

  shapes = [(4, 2), (7, 3)] if jit else [(4, 2), (7, 3), (0, 2)]
  for seq_len, batch in shapes:
    x = tf.constant(np.random.default_rng(seq_len).normal(
        size=[seq_len, batch, 4]))
    acc, dx = run(x)
    state0 = {"h": tf.zeros([batch, 5], tf.float64)}
    with tf.GradientTape() as tape:
      tape.watch(x)
      want_acc, want_final = static_unroll(theta, state0, x, elman_cell)
      loss = tf.reduce_sum(want_acc["h"] ** 2) + tf.reduce_sum(want_final["h"])
    np.testing.assert_allclose(acc, want_acc["h"], atol=1e-10)
    want_dx = tape.gradient(loss, x)
    np.testing.assert_allclose(dx, np.zeros_like(x) if want_dx is None
                               else want_dx, atol=1e-10)


def test_autograph_converts_the_cell_like_the_caller():
  """Under a default tf.function, a cell's tensor-valued `if` works; the
  op's own code is never converted."""

  def cell(theta, state, x):
    del theta
    if tf.reduce_sum(x) > 0:
      new = state + x
    else:
      new = state - x
    return new, []

  @tf.function
  def run(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      acc, _ = tf_recurrent.recurrent((), tf.zeros([2]), x, cell,
                                      accumulate_state=True)
      loss = tf.reduce_sum(acc)
    return acc, tape.gradient(loss, x)

  acc, dx = run(tf.constant([[1.0, 1.0], [-1.0, -1.0], [2.0, 2.0]]))
  np.testing.assert_allclose(acc, [[1, 1], [2, 2], [4, 4]])
  np.testing.assert_allclose(dx, [[3, 3], [-2, -2], [1, 1]])


# A custom cell_grad is handed values of its step only.


def scaled_sum_cell(theta, state, inputs):
  """v1 = v0 + x * t: d v_T / d x = sum(t), d v_T / d t_i = x."""
  return {"v": state["v"] + theta["x"] * inputs["t"]}, []


ENTRIES = {
    "recurrent": tf_recurrent.recurrent,
    "Recurrent": tf_recurrent.Recurrent,
    # Lingvo's cell_grad returns a fourth value, dcaptured.
    "lingvo": lambda theta, state0, inputs, cell_fn, cell_grad: (
        tf_recurrent.lingvo.Recurrent(
            theta, state0, inputs, cell_fn,
            lambda *args: tuple(cell_grad(*args)) + (None,))),
}


# Modes x entries x how the cell_grad differentiates: all pairs (the whole
# product with --full).
@pytest.mark.parametrize("mode,entry,how", pairwise(
    GRAPH_MODES, list(ENTRIES), ["gradients", "gradients_in_function", "tape"]))
def test_cell_grad_sees_only_its_step(mode, entry, how):
  """A cell_grad differentiating its recomputed step gets partial
  derivatives: tf.gradients on arguments still wired to the forward loop
  returned d v_T / d x = 10 here (through every earlier step), not 6."""
  cell_grad = recomputing_cell_grad(scaled_sum_cell, how)

  def build(watch):
    x, t = tf.constant(1.0, tf.float64), tf.constant([1.0, 2.0, 3.0],
                                                     tf.float64)
    watch([x, t])
    acc, final = ENTRIES[entry]({"x": x}, {"v": tf.constant(0.0, tf.float64)},
                                {"t": t}, scaled_sum_cell, cell_grad)
    loss = final["v"] + 0.5 * tf.reduce_sum(acc["v"])
    return final, loss, [x, t]

  values, (dx, dt) = values_and_grads(mode, build)
  assert float(values[0]) == 6.0
  # loss = v_3 + (v_1 + v_2 + v_3) / 2, v_i = x * (t_1 + ... + t_i).
  assert float(dx) == 6.0 + 0.5 * (1.0 + 3.0 + 6.0)
  np.testing.assert_array_equal(dt, [2.5, 2.0, 1.5])


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("seq_len", [0, 1, 3])
def test_max_input_length_tensor_for_every_length(mode, seq_len):
  """A max_input_length known only at run time, T=0 and T=1 included."""
  limit = min(seq_len, 2)

  def build(watch):
    if mode == "tf1":
      max_len = tf.compat.v1.placeholder(tf.int32, [])
      feed = {max_len: limit}
    else:  # A value no constant folding sees through.
      max_len = tf.reduce_max(tf.fill([1], limit))
      feed = None
    x = tf.constant(np.arange(1.0, seq_len + 1.0))
    watch(x)
    acc, final = tf_recurrent.recurrent(
        (), tf.constant(0.0, tf.float64), x, lambda _, s, x_t: (s + x_t, []),
        max_input_length=max_len)
    loss = final + tf.reduce_sum(acc)
    return (acc, final), loss, [x], feed

  (acc, final), (dx,) = values_and_grads(mode, build)
  want = np.cumsum(np.arange(1.0, limit + 1.0))
  np.testing.assert_array_equal(acc, np.pad(want, [0, seq_len - limit]))
  assert float(final) == (want[-1] if limit else 0.0)
  # d/dx_i of final + sum(acc), for the steps that ran.
  np.testing.assert_array_equal(
      dx, [1.0 + limit - i if i < limit else 0.0 for i in range(seq_len)])


# Graph modes only: an eager TensorArray is a Python list, indexed by a
# Python int, so no traced step can read it.
@pytest.mark.parametrize("mode", ["function", "xla", "tf1"])
def test_tensor_array_read_in_the_cell_gets_its_gradient(mode):
  """raw_rnn's inputs: a TensorArray unstacked outside, read per step. Its
  gradient was silently None (variant captures were not differentiated)."""

  def build(watch):
    x = tf.constant([1.0, 2.0, 3.0], tf.float64)
    theta = tf.constant(2.0, tf.float64)
    watch([x, theta])
    steps = tf.TensorArray(tf.float64, size=3).unstack(x)

    def cell(theta, state, t):
      return state * theta + steps.read(t), []

    acc, final = tf_recurrent.recurrent(theta, tf.constant(0.0, tf.float64),
                                        tf.range(3), cell)
    return (acc, final), final + tf.reduce_sum(acc), [x, theta]

  (acc, final), (dx, dtheta) = values_and_grads(mode, build)
  # v1 = x1, v2 = 2 x1 + x2, v3 = 4 x1 + 2 x2 + x3 (theta = 2).
  np.testing.assert_array_equal(acc, [1.0, 4.0, 11.0])
  np.testing.assert_array_equal(dx, [4 + 2 + 1 + 4, 2 + 1 + 2, 1 + 1])
  # d/dtheta of v3 + v1 + v2 + v3 at theta = 2: v2' = x1, v3' = 4 x1 + x2.
  assert float(dtheta) == 2 * (4 * 1.0 + 2.0) + 1.0


@pytest.mark.parametrize("outer", ["eager", "function"])
@pytest.mark.parametrize("read", ["closure", "closure_in_cond", "theta_in_cond"])
def test_persistent_tape_around_the_call(outer, read):
  """A persistent tape recording the op's call (eagerly, or of a tf.function
  around it) got zero gradients for tensors a tf.cond in the step closes
  over: with two tapes watching, TensorFlow wraps the recomputed cond in a
  function whose tape gradient drops its captured inputs."""
  rng = np.random.default_rng(4)
  x = tf.constant(rng.normal(size=[5, 3, 2]))
  w = tf.constant(1.5, tf.float64)

  def run(x, w):
    def cell(theta, state, t):
      theta_x, theta_w = (theta if read == "theta_in_cond" else (x, w))
      def read_step():
        return tf.gather(theta_x, t) * theta_w
      step = (read_step() if read == "closure" else
              tf.cond(t > 10, lambda: tf.zeros([3, 2], tf.float64), read_step))
      return tf.tanh(state + step), []
    _, final = tf_recurrent.recurrent((x, w), tf.zeros([3, 2], tf.float64),
                                      tf.range(5), cell)
    return tf.reduce_sum(tf.sin(final))

  with tf.GradientTape(persistent=True) as tape:
    tape.watch([x, w])
    loss = (run if outer == "eager" else tf.function(run))(x, w)
  got = tape.gradient(loss, [x, w])
  with tf.GradientTape() as tape:
    tape.watch([x, w])
    state = tf.zeros([3, 2], tf.float64)
    for t in range(5):
      state = tf.tanh(state + x[t] * w)
    want = tape.gradient(tf.reduce_sum(tf.sin(state)), [x, w])
  assert_all_close(got, want, tol=1e-12)


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_second_order_gradient_fails_instead_of_a_wrong_number(mode):
  """A gradient of the op's gradient (a Hessian-vector product) came out
  wrong without a word (-10.49 where a static unroll gives -5.05: the
  reverse loop cuts each step's inputs from the graph). It now fails when
  run, naming the cause (NaN under XLA, which drops assertions); the first
  order under a tape inside another stays the unroll's."""
  x_value = np.random.default_rng(9).normal(size=[5, 2, 3])

  def loss(x, w):
    acc, _ = tf_recurrent.recurrent(
        w, tf.zeros([2, 3], tf.float64), x,
        lambda theta, state, step: (tf.tanh(state * theta + step), []))
    return tf.reduce_sum(acc * acc)

  if mode == "tf1":
    with tf.Graph().as_default():
      x, w = tf.constant(x_value), tf.constant(0.5, tf.float64)
      (dx,) = tf.gradients(loss(x, w), [x])
      (ddx,) = tf.gradients(tf.reduce_sum(dx * tf.sin(x)), [x])
      with tf.compat.v1.Session() as session:
        session.run(dx)  # The first order runs.
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="second-order"):
          session.run(ddx)
    return
  x, w = tf.constant(x_value), tf.constant(0.5, tf.float64)
  with tf.GradientTape() as tape:
    tape.watch(x)
    state, total = tf.zeros([2, 3], tf.float64), 0.0
    for t in range(5):
      state = tf.tanh(state * w + x[t])
      total += tf.reduce_sum(state * state)
  want = tape.gradient(total, x)
  with tf.GradientTape() as outer:
    outer.watch(x)
    with tf.GradientTape() as tape:
      tape.watch(x)
      value = in_mode(mode, loss)(x, w)
    got = tape.gradient(value, x)
    second = tf.reduce_sum(got * tf.sin(x))
  assert_all_close(got, want, tol=1e-10)
  if mode == "xla":  # XLA drops the assertion: NaN, no finite wrong number.
    assert np.isnan(outer.gradient(second, x)).all()
    return
  with pytest.raises(tf.errors.InvalidArgumentError, match="second-order"):
    outer.gradient(second, x)
