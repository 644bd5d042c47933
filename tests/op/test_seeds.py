"""step_seed(): every call its own seed, the same in the forward pass and the
backward recompute. The expected seeds are derived here from TensorFlow's
primitives as the docs state them, never from the library's own helpers."""

import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from conftest import assert_all_close, in_mode

fold_in = tf.random.experimental.stateless_fold_in
SEED = [7, 11]


def documented_seed(t, n, base=SEED):
  """The n-th step_seed() of step t, as the docs state it."""
  return fold_in(fold_in(tf.constant(base, tf.int32), t), n)


def two_draws_cell(theta, state, x):
  """Adds two uniform draws (seeded by two step_seed() calls) to its state."""
  del theta, x
  first = tf.random.stateless_uniform([3], seed=tf_recurrent.step_seed(),
                                      dtype=tf.float64)
  second = tf.random.stateless_uniform([3], seed=tf_recurrent.step_seed(),
                                       dtype=tf.float64)
  return {"first": first, "second": second,
          "sum": state["sum"] + first + second}, []


def run_two_draws(seed):
  zeros = tf.zeros([3], tf.float64)
  acc, _ = tf_recurrent.recurrent(
      (), {"first": zeros, "second": zeros, "sum": zeros},
      tf.zeros([4, 1]), two_draws_cell, seed=seed)
  return acc


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_each_call_and_step_gets_the_documented_seed(mode):
  acc = in_mode(mode, run_two_draws)(tf.constant(SEED))
  for t in range(4):
    for n, leaf in enumerate(("first", "second")):
      want = tf.random.stateless_uniform([3], seed=documented_seed(t, n),
                                         dtype=tf.float64)
      np.testing.assert_array_equal(acc[leaf][t], want)
  assert not np.array_equal(acc["first"], acc["second"])
  assert not np.array_equal(acc["first"][0], acc["first"][1])


def test_three_calls_in_a_step_each_get_the_documented_seed(mode):
  """The seed itself, per call: a frame that stopped counting after the
  second call (or folded in a constant) would repeat a seed."""

  def three_seeds_cell(theta, state, x):
    del theta, state, x
    return {"seeds": tf.stack([tf_recurrent.step_seed() for _ in range(3)])}, []

  acc, _ = in_mode(mode, lambda seed: tf_recurrent.recurrent(
      (), {"seeds": tf.zeros([3, 2], tf.int32)}, tf.zeros([2, 1]),
      three_seeds_cell, seed=seed))(tf.constant(SEED))
  # Computed by the same backend: XLA's fold-in draws other numbers.
  want = in_mode(mode, lambda: tf.stack([
      tf.stack([documented_seed(t, n) for n in range(3)]) for t in range(2)]))()
  np.testing.assert_array_equal(acc["seeds"], want)
  for t in range(2):
    assert len({tuple(s) for s in np.asarray(want[t])}) == 3


def test_under_xla_two_calls_in_a_step_differ():
  # XLA's stateless RNG draws other numbers than the CPU kernels, so only
  # the distinctness is checked here; the gradient test below checks XLA's
  # recompute against a reference run the same way.
  acc = in_mode("xla", run_two_draws)(tf.constant(SEED))
  assert not np.array_equal(acc["first"], acc["second"])
  assert not np.array_equal(acc["first"][0], acc["first"][1])


def two_mask_cell(theta, state, x):
  """Two dropout masks in one step: on the input and on the state."""
  keep_x = tf.random.stateless_uniform(
      tf.shape(x), seed=tf_recurrent.step_seed(), dtype=x.dtype) < 0.5
  keep_h = tf.random.stateless_uniform(
      tf.shape(state), seed=tf_recurrent.step_seed(), dtype=x.dtype) < 0.5
  dropped_x = tf.where(keep_x, 2.0 * x, tf.zeros_like(x))
  dropped_h = tf.where(keep_h, 2.0 * state, tf.zeros_like(state))
  return tf.tanh(dropped_h * theta + dropped_x), []


def test_recompute_sees_the_forward_masks(mode):
  theta = tf.constant(0.8, tf.float64)
  x = tf.constant(np.random.default_rng(2).normal(size=[6, 50]))
  h0 = tf.ones([50], tf.float64)

  def run(theta, x):
    with tf.GradientTape() as tape:
      tape.watch([theta, x])
      acc, _ = tf_recurrent.recurrent(theta, h0, x, two_mask_cell,
                                      seed=tf.constant(SEED))
      loss = tf.reduce_sum(acc * acc)
    return acc, tape.gradient(loss, [theta, x])

  def reference(theta, x):
    """Autodiff of a Python unroll drawing each mask from its documented
    seed."""
    with tf.GradientTape() as tape:
      tape.watch([theta, x])
      state, rows = h0, []
      for t in range(6):
        keep_x = tf.random.stateless_uniform(
            [50], seed=documented_seed(t, 0), dtype=tf.float64) < 0.5
        keep_h = tf.random.stateless_uniform(
            [50], seed=documented_seed(t, 1), dtype=tf.float64) < 0.5
        state = tf.tanh(tf.where(keep_h, 2.0 * state, 0.0) * theta +
                        tf.where(keep_x, 2.0 * x[t], 0.0))
        rows.append(state)
      acc = tf.stack(rows)
      loss = tf.reduce_sum(acc * acc)
    return acc, tape.gradient(loss, [theta, x])

  # XLA's stateless RNG draws other numbers than the CPU kernels, so the
  # reference runs in the same mode.
  acc, grads = in_mode(mode, run)(theta, x)
  want_acc, want_grads = in_mode(mode, reference)(theta, x)
  np.testing.assert_allclose(acc, want_acc, rtol=1e-12)
  assert_all_close(grads, want_grads, tol=1e-10)
  dropped_inputs = np.asarray(grads[1]) == 0
  assert 0.3 < dropped_inputs.mean() < 0.7


def test_new_masks_per_call_without_seed():
  x = tf.ones([2, 100])
  a, _ = tf_recurrent.recurrent(tf.constant(0.0), tf.zeros([100]), x,
                                two_mask_cell)
  b, _ = tf_recurrent.recurrent(tf.constant(0.0), tf.zeros([100]), x,
                                two_mask_cell)
  assert not np.array_equal(a, b)


def test_step_seed_outside_cell_fn_raises():
  with pytest.raises(RuntimeError, match="outside a cell_fn"):
    tf_recurrent.step_seed()
