"""Property test: random nested structures, lengths, per-example lengths,
checkpoint segments, cells and per-step XLA clusters, against the static
unroll, values and gradients in float64."""

import collections

import hypothesis
from hypothesis import strategies as st
import numpy as np
import tensorflow as tf

import tf_recurrent
from conftest import (GRAPH_MODES, assert_all_close, full_matrices,
                      recomputing_cell_grad, static_unroll, values_and_grads)

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


# 30 random examples with --full (TFR_FULL=1), 10 by default. The explicit
# example always runs: in a TF1 graph with plain steps, a cell_grad
# differentiating its recomputed step with tf.gradients (it must get the
# step's partial derivatives), a max_input_length and per-example lengths
# with an empty example.
@hypothesis.settings(max_examples=30 if full_matrices() else 10,
                     deadline=None)
@hypothesis.example(
    state_struct=Pair(0, [1]), input_struct={"k0": 0}, seq_len=5,
    length_cut=3, use_length=True, example_lengths=[4, 0],
    checkpoint_every=None, accumulate_state="per_leaf", nonlinearity="tanh",
    cell_grad="gradients", mode="tf1", xla_steps=False, seed=3)
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
    cell_grad=st.sampled_from([None, "by_hand", "tape", "gradients",
                               "gradients_in_function"]),
    mode=st.sampled_from(GRAPH_MODES),
    xla_steps=st.sampled_from(["auto", True, False]),
    seed=st.integers(0, 2**16))
def test_matches_static_unroll(state_struct, input_struct, seq_len, length_cut,
                               use_length, example_lengths, checkpoint_every,
                               accumulate_state, nonlinearity, cell_grad, mode,
                               xla_steps, seed):
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
  act, act_grad = {
      "tanh": (tf.tanh, lambda pre, v: 1 - v * v),
      "sin": (tf.sin, lambda pre, v: tf.cos(pre)),
      "square": (lambda v: v * v * 0.3, lambda pre, v: 0.6 * pre)}[nonlinearity]

  def pre_activations(theta, flat_s, flat_x):
    drive = sum(flat_x[i] * theta["in"][i] for i in range(num_inputs))
    return [tf.matmul(flat_s[(i + 1) % num_state], theta["mix"][i]) + s +
            drive for i, s in enumerate(flat_s)]

  def cell(theta, state, x):
    pre = pre_activations(theta, tf.nest.flatten(state), tf.nest.flatten(x))
    return tf.nest.pack_sequence_as(state, [act(p) for p in pre]), []

  def grad_by_hand(theta, state, x, extras, dstate1):
    del extras
    flat_s, flat_x = tf.nest.flatten(state), tf.nest.flatten(x)
    pre = pre_activations(theta, flat_s, flat_x)
    dpre = [d * act_grad(p, act(p))
            for d, p in zip(tf.nest.flatten(dstate1), pre)]
    ds = list(dpre)
    dmix = []
    for i, d in enumerate(dpre):
      src = (i + 1) % num_state
      dmix.append(tf.matmul(flat_s[src], d, transpose_a=True))
      ds[src] += tf.matmul(d, theta["mix"][i], transpose_b=True)
    ddrive = sum(dpre)
    dtheta = {"mix": tf.stack(dmix),
              "in": tf.stack([tf.reduce_sum(ddrive * v, 0) for v in flat_x])}
    dx = [ddrive * theta["in"][i] for i in range(num_inputs)]
    return (dtheta, tf.nest.pack_sequence_as(state, ds),
            tf.nest.pack_sequence_as(x, dx))

  if cell_grad is None or cell_grad == "by_hand":
    grad_fn = cell_grad and grad_by_hand
  else:
    grad_fn = recomputing_cell_grad(cell, cell_grad)

  num_steps = min(length_cut, seq_len) if use_length else None
  if example_lengths is not None:
    example_lengths = [min(n, seq_len) for n in example_lengths]

  def masked(acc):
    if isinstance(accumulate_state, bool):
      return acc if accumulate_state else None
    return tf.nest.map_structure(lambda a, keep: a if keep else None, acc,
                                 accumulate_state)

  def loss_of(acc, final):
    rows = [a for a in tf.nest.flatten(acc) if a is not None]
    return sum(tf.reduce_sum(tf.sin(a)) for a in rows) + sum(
        tf.reduce_sum(f * f) for f in tf.nest.flatten(final))

  def build(watch):
    # Fresh constants: a TF1 graph cannot capture eager tensors.
    args = tf.nest.map_structure(lambda v: tf.constant(v.numpy()),
                                 [theta, state0, inputs])
    watch(args)
    acc, final = tf_recurrent.recurrent(
        *args, cell, grad_fn, max_input_length=num_steps,
        sequence_length=example_lengths, checkpoint_every=checkpoint_every,
        accumulate_state=accumulate_state, xla_steps=xla_steps)
    if accumulate_state is not False:
      tf.nest.assert_same_structure(acc, state0)
    values = [v for v in tf.nest.flatten((acc, final)) if v is not None]
    return values, loss_of(acc, final), tf.nest.flatten(args)

  got = values_and_grads(mode, build)
  sources = tf.nest.flatten([theta, state0, inputs])
  with tf.GradientTape() as tape:
    tape.watch(sources)
    acc, final = static_unroll(theta, state0, inputs, cell, num_steps,
                               sequence_length=example_lengths)
    acc = masked(acc)
    loss = loss_of(acc, final)
  want = ([v for v in tf.nest.flatten((acc, final)) if v is not None],
          tape.gradient(loss, sources,
                        unconnected_gradients=tf.UnconnectedGradients.ZERO))
  assert_all_close(got, want, tol=1e-9)
