"""The built-in LSTM/GRU steps and their hand-written gradients vs autodiff."""

import functools

import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent import cells
from conftest import MODES, assert_all_close, in_mode, pairwise, static_unroll

B, D, H, T = 3, 4, 5, 6


def lstm_case(rng):
  theta = {"recurrent_kernel": tf.constant(rng.normal(size=[H, 4 * H]) * 0.5)}
  state0 = {"h": tf.constant(rng.normal(size=[B, H])),
            "c": tf.constant(rng.normal(size=[B, H]))}
  return cells.lstm_step, cells.lstm_grad, theta, state0, 4 * H


def gru_case(rng):
  theta = {"recurrent_kernel": tf.constant(rng.normal(size=[H, 3 * H]) * 0.5),
           "recurrent_bias": tf.constant(rng.normal(size=[3 * H]))}
  state0 = {"h": tf.constant(rng.normal(size=[B, H]))}
  return cells.gru_step, cells.gru_grad, theta, state0, 3 * H


def cast_case(precision, theta, state0, x, kernel, bias):
  """float64 everywhere, or float32 weights with bfloat16 states/inputs."""
  if precision == "float64":
    return theta, state0, x, kernel, bias
  weights = tf.nest.map_structure(lambda w: tf.cast(w, tf.float32),
                                  (theta, kernel, bias))
  low = tf.nest.map_structure(lambda v: tf.cast(v, tf.bfloat16), (state0, x))
  return weights[0], low[0], low[1], weights[1], weights[2]


def assert_close_to_largest(got, want, tol):
  """Every leaf within `tol` of the largest entry of its reference."""
  for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    assert g.dtype == w.dtype
    g, w = (np.asarray(tf.cast(v, tf.float64)) for v in (g, w))
    np.testing.assert_allclose(g, w, rtol=0, atol=tol * np.abs(w).max())


CASES = {"lstm": lstm_case, "gru": gru_case}


def gradient_case(case, recompute, precision):
  """(grad, args, run_with, loss_and_grads) of a case: `run_with(
  recurrent_fn)` runs the case's loop through `recurrent_fn(theta, state0,
  inputs, step)`, `loss_and_grads(run)(*args)` gives its rows and
  gradients."""
  rng = np.random.default_rng(0)
  steps = T if precision == "float64" else 512
  step, grad, theta, state0, width = CASES[case](rng)
  x = tf.constant(rng.normal(size=[steps, B, D]))
  kernel = tf.constant(rng.normal(size=[D, width]) * 0.5)
  bias = tf.constant(rng.normal(size=[width]))
  loss_dtype = tf.float64 if precision == "float64" else tf.float32
  weights = tf.nest.map_structure(
      lambda s: tf.constant(rng.normal(size=[steps] + s.shape.as_list()),
                            loss_dtype), state0)
  args = cast_case(precision, theta, state0, x, kernel, bias)
  if recompute:
    step, grad = cells.recomputing(step, grad)

  def run_with(recurrent_fn):
    """recurrent_fn(theta, state0, inputs, step) -> (acc, final)."""
    def run(theta, state0, x, kernel, bias):
      if recompute:
        return recurrent_fn({"cell": theta, "kernel": kernel, "bias": bias},
                            state0, x, step)
      return recurrent_fn(theta, state0, cells.project_inputs(
          x, tf.cast(kernel, x.dtype), tf.cast(bias, x.dtype)), step)
    return run

  def loss_and_grads(run):
    def fn(theta, state0, x, kernel, bias):
      with tf.GradientTape() as tape:
        tape.watch([theta, state0, x, kernel, bias])
        acc, final = run(theta, state0, x, kernel, bias)
        loss = sum(tf.reduce_sum(tf.cast(a, loss_dtype) * w) for a, w in zip(
            tf.nest.flatten(acc), tf.nest.flatten(weights)))
        loss += sum(tf.reduce_sum(tf.sin(tf.cast(f, loss_dtype)))
                    for f in tf.nest.flatten(final))
      return acc, tape.gradient(loss, [theta, state0, x, kernel, bias])
    return fn

  return grad, args, run_with, loss_and_grads


@functools.lru_cache(maxsize=None)
def autodiff_reference(case, recompute, precision):
  """The reference, shared by the modes: autodiff of a Python loop over the
  same step, whose per-step casts of the float32 weights make autodiff sum in
  float32."""
  _, args, run_with, loss_and_grads = gradient_case(case, recompute,
                                                    precision)
  return loss_and_grads(run_with(static_unroll))(*args)


# Modes x cells x projection x precision: all pairs (the whole product with
# --full).
@pytest.mark.parametrize("mode,case,recompute,precision", pairwise(
    MODES, list(CASES), [False, True], ["float64", "mixed_bfloat16"]),
                         ids=lambda v: {False: "projected",
                                        True: "recomputing"}.get(v))
def test_hand_written_gradient_matches_autodiff(mode, case, recompute,
                                                precision):
  """Mixed precision runs 512 steps: float32 weights must get their
  gradients summed over the steps in float32 (issue 19)."""
  grad, args, run_with, loss_and_grads = gradient_case(case, recompute,
                                                       precision)
  got = in_mode(mode, loss_and_grads(run_with(
      lambda t, s, xs, step_: tf_recurrent.recurrent(t, s, xs, step_, grad))))(
          *args)
  want = autodiff_reference(case, recompute, precision)
  if precision == "float64":
    assert_all_close(got, want, tol=1e-9)
  else:
    assert_close_to_largest(got[1][0], want[1][0], tol=0.02)


def test_recomputing_step_keeps_no_extras():
  rng = np.random.default_rng(1)
  step, _, theta, state0, width = lstm_case(rng)
  lean_step, _ = cells.recomputing(step, cells.lstm_grad)
  x_t = tf.constant(rng.normal(size=[B, D]))
  lean_theta = {"cell": theta, "kernel": tf.constant(rng.normal(size=[D, width])),
                "bias": tf.constant(rng.normal(size=[width]))}
  state1, extras = lean_step(lean_theta, state0, x_t)
  assert not tf.nest.flatten(extras)
  want, _ = step(theta, state0, cells.project_inputs(
      x_t[None], lean_theta["kernel"], lean_theta["bias"])[0])
  assert_all_close(state1, want, tol=1e-12)


def test_lstm_step_matches_keras_lstm_cell():
  cell = tf.keras.layers.LSTMCell(H)
  x = tf.random.normal([T, B, D])
  cell.build((B, D))
  kernel, recurrent_kernel, bias = cell.get_weights()
  state = [tf.zeros([B, H]), tf.zeros([B, H])]
  keras_rows = []
  for t in range(T):
    out, state = cell(x[t], state)
    keras_rows.append(out)
  acc, _ = tf_recurrent.recurrent(
      {"recurrent_kernel": tf.constant(recurrent_kernel)},
      {"h": tf.zeros([B, H]), "c": tf.zeros([B, H])},
      cells.project_inputs(x, kernel, bias), cells.lstm_step, cells.lstm_grad)
  np.testing.assert_allclose(acc["h"], tf.stack(keras_rows), atol=1e-5)


def test_gru_step_matches_keras_gru_cell():
  cell = tf.keras.layers.GRUCell(H)
  x = tf.random.normal([T, B, D])
  cell.build((B, D))
  kernel, recurrent_kernel, bias = cell.get_weights()
  state = tf.zeros([B, H])
  keras_rows = []
  for t in range(T):
    out, state = cell(x[t], state)
    keras_rows.append(out)
  acc, _ = tf_recurrent.recurrent(
      {"recurrent_kernel": tf.constant(recurrent_kernel),
       "recurrent_bias": tf.constant(bias[1])},
      {"h": tf.zeros([B, H])},
      cells.project_inputs(x, kernel, bias[0]), cells.gru_step, cells.gru_grad)
  np.testing.assert_allclose(acc["h"], tf.stack(keras_rows), atol=1e-5)
