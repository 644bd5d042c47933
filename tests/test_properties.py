"""Property test: random nested structures, lengths, per-example lengths,
checkpoint segments and cells, against the static unroll, values and
gradients in float64."""

import collections

import hypothesis
from hypothesis import strategies as st
import numpy as np
import tensorflow as tf

import tf_recurrent
from conftest import assert_all_close, static_unroll

Pair = collections.namedtuple("Pair", "first second")
BATCH = 2


@st.composite
def structures(draw, leaf_count):
  """A nested container (dict / namedtuple / list / tuple) of leaf indices."""
  leaves = list(range(leaf_count))

  def build(items, depth):
    if len(items) == 1 and (depth > 1 or draw(st.booleans())):
      return items[0]
    kind = draw(st.sampled_from(["dict", "list", "tuple", "pair"]))
    if kind == "pair" and len(items) >= 2:
      cut = draw(st.integers(1, len(items) - 1))
      return Pair(build(items[:cut], depth + 1), build(items[cut:], depth + 1))
    parts = [build([x], depth + 1) for x in items]
    if kind == "dict":
      return {f"k{i}": p for i, p in enumerate(parts)}
    return parts if kind == "list" else tuple(parts)

  return build(leaves, 0)


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    state_struct=st.integers(1, 3).flatmap(structures),
    input_struct=st.integers(1, 2).flatmap(structures),
    seq_len=st.integers(0, 6),
    length_cut=st.integers(0, 6),
    use_length=st.booleans(),
    example_lengths=st.lists(st.integers(0, 6), min_size=BATCH,
                             max_size=BATCH) | st.none(),
    checkpoint_every=st.sampled_from([None, 1, 2, 3, "sqrt"]),
    accumulate_state=st.sampled_from([True, False, "per_leaf"]),
    nonlinearity=st.sampled_from(["tanh", "sin", "square"]),
    seed=st.integers(0, 2**16))
def test_matches_static_unroll(state_struct, input_struct, seq_len, length_cut,
                               use_length, example_lengths, checkpoint_every,
                               accumulate_state, nonlinearity, seed):
  rng = np.random.default_rng(seed)
  dim = 3
  num_state = len(tf.nest.flatten(state_struct))
  num_inputs = len(tf.nest.flatten(input_struct))
  state0 = tf.nest.map_structure(
      lambda _: tf.constant(rng.normal(size=[BATCH, dim])), state_struct)
  inputs = tf.nest.map_structure(
      lambda _: tf.constant(rng.normal(size=[seq_len, BATCH, dim])),
      input_struct)
  theta = {"mix": tf.constant(rng.normal(size=[num_state, dim, dim]) * 0.4),
           "in": tf.constant(rng.normal(size=[num_inputs, dim]) * 0.4)}
  if accumulate_state == "per_leaf":
    accumulate_state = tf.nest.map_structure(
        lambda _: bool(rng.integers(2)), state_struct)
  act = {"tanh": tf.tanh, "sin": tf.sin, "square": lambda v: v * v * 0.3}[
      nonlinearity]

  def cell(theta, state, x):
    flat_s, flat_x = tf.nest.flatten(state), tf.nest.flatten(x)
    drive = sum(flat_x[i] * theta["in"][i] for i in range(num_inputs))
    new = [act(tf.matmul(flat_s[(i + 1) % num_state], theta["mix"][i]) + s +
               drive) for i, s in enumerate(flat_s)]
    return tf.nest.pack_sequence_as(state, new), []

  num_steps = min(length_cut, seq_len) if use_length else None
  if example_lengths is not None:
    example_lengths = [min(n, seq_len) for n in example_lengths]

  def masked(acc):
    if isinstance(accumulate_state, bool):
      return acc if accumulate_state else None
    return tf.nest.map_structure(lambda a, keep: a if keep else None, acc,
                                 accumulate_state)

  def run(op):
    with tf.GradientTape() as tape:
      tape.watch([theta, state0, inputs])
      acc, final = op()
      rows = [a for a in tf.nest.flatten(acc) if a is not None]
      loss = sum(tf.reduce_sum(tf.sin(a)) for a in rows) + sum(
          tf.reduce_sum(f * f) for f in tf.nest.flatten(final))
    return acc, final, tape.gradient(loss, [theta, state0, inputs])

  got = run(lambda: tf_recurrent.recurrent(
      theta, state0, inputs, cell, max_input_length=num_steps,
      sequence_length=example_lengths, checkpoint_every=checkpoint_every,
      accumulate_state=accumulate_state))

  def reference():
    acc, final = static_unroll(theta, state0, inputs, cell, num_steps,
                               sequence_length=example_lengths)
    return masked(acc), final

  want = run(reference)
  if accumulate_state is not False:
    tf.nest.assert_same_structure(got[0], state0)
  assert_all_close(got, want, tol=1e-9)
