"""`tf_recurrent.linear_scan` (tf_recurrent/linear/scan.py) against the
float64 Python unroll (conftest.linear_unroll) differentiated by autodiff:
values and every gradient in eager, tf.function, XLA and TF1 graphs,
options pairwise; finite differences; a property test; float32 and half
precision numerics; errors."""

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from conftest import (GRAPH_MODES, assert_all_close, assert_numerical_gradients,
                      full_matrices, in_mode, linear_unroll, pairwise,
                      values_and_grads, weighted_sum)

B, H, CHUNK = 3, 2, 3


def random_pair(rng, steps, shape=(H,), dtype=np.float64):
  """Decays in (0.1, 1.1) (some above 1: nothing assumes contraction)."""
  a = rng.uniform(0.1, 1.1, size=(B, steps) + shape).astype(dtype)
  b = rng.normal(size=(B, steps) + shape).astype(dtype)
  return a, b


def problem(seed, steps, nested):
  """(a, b, h0) numpy structures: one `[B, T, H]` leaf, or a dict of a
  `[B, T, H]` leaf and a `[B, T, 2, 2]` leaf."""
  rng = np.random.default_rng(seed)
  shapes = {"x": (H,), "y": (2, 2)} if nested else {"x": (H,)}
  pairs = {k: random_pair(rng, steps, s) for k, s in shapes.items()}
  h0 = {k: rng.normal(size=(B,) + s) for k, s in shapes.items()}
  pick = (lambda d: d) if nested else (lambda d: d["x"])
  return (pick({k: p[0] for k, p in pairs.items()}),
          pick({k: p[1] for k, p in pairs.items()}), pick(h0))


def swap(x):
  return tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))


def oracle(a, b, h0, reverse, lengths):
  """The reference's (h, last) over structures."""
  flat = [linear_unroll(x, y, z, reverse, lengths) for x, y, z in zip(
      tf.nest.flatten(a), tf.nest.flatten(b), tf.nest.flatten(h0))]
  return (tf.nest.pack_sequence_as(a, [f[0] for f in flat]),
          tf.nest.pack_sequence_as(a, [f[1] for f in flat]))


LENGTHS = {None: None, "mixed": lambda t: [t, 0, max(t - 2, 0)],
           "full": lambda t: [t] * B}

# (mode, T, reverse, time_major, lengths, initial state given, nested):
# T=0, 1, 6 (a multiple of the chunk) and 7 (not).
CASES = pairwise(GRAPH_MODES, [7, 6, 1, 0], [False, True], [False, True],
                 list(LENGTHS), [False, True], [False, True],
                 edges=[("xla", 7, True, False, "mixed", True, True),
                        ("tf1", 7, True, True, "mixed", True, True)])


@pytest.mark.parametrize("mode,steps,reverse,time_major,lengths,given,nested",
                         CASES)
def test_values_and_gradients_match_the_unroll(mode, steps, reverse,
                                               time_major, lengths, given,
                                               nested):
  a_np, b_np, h0_np = problem(steps, steps, nested)
  lengths = LENGTHS[lengths] and LENGTHS[lengths](steps)

  def build(watch):
    a = tf.nest.map_structure(tf.constant, a_np)
    b = tf.nest.map_structure(tf.constant, b_np)
    h0 = tf.nest.map_structure(tf.constant, h0_np) if given else None
    sources = [a, b] + ([h0] if given else [])
    watch(tf.nest.flatten(sources))
    layout = tf.nest.map_structure(swap, (a, b)) if time_major else (a, b)
    h, last = tf_recurrent.linear_scan(
        *layout, h0, time_major=time_major, reverse=reverse,
        sequence_length=lengths, chunk_size=CHUNK)
    if time_major:
      h = tf.nest.map_structure(swap, h)
    values = [h, last]
    return values, weighted_sum(values, weights), tf.nest.flatten(sources)

  rng = np.random.default_rng(1)
  weights = [tf.nest.map_structure(lambda x: rng.normal(size=x.shape), a_np),
             tf.nest.map_structure(
                 lambda x: rng.normal(size=x.shape[:1] + x.shape[2:]), a_np)]
  values, grads = values_and_grads(mode, build)

  with tf.GradientTape() as tape:
    a = tf.nest.map_structure(tf.constant, a_np)
    b = tf.nest.map_structure(tf.constant, b_np)
    h0 = tf.nest.map_structure(tf.constant, h0_np)
    if not given:
      h0 = tf.nest.map_structure(tf.zeros_like, h0)
    sources = [a, b] + ([h0] if given else [])
    tape.watch(tf.nest.flatten(sources))
    expected = list(oracle(a, b, h0, reverse, lengths))
    loss = weighted_sum(expected, weights)
  expected_grads = tape.gradient(
      loss, tf.nest.flatten(sources),
      unconnected_gradients=tf.UnconnectedGradients.ZERO)
  assert_all_close(values, tf.nest.flatten(expected), tol=1e-10)
  assert_all_close(grads, expected_grads, tol=1e-10)


def test_gradients_match_finite_differences():
  rng = np.random.default_rng(0)
  a, b = (tf.constant(x[:2, :, :1]) for x in random_pair(rng, 5))
  h0 = tf.constant(rng.normal(size=(2, 1)))

  def loss(a, b, h0):
    h, last = tf_recurrent.linear_scan(a, b, h0, reverse=True,
                                       sequence_length=[5, 2],
                                       chunk_size=CHUNK)
    return tf.reduce_sum(h * tf.sin(h)) + tf.reduce_sum(last ** 2)

  assert_numerical_gradients(loss, [a, b, h0])


@hypothesis.settings(max_examples=30 if full_matrices() else 4,
                     deadline=None)
@hypothesis.given(steps=st.integers(0, 9), chunk=st.sampled_from([1, 4, 64]),
                  reverse=st.booleans(),
                  lengths=st.lists(st.integers(0, 9), min_size=B,
                                   max_size=B) | st.none(),
                  seed=st.integers(0, 2**16))
def test_property_random_problems(steps, chunk, reverse, lengths, seed):
  if lengths is not None:
    lengths = [min(n, steps) for n in lengths]
  a_np, b_np, h0_np = problem(seed, steps, nested=False)
  a, b, h0 = map(tf.constant, (a_np, b_np, h0_np))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([a, b, h0])
    h, last = tf_recurrent.linear_scan(a, b, h0, reverse=reverse,
                                       sequence_length=lengths,
                                       chunk_size=chunk)
    want_h, want_last = linear_unroll(a, b, h0, reverse, lengths)
    loss = tf.reduce_sum(h * b) + tf.reduce_sum(last * h0)
    want_loss = tf.reduce_sum(want_h * b) + tf.reduce_sum(want_last * h0)
  assert_all_close([h, last], [want_h, want_last], tol=1e-10)
  assert_all_close(tape.gradient(loss, [a, b, h0]),
                   tape.gradient(want_loss, [a, b, h0]), tol=1e-10)


def test_float32_relative_error_at_4096_steps():
  """Every decay from 0.02 to 0.996: float32 within 2e-6 of float64
  (relative to each channel's largest |h|), values and gradients."""
  decays = np.array([0.02, 0.1, 0.5, 0.9, 0.99, 0.996])
  rng = np.random.default_rng(0)
  steps = 4096
  a64 = np.broadcast_to(decays, (2, steps, decays.size)) * rng.uniform(
      0.999, 1.0, size=(2, steps, decays.size))
  b64 = rng.normal(size=a64.shape)
  dh64 = rng.normal(size=a64.shape)

  @tf.function(autograph=False)
  def run(a, b, dh):
    with tf.GradientTape() as tape:
      tape.watch([a, b])
      h, _ = tf_recurrent.linear_scan(a, b)
      loss = tf.reduce_sum(h * dh)
    return [h] + tape.gradient(loss, [a, b])

  exact = run(*(tf.constant(x) for x in (a64, b64, dh64)))
  single = run(*(tf.constant(x, tf.float32) for x in (a64, b64, dh64)))
  for got, want in zip(single, exact):
    want = want.numpy()
    error = np.abs(got.numpy() - want).max(axis=(0, 1))
    assert (error / np.abs(want).max(axis=(0, 1))).max() <= 2e-6


@pytest.mark.parametrize("dtype,rounding,mode", [
    (tf.bfloat16, 2.0**-8, "eager"), (tf.float16, 2.0**-11, "eager"),
    (tf.bfloat16, 2.0**-8, "xla")])
def test_half_precision_accumulates_in_float32(dtype, rounding, mode):
  """At a decay of 0.999 over 512 steps a half-precision sum would drift by
  hundreds of ulps; in float32 h and db are the exact values rounded once
  (`rounding`: the dtype's unit roundoff), da = g h_{t-1} twice (h_{t-1}
  is read back rounded). Under XLA the blocks are written in place into
  half-precision results (T=500: a last chunk shorter than the others)."""
  rng = np.random.default_rng(0)
  steps = 500 if mode == "xla" else 512
  a = tf.cast(tf.constant(rng.uniform(0.998, 0.9995, size=(2, steps, 3))),
              dtype)
  b = tf.cast(tf.constant(rng.uniform(0.0, 0.1, size=(2, steps, 3))), dtype)

  def run(a, b):
    with tf.GradientTape() as tape:
      tape.watch([a, b])
      h, last = tf_recurrent.linear_scan(a, b)
      loss = tf.reduce_sum(tf.cast(h, tf.float32))
    return [h, last] + tape.gradient(loss, [a, b])

  h, last, da, db = in_mode(mode, run)(a, b)
  assert h.dtype == last.dtype == da.dtype == db.dtype == dtype
  a64, b64 = tf.cast(a, tf.float64), tf.cast(b, tf.float64)
  with tf.GradientTape() as tape:
    tape.watch([a64, b64])
    want, _ = linear_unroll(a64, b64, tf.zeros([2, 3], tf.float64))
    want_loss = tf.reduce_sum(want)
  want_da, want_db = tape.gradient(want_loss, [a64, b64])
  for got, exact, roundings in ((h, want, 1), (da, want_da, 2),
                                (db, want_db, 1)):
    np.testing.assert_allclose(tf.cast(got, tf.float64), exact,
                               rtol=roundings * rounding * 1.01, atol=0)


def test_second_order_fails_loudly():
  a, b = tf.fill([1, 3, 1], 0.5), tf.ones([1, 3, 1])
  with tf.GradientTape() as outer:
    outer.watch(b)
    with tf.GradientTape() as inner:
      inner.watch(b)
      h, _ = tf_recurrent.linear_scan(a, b)
      loss = tf.reduce_sum(h ** 2)
    db = inner.gradient(loss, b)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="first-order gradient"):
    outer.gradient(db, b)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(b={"x": tf.ones([2, 3, 1])}), ValueError, "structure of a"),
    (dict(b=[tf.ones([2, 3, 1], tf.float64)]), TypeError,
     r"b\[0\] must have the dtype of a\[0\]"),
    (dict(b=[tf.ones([2, 4, 1])]), ValueError,
     r"b\[0\] must have the shape of a\[0\]"),
    (dict(a=[tf.ones([2, 3], tf.int32)], b=[tf.ones([2, 3], tf.int32)]),
     TypeError, r"a\[0\] must be float16"),
    (dict(a=[tf.ones([3])], b=[tf.ones([3])]), ValueError,
     r"a\[0\] must have shape \[B, T, ...\]"),
    (dict(a=[tf.ones([2, 3, 1]), tf.ones([2, 4, 1])],
          b=[tf.ones([2, 3, 1]), tf.ones([2, 4, 1])]), ValueError,
     r"a\[1\] has number of steps 4 but a\[0\] has 3"),
    (dict(initial_state=[tf.ones([2, 2])]), ValueError,
     r"initial_state\[0\] must have shape \(2, 1\)"),
    (dict(initial_state=[tf.ones([2, 1], tf.float64)]), TypeError,
     r"initial_state\[0\] must have the dtype of a\[0\]"),
    (dict(chunk_size=0), ValueError, "chunk_size"),
    (dict(chunk_size="big"), TypeError, "chunk_size"),
    (dict(sequence_length=[1, 2, 3]), ValueError, "3 entries"),
    (dict(sequence_length=[4, 1]), ValueError, r"in \[0, T=3\]"),
    (dict(sequence_length=[[1, 2]]), ValueError, r"\[batch\] vector"),
    (dict(reverse=1), TypeError, "reverse must be a bool"),
])
def test_bad_arguments_get_clear_errors(kwargs, error, match):
  args = dict(a=[tf.ones([2, 3, 1])], b=[tf.ones([2, 3, 1])])
  args.update(kwargs)
  with pytest.raises(error, match=match):
    tf_recurrent.linear_scan(args.pop("a"), args.pop("b"), **args)


def test_structures_and_dtypes_of_the_results():
  a = {"p": tf.ones([2, 0, 3]), "q": [tf.ones([2, 0], tf.float64)]}
  h0 = {"p": tf.ones([2, 3]), "q": [tf.fill([2], tf.constant(2.0, tf.float64))]}
  h, last = tf_recurrent.linear_scan(a, a, h0)
  assert h["p"].shape == (2, 0, 3) and h["q"][0].dtype == tf.float64
  assert_all_close(last, h0)
