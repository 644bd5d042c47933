"""The op's loop options against the static unroll, values and gradients:
sequence_length, checkpoint_every / accumulate_state, stop_fn, time_major,
and reduced-precision states."""

import functools

import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent import cells
from conftest import (GRAPH_MODES, MODES, assert_all_close,
                      assert_numerical_gradients, elman_args, elman_cell,
                      elman_grad, in_mode, loss_weights, pairwise,
                      recomputing_cell_grad, static_unroll, values_and_grads,
                      weighted_sum)

SEQ_LEN = 6
GRADS = {"autodiff": None, "hand_written": elman_grad}


def loss_and_grads(run_op, theta, state0, inputs, weights):
  """Loss over acc (when returned) and final state, and its gradients."""
  with tf.GradientTape() as tape:
    tape.watch([theta, state0, inputs])
    acc, final = run_op(theta, state0, inputs)
    loss = weighted_sum(final, weights[1])
    if acc is not None:
      loss += weighted_sum(acc, weights[0])
  return acc, final, tape.gradient(loss, [theta, state0, inputs])


def check_against_unroll(mode, op_kwargs, ref_kwargs, seq_len=SEQ_LEN,
                         grad=None, tol=1e-9):
  theta, state0, inputs = elman_args(seq_len)
  weights = (loss_weights({"h": tf.zeros([seq_len, 3, 5])}, 1),
             loss_weights(state0, 2))

  def op(t, s, x):
    return tf_recurrent.recurrent(t, s, x, elman_cell, cell_grad=grad,
                                  **op_kwargs)

  def ref(t, s, x):
    acc, final = static_unroll(t, s, x, elman_cell, **ref_kwargs)
    return (acc if op_kwargs.get("accumulate_state", True) else None), final

  got = in_mode(mode, lambda *a: loss_and_grads(op, *a, weights))(
      theta, state0, inputs)
  want = loss_and_grads(ref, theta, state0, inputs, weights)
  assert_all_close(got, want, tol=tol)
  return got


def case_id(value):
  """A test id for a tuple-valued option: its items joined by "-"."""
  if isinstance(value, tuple):
    return "-".join(map(str, value))
  return None


# Modes x gradients x options: all pairs (the whole product with --full).
@pytest.mark.parametrize("mode,grad,lengths", pairwise(
    MODES, list(GRADS), [(3, 0, 6), (2, 4, 1)]), ids=case_id)
def test_sequence_length(mode, grad, lengths):
  acc, _, (_, _, dinputs) = check_against_unroll(
      mode, {"sequence_length": tf.constant(lengths)},
      {"sequence_length": lengths}, grad=GRADS[grad])
  acc, dinputs = np.asarray(acc["h"]), np.asarray(dinputs)
  for b, n in enumerate(lengths):
    assert np.all(acc[n:, b] == 0) and np.all(dinputs[n:, b] == 0)
    assert np.all(acc[:n, b] != 0)


@pytest.mark.parametrize("mode,grad,every_accumulate", pairwise(
    MODES, list(GRADS),
    [(1, False), (2, False), (4, False), ("sqrt", False), (2, True)]),
    ids=case_id)
def test_checkpoint_every_matches_unroll(mode, grad, every_accumulate):
  every, accumulate = every_accumulate
  check_against_unroll(
      mode, {"checkpoint_every": every, "accumulate_state": accumulate},
      {}, seq_len=7, grad=GRADS[grad])


@pytest.mark.parametrize("grad", GRADS)
def test_checkpoints_with_lengths_max_length_and_stop(mode, grad):
  def stop(t, theta, state):
    del theta, state
    return t >= 5

  check_against_unroll(
      mode, {"checkpoint_every": 2, "accumulate_state": False,
             "sequence_length": [4, 1, 6], "max_input_length": 6,
             "stop_fn": stop},
      {"sequence_length": [4, 1, 6], "num_steps": 6, "stop_fn": stop},
      seq_len=7, grad=GRADS[grad])


@pytest.mark.parametrize("grad", GRADS)
def test_stop_fn_on_the_state(mode, grad):
  def stop(t, theta, state):
    del t, theta
    return tf.reduce_mean(state["h"]) > 0.0

  acc, _, _ = check_against_unroll(mode, {"stop_fn": stop}, {"stop_fn": stop},
                                   grad=GRADS[grad])
  ran = np.any(np.asarray(acc["h"]) != 0, axis=(1, 2))
  # The elman_args draw stops part way: some steps ran, the rest are zeros.
  assert 0 < ran.sum() < SEQ_LEN
  assert np.all(ran[:ran.sum()])


def test_stop_before_the_first_step(mode):
  acc, final, (dtheta, dstate0, dinputs) = check_against_unroll(
      mode, {"stop_fn": lambda t, th, s: tf.constant(True)},
      {"stop_fn": lambda t, th, s: tf.constant(True)})
  assert np.all(np.asarray(acc["h"]) == 0)
  assert np.all(np.asarray(dinputs) == 0)


def test_batch_major(mode):
  theta, state0, inputs = elman_args(SEQ_LEN)
  batch_major = tf.transpose(inputs, [1, 0, 2])

  def run(t, s, x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      acc, final = tf_recurrent.recurrent(t, s, x, elman_cell,
                                          time_major=False,
                                          sequence_length=[6, 2, 4])
      loss = tf.reduce_sum(tf.sin(acc["h"])) + tf.reduce_sum(final["h"])
    return acc, final, tape.gradient(loss, x)

  def ref(t, s, x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      acc, final = static_unroll(t, s, x, elman_cell,
                                 sequence_length=[6, 2, 4])
      loss = tf.reduce_sum(tf.sin(acc["h"])) + tf.reduce_sum(final["h"])
    return acc, final, tape.gradient(loss, x)

  acc, final, dx = in_mode(mode, run)(theta, state0, batch_major)
  want_acc, want_final, want_dx = ref(theta, state0, inputs)
  assert acc["h"].shape == [3, SEQ_LEN, 5]
  assert_all_close((tf.transpose(acc["h"], [1, 0, 2]), final,
                    tf.transpose(dx, [1, 0, 2])),
                   (want_acc["h"], want_final, want_dx), tol=1e-9)


def test_numerical_gradients_with_lengths_and_checkpoints():
  theta, state0, inputs = elman_args(5, batch=2, dim_in=2, dim_h=3)

  def loss(w, h0, x):
    _, final = tf_recurrent.recurrent(
        {"w": w, "u": theta["u"], "b": theta["b"]}, {"h": h0}, x, elman_cell,
        sequence_length=[3, 5], checkpoint_every=2, accumulate_state=False)
    return tf.reduce_sum(tf.sin(final["h"]))

  assert_numerical_gradients(loss, [theta["w"], state0["h"], inputs])


def test_sqrt_segments_run_in_one_extra_forward_pass():
  """Counting cell calls at run time: forward T, recompute T, backward T."""
  theta, state0, inputs = elman_args(16)
  calls = tf.Variable(0, trainable=False)

  def cell(theta, state, x):
    with tf.control_dependencies([calls.assign_add(1)]):
      return elman_cell(theta, {"h": tf.identity(state["h"])}, x)

  # The variable write is why a custom gradient is passed here.
  with tf.GradientTape() as tape:
    tape.watch(inputs)
    _, final = tf_recurrent.recurrent(theta, state0, inputs, cell, elman_grad,
                                      checkpoint_every="sqrt",
                                      accumulate_state=False)
  after_forward = int(calls.numpy())
  tape.gradient(final["h"], inputs)
  assert after_forward == 16
  # Each segment of 4 is recomputed once; the hand-written gradient then
  # reads the recomputed extras, so no further calls.
  assert int(calls.numpy()) == 32


def reduced_precision_run(mode, dtype):
  """The Elman loop whose float32 weights are cast to `dtype` in each step,
  on states and inputs of `dtype`: (acc, final, gradients)."""
  theta, state0, inputs = elman_args(SEQ_LEN, dtype=tf.float32)

  def cast_cell(theta, state, x):
    # The mixed-precision pattern: float32 weights, computed in `dtype`.
    theta = tf.nest.map_structure(lambda w: tf.cast(w, x.dtype), theta)
    return elman_cell(theta, state, x)

  def run(s, x):
    with tf.GradientTape() as tape:
      tape.watch([theta, s, x])
      acc, final = tf_recurrent.recurrent(theta, s, x, cast_cell,
                                          sequence_length=[6, 3, 5])
      loss = tf.reduce_sum(tf.cast(acc["h"], tf.float32) ** 2)
    return acc, final, tape.gradient(loss, [theta, s, x])

  return in_mode(mode, run)(
      tf.nest.map_structure(lambda v: tf.cast(v, dtype), state0),
      tf.cast(inputs, dtype))


@functools.lru_cache(maxsize=None)
def float32_run(mode):
  """The float32 run of `mode`, shared by the reduced-precision cases."""
  return reduced_precision_run(mode, tf.float32)


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_reduced_precision_states(mode, dtype):
  low = reduced_precision_run(mode, dtype)
  full = float32_run(mode)
  acc, _, (dtheta, dstate0, dinputs) = low
  assert acc["h"].dtype == dtype and dinputs.dtype == dtype
  assert all(g.dtype == tf.float32 for g in tf.nest.flatten(dtheta))
  tol = 0.1 if dtype == tf.bfloat16 else 0.02
  for a, b in zip(tf.nest.flatten(low), tf.nest.flatten(full)):
    np.testing.assert_allclose(np.asarray(tf.cast(a, tf.float32)),
                               np.asarray(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("grad", ["autodiff", "hand_written"])
def test_float32_theta_gradient_accumulates_in_float32(mode, grad):
  """512 per-step contributions of 1.0: a bfloat16 sum would stall at 256."""

  def cell(theta, state, x):
    return {"h": state["h"] * 0 + tf.cast(theta["a"], x.dtype) * x}, []

  def cell_grad(theta, state, x, extras, dstate1):
    da = tf.cast(tf.reduce_sum(dstate1["h"] * x), tf.float32)
    return {"a": da}, {"h": tf.zeros_like(state["h"])}, dstate1["h"] * tf.cast(
        theta["a"], x.dtype)

  def run(theta):
    with tf.GradientTape() as tape:
      tape.watch(theta)
      acc, _ = tf_recurrent.recurrent(
          theta, {"h": tf.zeros([1, 1], tf.bfloat16)},
          tf.ones([512, 1, 1], tf.bfloat16), cell,
          cell_grad if grad == "hand_written" else None)
      loss = tf.reduce_sum(tf.cast(acc["h"], tf.float32))
    return tape.gradient(loss, theta)

  dtheta = in_mode(mode, run)({"a": tf.constant(0.5)})
  assert dtheta["a"].dtype == tf.float32
  assert float(dtheta["a"]) == 512.0


ACCUMULATE_OPTIONS = {
    "plain": ({}, {}),
    "lengths_checkpoints_batch_major": (
        {"sequence_length": [4, 1, 6], "checkpoint_every": 2,
         "time_major": False}, {"sequence_length": [4, 1, 6]}),
}


def accumulate_some_args():
  rng = np.random.default_rng(3)
  batch, units = 3, 4
  theta = {"recurrent_kernel": tf.constant(
      rng.normal(size=[units, 4 * units]) * 0.5)}
  state0 = {"h": tf.constant(rng.normal(size=[batch, units])),
            "c": tf.constant(rng.normal(size=[batch, units]))}
  inputs = tf.constant(rng.normal(size=[SEQ_LEN, batch, 4 * units]))
  weights = ({"h": loss_weights(tf.zeros([SEQ_LEN, batch, units]), 1),
              "c": None}, loss_weights(state0, 2))
  return theta, state0, inputs, weights


@functools.lru_cache(maxsize=None)
def accumulate_some_reference(options):
  """The unroll's values and gradients, shared by the modes and gradients."""
  theta, state0, inputs, weights = accumulate_some_args()
  ref_kwargs = ACCUMULATE_OPTIONS[options][1]

  def ref(t, s, x):
    acc, final = static_unroll(t, s, x, cells.lstm_step, **ref_kwargs)
    return {"h": acc["h"], "c": None}, final

  return loss_and_grads(ref, theta, state0, inputs, weights)


@pytest.mark.parametrize("mode,grad,options", pairwise(
    MODES, list(GRADS), list(ACCUMULATE_OPTIONS)))
def test_accumulate_some_state_leaves(mode, grad, options):
  """Leaves not returned per step are None; gradients are unchanged."""
  op_kwargs = ACCUMULATE_OPTIONS[options][0]
  theta, state0, inputs, weights = accumulate_some_args()
  cell_grad = cells.lstm_grad if grad == "hand_written" else None
  batch_major = not op_kwargs.get("time_major", True)

  def op(t, s, x):
    if batch_major:
      x = tf.transpose(x, [1, 0, 2])
    acc, final = tf_recurrent.recurrent(
        t, s, x, cells.lstm_step, cell_grad,
        accumulate_state={"h": True, "c": False}, **op_kwargs)
    assert acc["c"] is None
    if batch_major:
      acc = {"h": tf.transpose(acc["h"], [1, 0, 2]), "c": None}
    return acc, final

  got = in_mode(mode, lambda *a: loss_and_grads(op, *a, weights))(
      theta, state0, inputs)
  assert_all_close(got, accumulate_some_reference(options), tol=1e-9)


@pytest.mark.parametrize("seq_len", [1, 4])
def test_accumulate_no_state_leaf(seq_len):
  """A structure of all False returns a structure of Nones (one step or
  many), not None."""
  theta, state0, inputs = elman_args(seq_len)
  acc, final = tf_recurrent.recurrent(theta, state0, inputs, elman_cell,
                                      accumulate_state={"h": False})
  _, want = static_unroll(theta, state0, inputs, elman_cell)
  assert acc == {"h": None}
  assert_all_close(final, want, tol=1e-12)


# Every checkpoint segment length, in every mode (TF1 graphs included), with
# the default gradient and custom ones, against the float64 unroll.

CHECKPOINT_STEPS = 5
CHECKPOINT_EVERY = (1, 2, 3, "sqrt", CHECKPOINT_STEPS - 1, CHECKPOINT_STEPS,
                    CHECKPOINT_STEPS + 3)


def table_cell(theta, state, x):
  """Reads a theta table at the step's integer ids (an IndexedSlices grad)."""
  h = tf.tanh(tf.gather(theta["table"], x["ids"]) +
              tf.matmul(state["h"], theta["u"]))
  return {"h": h}, {"h": h}


def table_grad(theta, state, x, extras, dstate1):
  dpre = dstate1["h"] * (1 - tf.square(extras["h"]))
  dtable = tf.tensor_scatter_nd_add(tf.zeros_like(theta["table"]),
                                    x["ids"][:, None], dpre)
  return ({"table": dtable,
           "u": tf.matmul(state["h"], dpre, transpose_a=True)},
          {"h": tf.matmul(dpre, theta["u"], transpose_b=True)},
          {"ids": None})


def table_args():
  rng = np.random.default_rng(7)
  theta = {"table": tf.constant(rng.normal(size=[6, 4])),
           "u": tf.constant(rng.normal(size=[4, 4]) * 0.5)}
  state0 = {"h": tf.constant(rng.normal(size=[2, 4]))}
  inputs = {"ids": tf.constant(rng.integers(0, 6, size=[CHECKPOINT_STEPS, 2]),
                               tf.int32)}
  return theta, state0, inputs


CHECKPOINT_CELLS = {
    "elman": (elman_cell, elman_grad, lambda: elman_args(CHECKPOINT_STEPS)),
    "table": (table_cell, table_grad, table_args),
}


def checkpoint_grads(cell, grad):
  cell_fn, hand_written, _ = CHECKPOINT_CELLS[cell]
  if grad == "autodiff":
    return None
  if grad == "hand_written":
    return hand_written
  return recomputing_cell_grad(cell_fn, grad)


def differentiable(structure):
  return [x for x in tf.nest.flatten(structure) if x.dtype.is_floating]


LOSS_ON = ("final", "rows", "both")


def checkpoint_case_allowed(mode, grad, cell, every, loss_on):
  """Segments are kept only when the rows are not returned (a loss on the
  final state); with rows returned, checkpointing recomputes a custom
  cell_grad's extras, the same for any segment length: those run for two
  lengths only."""
  del mode, grad, cell
  return loss_on == "final" or every in (2, CHECKPOINT_STEPS)


def grouped_checkpoint_cases():
  """The matrix mode x grad x cell x segment length x loss, as one test per
  (mode, grad, cell) running its (length, loss) cases in one graph."""
  groups = {}
  for mode, grad, cell, every, loss_on in pairwise(
      GRAPH_MODES, ["autodiff", "hand_written", "gradients"],
      list(CHECKPOINT_CELLS), CHECKPOINT_EVERY, LOSS_ON,
      where=checkpoint_case_allowed):
    groups.setdefault((mode, grad, cell), []).append((every, loss_on))
  return [pytest.param(mode, grad, cell, tuple(cases),
                       id=f"{cell}-{grad}-{mode}")
          for (mode, grad, cell), cases in groups.items()]


def checkpoint_loss_weights(cell):
  # As numpy arrays: a TF1 graph cannot capture eager tensors.
  args = CHECKPOINT_CELLS[cell][2]()
  return tf.nest.map_structure(
      lambda w: w.numpy(),
      (loss_weights({"h": tf.zeros([CHECKPOINT_STEPS, 2, 4])}, 1),
       loss_weights(args[1], 2)))


def checkpoint_loss(weights, acc, final, loss_on):
  loss = 0.0
  if loss_on != "rows":
    loss += weighted_sum(final, weights[1])
  if loss_on != "final":
    loss += weighted_sum({"h": acc["h"][:, :2, :4]}, weights[0])
  return loss


@functools.lru_cache(maxsize=None)
def checkpoint_reference(cell, loss_on):
  """The unroll's final state and gradients, shared by every mode, gradient
  and segment length."""
  cell_fn, _, make_args = CHECKPOINT_CELLS[cell]
  args = make_args()
  with tf.GradientTape() as tape:
    sources = differentiable(args)
    tape.watch(sources)
    acc, final = static_unroll(*args, cell_fn)
    loss = checkpoint_loss(checkpoint_loss_weights(cell), acc, final, loss_on)
  want = tape.gradient(loss, sources,
                       unconnected_gradients=tf.UnconnectedGradients.ZERO)
  return ([x.shape for x in sources], want, final["h"])


@pytest.mark.parametrize("mode,grad,cell,cases", grouped_checkpoint_cases())
def test_every_checkpoint_length_matches_unroll(mode, grad, cell, cases):
  """Losses on the final state, the rows and both, for each segment length
  (one graph per (mode, grad, cell), each op call with sources of its own)."""
  cell_fn, _, make_args = CHECKPOINT_CELLS[cell]
  args = make_args()
  cell_grad = checkpoint_grads(cell, grad)
  weights = checkpoint_loss_weights(cell)

  def build(watch):
    sources, values, loss = [], [], 0.0
    for every, loss_on in cases:
      copies = tf.nest.map_structure(lambda x: tf.constant(x.numpy()), args)
      watch(differentiable(copies))
      acc, final = tf_recurrent.recurrent(
          *copies, cell_fn, cell_grad, checkpoint_every=every,
          accumulate_state=loss_on != "final")
      loss += checkpoint_loss(weights, acc, final, loss_on)
      sources += differentiable(copies)
      values.append(final)
    return values, loss, sources

  got_values, got_grads = values_and_grads(mode, build)
  for i, (every, loss_on) in enumerate(cases):
    shapes, want, want_final = checkpoint_reference(cell, loss_on)
    n = len(shapes)
    got = got_grads[i * n:(i + 1) * n]
    for g, w, shape in zip(got, want, shapes):
      np.testing.assert_allclose(
          np.asarray(tf.convert_to_tensor(g)), np.asarray(
              tf.convert_to_tensor(w)), rtol=1e-9, atol=1e-9,
          err_msg=f"checkpoint_every={every}, loss on {loss_on}, source {shape}")
    np.testing.assert_allclose(np.asarray(got_values[i]),
                               np.asarray(want_final), rtol=1e-12)


def normalizing_cell(theta, state, x):
  """h / |h| is NaN at h = 0: reading a finished example's zeroed row as the
  state entering a later step would poison its gradients (0 * NaN)."""
  h = state["h"]
  return {"h": theta["a"] * h / tf.norm(h, axis=-1, keepdims=True) + x}, []


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("grad", ["autodiff", "gradients"])
def test_finished_examples_reenter_from_their_final_state(mode, grad):
  rng = np.random.default_rng(5)
  lengths = [2, 5, 0]
  theta = {"a": rng.normal(size=[3])}
  state0 = {"h": rng.normal(size=[3, 3])}
  inputs = rng.normal(size=[5, 3, 3])
  cell_grad = (None if grad == "autodiff" else
               recomputing_cell_grad(normalizing_cell, grad))

  def build(watch):
    args = tf.nest.map_structure(tf.constant, (theta, state0, inputs))
    watch(tf.nest.flatten(args))
    acc, final = tf_recurrent.recurrent(*args, normalizing_cell, cell_grad,
                                        sequence_length=lengths)
    loss = tf.reduce_sum(tf.sin(acc["h"])) + tf.reduce_sum(final["h"])
    return (acc, final), loss, tf.nest.flatten(args)

  got_values, got_grads = values_and_grads(mode, build)
  args = tf.nest.map_structure(tf.constant, (theta, state0, inputs))
  with tf.GradientTape() as tape:
    tape.watch(tf.nest.flatten(args))
    acc, final = static_unroll(*args, normalizing_cell,
                               sequence_length=lengths)
    loss = tf.reduce_sum(tf.sin(acc["h"])) + tf.reduce_sum(final["h"])
  want_grads = tape.gradient(loss, tf.nest.flatten(args))
  assert all(np.all(np.isfinite(g)) for g in got_grads)
  assert_all_close((got_values, got_grads),
                   (tf.nest.flatten((acc, final)), want_grads), tol=1e-9)
