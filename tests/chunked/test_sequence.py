"""The layers' chunked LSTM/GRU loops against a float64 static unroll.

Chunks are made 3 steps long here, so a short sequence has several chunks
and a partial last one (T=7: 3 + 3 + 1). Masked runs are checked against
the unroll with Keras's masked step (the state carried where the mask is
off), written with plain `tf.where`.

The option matrix (modes x kinds x recompute x lengths and masks x
layout x dropout x zoneout) is one `pairwise` cover: every pair of values
of any two options in some case, each mode with every kind (the XLA pairs
once each: its compile is most of a case's cost), plus the edges named
below; `--full` / `TFR_FULL=1` runs their whole products. Each case traces
(and under XLA compiles) its own loops, so one case checking several
options at once costs what one option alone did.
"""

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

from conftest import GRAPH_MODES
from conftest import assert_all_close
from conftest import assert_numerical_gradients
from conftest import full_matrices
from conftest import pairwise
from conftest import record_output_gradients
from conftest import values_and_grads
from tf_recurrent.chunked import fused_lstm
from tf_recurrent.chunked import sequence

B, D, H = 2, 3, 4


@pytest.fixture(autouse=True)
def short_chunks(monkeypatch):
  monkeypatch.setattr(sequence, "CHUNK", 3)


def gate_masks(masks, blocks):
  """The masks of the gates `blocks` (a slice); a `[B, F]` mask serves all."""
  return masks if masks is None or masks.shape.rank == 2 else masks[blocks]


def linear(a, kernel, masks, gates):
  """`a @ kernel`, gate g's column block reading `a * masks[g]` (`[gates, B,
  F]` masks), or every block reading `a * masks` (one `[B, F]` mask)."""
  if masks is None:
    return a @ kernel
  if masks.shape.rank == 2:
    return (a * masks) @ kernel
  return tf.concat([(a * masks[g]) @ k for g, k in
                    enumerate(tf.split(kernel, gates, axis=-1))], axis=-1)


def unrolled_lstm(x, state0, w, dropout):
  """With a "projection" weight, an LSTM with a projection (PyTorch's
  `nn.LSTM(proj_size=P)`, TF1's `LSTMCell(num_proj=P)`): `h = (o * tanh(c))
  @ W_proj`, h is P wide and the recurrent kernel `[P, 4H]` reads it."""
  h, c = state0
  outputs = []
  for t in range(x.shape[0]):
    z = (linear(x[t], w["kernel"], dropout.get("inputs"), 4) + w["bias"] +
         linear(h, w["recurrent_kernel"], dropout.get("recurrent"), 4))
    i, f, g, o = tf.split(z, 4, axis=-1)
    c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
    h = tf.sigmoid(o) * tf.tanh(c)
    if "projection" in w:
      h = h @ w["projection"]
    outputs.append(h)
  return tf.stack(outputs), [h, c]


def unrolled_gru(x, state0, w, dropout):
  (h,) = state0
  outputs = []
  for t in range(x.shape[0]):
    xz, xr, xh = tf.split(linear(x[t], w["kernel"], dropout.get("inputs"), 3)
                          + w["bias"], 3, axis=-1)
    rz, rr, rh = tf.split(
        linear(h, w["recurrent_kernel"], dropout.get("recurrent"), 3) +
        w["recurrent_bias"], 3, axis=-1)
    z, r = tf.sigmoid(xz + rz), tf.sigmoid(xr + rr)
    h = z * h + (1.0 - z) * tf.tanh(xh + r * rh)
    outputs.append(h)
  return tf.stack(outputs), [h]


def unrolled_gru_reset_before(x, state0, w, dropout):
  (h,) = state0
  rec = dropout.get("recurrent")
  u_zr, u_h = w["recurrent_kernel"][:, :2 * H], w["recurrent_kernel"][:, 2 * H:]
  outputs = []
  for t in range(x.shape[0]):
    xz, xr, xh = tf.split(linear(x[t], w["kernel"], dropout.get("inputs"), 3)
                          + w["bias"], 3, axis=-1)
    rz, rr = tf.split(linear(h, u_zr, gate_masks(rec, slice(0, 2)), 2), 2,
                      axis=-1)
    z, r = tf.sigmoid(xz + rz), tf.sigmoid(xr + rr)
    hh = tf.tanh(xh + linear(r * h, u_h, gate_masks(rec, slice(2, 3)), 1))
    h = z * h + (1.0 - z) * hh
    outputs.append(h)
  return tf.stack(outputs), [h]


def unrolled_simple_rnn(x, state0, w, dropout):
  (h,) = state0
  outputs = []
  for t in range(x.shape[0]):
    h = tf.tanh(linear(x[t], w["kernel"], dropout.get("inputs"), 1) +
                w["bias"] +
                linear(h, w["recurrent_kernel"], dropout.get("recurrent"), 1))
    outputs.append(h)
  return tf.stack(outputs), [h]


EPSILON = 1e-3  # sequence.run's default norm_epsilon.


def layer_norm(t, gamma, beta=0.0, epsilon=EPSILON):
  """TF Addons' (Keras's LayerNormalization) norm over the last axis,
  written out: biased variance, epsilon inside the square root."""
  mean = tf.reduce_mean(t, axis=-1, keepdims=True)
  variance = tf.reduce_mean(tf.square(t - mean), axis=-1, keepdims=True)
  return (t - mean) / tf.sqrt(variance + epsilon) * gamma + beta


def unrolled_layer_norm_lstm(x, state0, w, dropout):
  """TF Addons' LayerNormLSTMCell.call, step by step."""
  h, c = state0
  outputs = []
  for t in range(x.shape[0]):
    z = (layer_norm(linear(x[t], w["kernel"], dropout.get("inputs"), 4),
                    w["kernel_gamma"], w["kernel_beta"]) +
         layer_norm(linear(h, w["recurrent_kernel"], dropout.get("recurrent"),
                           4), w["recurrent_gamma"], w["recurrent_beta"]) +
         w["bias"])
    zi, zf, zc, zo = tf.split(z, 4, axis=-1)
    c = layer_norm(tf.sigmoid(zf) * c + tf.sigmoid(zi) * tf.tanh(zc),
                   w["state_gamma"], w["state_beta"])
    h = tf.sigmoid(zo) * tf.tanh(c)
    outputs.append(h)
  return tf.stack(outputs), [h, c]


def unrolled_layer_norm_simple_rnn(x, state0, w, dropout):
  """TF Addons' LayerNormSimpleRNNCell.call (a norm without shift, then
  the bias), step by step."""
  (h,) = state0
  outputs = []
  for t in range(x.shape[0]):
    net = (linear(x[t], w["kernel"], dropout.get("inputs"), 1) +
           linear(h, w["recurrent_kernel"], dropout.get("recurrent"), 1))
    h = tf.tanh(layer_norm(net, w["gamma"]) + w["bias"])
    outputs.append(h)
  return tf.stack(outputs), [h]


UNROLLED = {"lstm": unrolled_lstm, "gru": unrolled_gru,
            "gru_reset_before": unrolled_gru_reset_before,
            "simple_rnn": unrolled_simple_rnn,
            "layer_norm_lstm": unrolled_layer_norm_lstm,
            "layer_norm_simple_rnn": unrolled_layer_norm_simple_rnn,
            "projected_lstm": unrolled_lstm}
KINDS = sorted(UNROLLED)
GATES = {"lstm": 4, "gru": 3, "gru_reset_before": 3, "simple_rnn": 1,
         "layer_norm_lstm": 4, "layer_norm_simple_rnn": 1,
         "projected_lstm": 4}
TWO_STATES = ("lstm", "layer_norm_lstm", "projected_lstm")
P = 5  # The projected LSTM's h width.
# The kinds `sequence.run` runs them as ("projected_lstm": an LSTM given a
# "projection" weight).
RUN_KINDS = {"projected_lstm": "lstm"}


def run_kind(kind, *args, **kwargs):
  """`sequence.run` of a test kind."""
  return sequence.run(RUN_KINDS.get(kind, kind), *args, **kwargs)


def h_width(kind):
  return P if kind == "projected_lstm" else H


def unrolled(kind, x, state0, w, mask=None, dropout=None):
  """The unroll; with a `[T, B]` mask, masked steps carry the state."""
  dropout = dropout or {}
  if mask is None:
    return UNROLLED[kind](x, state0, w, dropout)
  state, outputs = list(state0), []
  for t in range(x.shape[0]):
    _, new = UNROLLED[kind](x[t:t + 1], state, w, dropout)
    running = mask[t][:, None]
    state = [tf.where(running, n, s) for n, s in zip(new, state)]
    outputs.append(state[0])
  return tf.stack(outputs), state


# Per example (B=2), a `[T]` pattern, cut to T steps:
MASKS = {
    # Holes in the middle, one across the chunk boundary 2|3; a length-0
    # (all-masked) example.
    "holes": ("1100101", "0000000"),
    # A prefix (right padded) and a suffix (left padded: starts masked,
    # from a non-zero initial state).
    "prefix": ("1111000", "0001111"),
    "all_masked": ("0000000", "0000000"),
}


def mask_of(name, steps):
  """The `[T, B]` (time-major) bool mask called `name`, or None."""
  if name is None:
    return None
  rows = [[c == "1" for c in pattern[:steps]] for pattern in MASKS[name]]
  return tf.constant(np.array(rows).T.reshape([steps, B]))


def case(kind, steps, dtype=tf.float64, seed=0):
  rng = np.random.default_rng(seed)
  gates = GATES[kind]
  normal = lambda *shape: tf.constant(rng.normal(size=shape), dtype)
  w = {"kernel": normal(D, gates * H), "bias": normal(gates * H),
       "recurrent_kernel": normal(h_width(kind), gates * H) * 0.5}
  if kind == "projected_lstm":
    w["projection"] = normal(H, P) * 0.7
  if kind == "gru":
    w["recurrent_bias"] = normal(gates * H)
  if kind == "layer_norm_lstm":
    for norm, width in (("kernel", 4 * H), ("recurrent", 4 * H),
                        ("state", H)):
      w[f"{norm}_gamma"] = 1.0 + 0.3 * normal(width)
      w[f"{norm}_beta"] = 0.3 * normal(width)
  if kind == "layer_norm_simple_rnn":
    w["gamma"] = 1.0 + 0.3 * normal(H)
  state0 = [normal(B, h_width(kind))] + (
      [normal(B, H)] if kind in TWO_STATES else [])
  return normal(steps, B, D), state0, w


def loss_of(outputs, final):
  # Weights every output row and final leaf differently, so a row or leaf
  # swapped or dropped changes the loss.
  loss = tf.reduce_sum(tf.sin(outputs) * tf.cast(
      tf.range(1, tf.shape(outputs)[0] + 1), outputs.dtype)[:, None, None])
  return loss + sum((i + 2.0) * tf.reduce_sum(tf.cos(f))
                    for i, f in enumerate(final))


def dropout_masks(kind, seed, shared=False, dtype=tf.float64):
  """Dropout masks as Keras draws them (0 or 1 / keep): one per gate
  (`implementation=1`), or one for every gate (Keras before 3.6)."""
  rng = np.random.default_rng(seed)
  gates = [] if shared else [GATES[kind]]
  keep = lambda width: tf.constant(
      (rng.random(gates + [B, width]) < 0.7) / 0.7, dtype)
  return {"inputs": keep(D), "recurrent": keep(h_width(kind))}


# Zoneout (Krueger et al. 2017): a unit keeps its previous value where the
# step's mask is 1; the kinds with zoneout and their state leaves.
ZONEOUT_KINDS = {"lstm": ("h", "c"), "projected_lstm": ("h", "c"),
                 "gru": ("h",), "gru_reset_before": ("h",)}


def zoneout_masks(kind, steps, seed=9):
  """Per step and unit, True (keep the previous value) with probability
  0.3; bool, as the layers draw them."""
  rng = np.random.default_rng(seed)
  widths = {"h": h_width(kind), "c": H}
  return {leaf: tf.constant(rng.random([steps, B, widths[leaf]]) < 0.3)
          for leaf in ZONEOUT_KINDS[kind]}


def unrolled_with_zoneout(kind, x, state0, w, mask, zoneout, dropout=None):
  """The unroll, one step at a time: each new state leaf zoned out
  (`keep * previous + (1 - keep) * new`), then a masked step carried."""
  state, outputs = list(state0), []
  for t in range(x.shape[0]):
    _, new = UNROLLED[kind](x[t:t + 1], state, w, dropout or {})
    new = [tf.where(zoneout[leaf][t], s, n)
           for leaf, s, n in zip(ZONEOUT_KINDS[kind], state, new)]
    if mask is not None:
      new = [tf.where(mask[t][:, None], n, s) for n, s in zip(new, state)]
    state = new
    outputs.append(state[0])
  return tf.stack(outputs), state


def swap(t):
  return tf.transpose(t, [1, 0, 2])


def run_batch_major(kind, x, *args, **kwargs):
  """`run_kind` on the `[B, T, D]` layout (`time_major=False`), given and
  returning time-major tensors."""
  outputs, final = run_kind(kind, swap(x), *args, time_major=False, **kwargs)
  return swap(outputs), final


def run_both(mode, kind, recompute, steps, mask_name=None, dropout_seed=None,
             shared_dropout=False, zoneout=False, time_major=True):
  def build(fn):
    def run(watch):
      x, state0, w = case(kind, steps)  # In the TF1 graph when there is one.
      watch([x, state0, w])
      dropout = (None if dropout_seed is None
                 else dropout_masks(kind, dropout_seed, shared_dropout))
      zone = zoneout_masks(kind, steps) if zoneout else None
      outputs, final = fn(x, state0, w, mask_of(mask_name, steps), dropout,
                          zone)
      return ([outputs, final], loss_of(outputs, final),
              tf.nest.flatten([x, state0, w]))
    return run

  run = run_kind if time_major else run_batch_major
  ours = values_and_grads(mode, build(
      lambda x, s, w, m, d, z: run(kind, x, s, w, recompute=recompute,
                                   mask=m, dropout=d, zoneout=z)))
  want = values_and_grads("eager", build(
      lambda x, s, w, m, d, z: unrolled(kind, x, s, w, m, d) if z is None
      else unrolled_with_zoneout(kind, x, s, w, m, z, d)))
  return ours, want


def recompute_id(recompute):
  return "recompute" if recompute else "keep_gates"


def params(cases, order, recompute_at=None):
  """`pytest.param`s of `cases`, their ids the values in `order` (indices
  into a case; the one at `recompute_at` named as `recompute_id` does)."""
  return [pytest.param(*case, id="-".join(
      recompute_id(case[i]) if i == recompute_at else str(case[i])
      for i in order)) for case in cases]


# (T, mask): unmasked at T = 1, a chunk, several chunks with a partial last
# one; masked at T = 1, T < chunk, and partial last chunks (5 = 3 + 2,
# 7 = 3 + 3 + 1).
STEPS_AND_MASKS = [(1, None), (3, None), (7, None), (1, "all_masked"),
                   (2, "prefix"), (5, "prefix"), (7, "prefix"), (7, "holes")]
# Every case for the LSTM and the reset-after GRU; for the cells that share
# their loops and differ only in their step math, the edges (one step, all
# masked, a partial last chunk with holes, and a prefix and a suffix over
# several chunks).
OTHER_KINDS_STEPS = ((1, None), (1, "all_masked"), (7, "prefix"), (7, "holes"))
# Dropout and zoneout run where both examples run over several chunks (a
# prefix, a suffix from a non-zero state): with "holes" the second example
# is all masked and its masks would go unchecked.
BOTH_EXAMPLES_RUN = ((7, None), (5, "prefix"), (7, "prefix"))
# Dropout: none, one mask per gate (`implementation=1`), one for all gates.
DROPOUTS = [None, "per_gate", "shared"]


def allowed(mode, recompute, kind, steps_and_mask, time_major, dropout,
            zoneout):
  del mode, recompute, time_major  # Every value with every other.
  return ((kind in ("lstm", "gru") or steps_and_mask in OTHER_KINDS_STEPS) and
          (dropout is None and not zoneout or
           steps_and_mask in BOTH_EXAMPLES_RUN) and
          (not zoneout or kind in ZONEOUT_KINDS))


# One matrix of modes x recompute x kinds x (T, mask) x layout x dropout x
# zoneout, pairwise: each kind and each length and mask in every mode, each
# with both recompute values and both layouts (`time_major=False`, the
# layers' layout: chunks read and written along axis 1), dropout and zoneout
# with every other value, and both together. The edge: the batch-major
# layout's partial last chunk with holes under XLA (rows carried by
# `_next_row`).
MATCHES_CASES = [
    (mode, recompute, kind, steps, mask_name, time_major, dropout, zoneout)
    for mode, recompute, kind, (steps, mask_name), time_major, dropout,
    zoneout in pairwise(
        GRAPH_MODES, [False, True], KINDS, STEPS_AND_MASKS, [True, False],
        DROPOUTS, [False, True], where=allowed,
        edges=[("xla", False, "lstm", (7, "holes"), False, None, False)])]


def matches_id(mode, recompute, kind, steps, mask_name, time_major, dropout,
               zoneout):
  return "-".join([kind, str(steps), str(mask_name)] +
                  ([] if time_major else ["batch_major"]) +
                  ([f"dropout_{dropout}"] if dropout else []) +
                  (["zoneout"] if zoneout else []) +
                  [recompute_id(recompute), mode])


@pytest.mark.parametrize(
    "mode,recompute,kind,steps,mask_name,time_major,dropout,zoneout",
    [pytest.param(*c, id=matches_id(*c)) for c in MATCHES_CASES])
def test_matches_float64_unroll(mode, kind, recompute, steps, mask_name,
                                time_major, dropout, zoneout):
  """Values and gradients against the unroll; with dropout, Keras's masks
  (the same every step), with zoneout each step's new state leaves zoned
  out before a Keras mask carries the state."""
  ours, want = run_both(
      mode, kind, recompute, steps, mask_name,
      dropout_seed=None if dropout is None else 3,
      shared_dropout=dropout == "shared", zoneout=zoneout,
      time_major=time_major)
  for got, expected in zip(tf.nest.flatten(ours), tf.nest.flatten(want)):
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode,recompute,kind", params(pairwise(
    ["eager", "function"], [False, True], ["lstm", "projected_lstm"]),
    order=(2, 1, 0), recompute_at=1))
def test_fused_float32_lstm_gradient_matches_float64(mode, recompute, kind):
  """The TF executor's fused LSTM gradient (float32) against the unroll."""
  def build(dtype, fn):
    def run(watch):
      x, state0, w = tf.nest.map_structure(lambda t: tf.cast(t, dtype),
                                           case(kind, 7, seed=4))
      watch([x, state0, w])
      outputs, final = fn(x, state0, w)
      return [outputs, final], loss_of(outputs, final), [x, state0, w]
    return run

  got = values_and_grads(mode, build(tf.float32, lambda x, s, w: run_kind(
      kind, x, s, w, recompute=recompute, mask=mask_of("holes", 7))))
  want = values_and_grads("eager", build(tf.float64, lambda x, s, w: unrolled(
      kind, x, s, w, mask_of("holes", 7))))
  for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("steps", [1, 7])
def test_small_float32_lstm_on_the_whole_sequence_kernels(monkeypatch, mode,
                                                          steps):
  """An unmasked float32 LSTM of few units runs on `fused_lstm` (TF's
  BlockLSTMV2 / BlockLSTMGradV2) outside XLA, and matches the unroll."""
  calls = []
  fused_run = fused_lstm.run
  monkeypatch.setattr(fused_lstm, "run",
                      lambda *args: calls.append(1) or fused_run(*args))

  def build(dtype, fn):
    def run(watch):
      x, state0, w = tf.nest.map_structure(lambda t: tf.cast(t, dtype),
                                           case("lstm", steps, seed=5))
      watch([x, state0, w])
      outputs, final = fn(x, state0, w)
      return ([outputs, final], loss_of(outputs, final),
              tf.nest.flatten([x, state0, w]))
    return run

  got = values_and_grads(mode, build(tf.float32, lambda x, s, w: run_kind(
      "lstm", x, s, w)))
  want = values_and_grads("eager", build(tf.float64, lambda x, s, w: unrolled(
      "lstm", x, s, w)))
  for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
  assert bool(calls) == (mode != "xla")


@pytest.mark.parametrize("change", [
    "none", "mask", "dropout", "zoneout", "recompute", "xla", "float64",
    "mixed", "units", "kind", "projection"])
def test_whole_sequence_kernels_only_where_they_apply(change):
  x, state0, w = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32),
                                       case("lstm", 3))
  args = {"kind": "lstm", "x": x, "weights": w, "recompute": False,
          "mode": "graph", "mask": None, "dropout": None, "zoneout": None}
  units = fused_lstm.MAX_UNITS + 1
  args.update({
      "none": {}, "mask": {"mask": mask_of("prefix", 3)},
      "dropout": {"dropout": dropout_masks("lstm", 0)},
      "zoneout": {"zoneout": zoneout_masks("lstm", 3)},
      "recompute": {"recompute": True}, "xla": {"mode": "xla"},
      "float64": {"x": tf.cast(x, tf.float64)},
      "mixed": {"x": tf.cast(x, tf.bfloat16)},
      "units": {"weights": {**w, "recurrent_kernel": tf.zeros([units, 16])}},
      "kind": {"kind": "gru"},
      "projection": {"weights": {**w, "projection": tf.zeros([H, 2])}},
  }[change])
  assert fused_lstm.applies(**args) == (change == "none")


@pytest.mark.parametrize("kind,recompute,mask_name", pairwise(
    KINDS, [False, True], [None, "holes"],
    # The LSTM's variants: one case each way.
    where=lambda kind, recompute, mask_name:
    kind in ("lstm", "gru", "gru_reset_before", "simple_rnn") or
    recompute == (mask_name is None)))
def test_numerical_gradients(kind, recompute, mask_name):
  x, state0, w = case(kind, 5, seed=1)
  names = sorted(w)
  mask = mask_of(mask_name, 5)

  def loss(x, *args):
    state = list(args[:len(state0)])
    weights = dict(zip(names, args[len(state0):]))
    return loss_of(*run_kind(kind, x, state, weights,
                                 recompute=recompute, mask=mask))

  assert_numerical_gradients(loss, [x] + state0 + [w[k] for k in names])


@pytest.mark.parametrize("kind,mask_name", pairwise(KINDS, [None, "holes"]))
def test_time_unknown_when_traced(kind, mask_name):
  """T known only at run time: the chunk grid is computed in the graph."""
  x, state0, w = case(kind, 7)
  mask = mask_of(mask_name, 7)

  @tf.function(input_signature=[tf.TensorSpec([None, B, D], tf.float64),
                                tf.TensorSpec([None, B], tf.bool)])
  def run(x, mask):
    with tf.GradientTape() as tape:
      tape.watch([x, state0, w])
      outputs, final = run_kind(kind, x, state0, w,
                                    mask=None if mask_name is None else mask)
      loss = loss_of(outputs, final)
    return outputs, final, tape.gradient(loss, [x, state0, w])

  for steps in (7, 2):  # One trace, two lengths.
    xs, step_mask = x[:steps], None if mask is None else mask[:steps]
    with tf.GradientTape() as tape:
      tape.watch([xs, state0, w])
      outputs, final = unrolled(kind, xs, state0, w, step_mask)
      loss = loss_of(outputs, final)
    want = (outputs, final, tape.gradient(loss, [xs, state0, w]))
    got = run(xs, tf.ones([steps, B], tf.bool) if mask is None
              else step_mask)
    for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
      np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
  assert run.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("kind,mode", pairwise(KINDS, ["function", "xla"]))
def test_bfloat16_inputs_float32_weights(mode, kind):
  """Mixed precision: bfloat16 math, weight gradients in float32."""
  x, state0, w = case(kind, 7, dtype=tf.float32, seed=2)
  x16 = tf.cast(x, tf.bfloat16)
  s16 = [tf.cast(s, tf.bfloat16) for s in state0]

  def run(watch):
    watch(w)
    outputs, final = run_kind(kind, x16, s16, w)
    loss = loss_of(tf.cast(outputs, tf.float32),
                   [tf.cast(f, tf.float32) for f in final])
    return outputs, loss, w

  def reference(watch):
    watch(w)
    outputs, final = UNROLLED[kind](x, state0, w, {})
    return outputs, loss_of(outputs, final), w

  _, got_grads = values_and_grads(mode, run)
  assert all(g.dtype == tf.float32 for g in tf.nest.flatten(got_grads))
  _, want_grads = values_and_grads("eager", reference)
  for got, expected in zip(tf.nest.flatten(got_grads),
                           tf.nest.flatten(want_grads)):
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got / scale, expected / scale, atol=0.05)


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_final_state_loss_adds_no_outputs_gradient(monkeypatch, mode, kind):
  # A loss of the final state only: in a graph the outputs' gradient is
  # zeros TensorFlow made, which the backward pass skips (eager zeros are
  # values, added); the gradient is the unroll's either way.
  seen = record_output_gradients(monkeypatch)
  final_loss = lambda final: sum((i + 2.0) * tf.reduce_sum(tf.cos(f))
                                 for i, f in enumerate(final))

  def build(fn):
    def run(watch):
      x, state0, w = case(kind, 7)
      watch([x, state0, w])
      _, final = fn(x, state0, w)
      return ([final], final_loss(final),
              tf.nest.flatten([x, state0, w]))
    return run

  ours = values_and_grads(mode, build(
      lambda x, s, w: run_kind(kind, x, s, w)))
  want = values_and_grads("eager", build(
      lambda x, s, w: unrolled(kind, x, s, w)))
  for got, expected in zip(tf.nest.flatten(ours), tf.nest.flatten(want)):
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
  assert seen and all(skipped == (mode != "eager") for skipped in seen)


def test_a_carried_row_is_read_at_its_own_step_only():
  """Under XLA a backward step reads prep rows the loop carried in (see
  `sequence._next_row`): any index but the step's own is refused, not
  answered with the wrong row."""
  j = tf.constant(3)
  row = sequence._Row(tf.constant([1.0, 2.0]), j)
  np.testing.assert_array_equal(row[j], [1.0, 2.0])
  with pytest.raises(ValueError, match=r"only prep\[name\]\[j\]"):
    row[j - 1]  # pylint: disable=expression-not-assigned
  with pytest.raises(ValueError, match="its own step's row"):
    row[:, 1]  # pylint: disable=expression-not-assigned


def test_chunk_grid():
  x = tf.zeros([7, B, D])
  grid = sequence._Chunks(x, use_xla=False, chunk=3)
  assert (grid.size, grid.count) == (3, 3)
  assert [int(grid.steps(c)[1]) for c in range(3)] == [3, 3, 1]


@pytest.mark.parametrize("time_major,steps,mode", pairwise(
    [True, False], [6, 7], ["eager", "function", "unknown_t", "jit"]))
def test_a_chunk_reads_its_rows_and_the_last_again_past_t(steps, mode,
                                                          time_major):
  """Chunks of 3 over T=6 (every chunk full) and T=7 (the last chunk runs
  past T and reads row 6 again), with T known or not while tracing, and
  under XLA; `[K, B, 1]` rows from time-major or batch-major inputs."""
  shape = [steps, 2, 1] if time_major else [2, steps, 1]
  rows = tf.reshape(tf.range(float(steps)), [steps, 1, 1]) + tf.constant(
      [[[0.0], [100.0]]])  # Example 1's rows are example 0's + 100.
  rows = rows if time_major else swap(rows)

  def chunks(x):
    grid = sequence._Chunks(x, use_xla=mode == "jit", chunk=3,
                            time_major=time_major)
    return [grid.inputs(start) for start in range(0, steps, 3)]

  if mode == "eager":
    got = chunks(rows)
  else:
    shape[int(not time_major)] = None if mode == "unknown_t" else steps
    spec = tf.TensorSpec(shape)
    got = tf.function(chunks, jit_compile=mode == "jit",
                      input_signature=[spec])(rows)
  want = [[0, 1, 2], [3, 4, 5]] + ([[6, 6, 6]] if steps == 7 else [])
  assert [g.numpy()[:, 0, 0].tolist() for g in got] == want
  assert [(g.numpy()[:, 1, 0] - 100).tolist() for g in got] == want
  assert all(g.shape[0] in (3, None) and g.shape[1:] == [2, 1] for g in got)


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_batch_unknown_when_traced(kind, jit_compile):
  """B known only at run time: the loops' buffers are shaped in the graph
  (the graph-mode loop functions are traced with the caller's shapes)."""
  x, state0, w = case(kind, 7)
  mask = mask_of("holes", 7)

  @tf.function(jit_compile=jit_compile, input_signature=[
      tf.TensorSpec([7, None, D], tf.float64),
      tf.TensorSpec([7, None], tf.bool)])
  def run(x, mask):
    with tf.GradientTape() as tape:
      tape.watch([x, state0, w])
      outputs, final = run_kind(kind, x, state0, w, mask=mask)
      loss = loss_of(outputs, final)
    return outputs, final, tape.gradient(loss, [x, state0, w])

  with tf.GradientTape() as tape:
    tape.watch([x, state0, w])
    outputs, final = unrolled(kind, x, state0, w, mask)
    loss = loss_of(outputs, final)
  want = (outputs, final, tape.gradient(loss, [x, state0, w]))
  for a, b in zip(tf.nest.flatten(run(x, mask)), tf.nest.flatten(want)):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@hypothesis.settings(
    max_examples=12 if full_matrices() else 6, deadline=None,
    # short_chunks restores CHUNK once after all examples; each sets its own.
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(kind=st.sampled_from(KINDS), steps=st.integers(1, 9),
                  chunk=st.integers(1, 5), recompute=st.booleans(),
                  masked=st.booleans(), seed=st.integers(0, 2**16))
def test_any_length_and_chunk_matches_unroll(kind, steps, chunk, recompute,
                                             masked, seed):
  """Random lengths and chunk sizes (full, partial or one-step chunks), and
  random masks."""
  x, state0, w = case(kind, steps, seed=seed)
  mask = (tf.constant(np.random.default_rng(seed).random([steps, B]) < 0.6)
          if masked else None)
  with tf.GradientTape() as tape:
    tape.watch([x, state0, w])
    outputs, final = unrolled(kind, x, state0, w, mask)
    want = tape.gradient(loss_of(outputs, final), [x, state0, w])
  sequence.CHUNK = chunk  # Restored by the short_chunks fixture.
  with tf.GradientTape() as tape:
    tape.watch([x, state0, w])
    got_outputs, got_final = run_kind(kind, x, state0, w,
                                          recompute=recompute, mask=mask)
    got = tape.gradient(loss_of(got_outputs, got_final), [x, state0, w])
  for a, b in zip(tf.nest.flatten([got_outputs, got_final, got]),
                  tf.nest.flatten([outputs, final, want])):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_inside_mirrored_strategy_matches_one_device(kind):
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
  strategy = tf.distribute.MirroredStrategy(devices)
  x, state0, w = case(kind, 7)
  with strategy.scope():
    kernel = tf.Variable(w["kernel"])

  def step():
    with tf.GradientTape() as tape:
      outputs, final = run_kind(kind, x, state0, {**w, "kernel": kernel})
      loss = loss_of(outputs, final)
    return tape.gradient(loss, kernel)

  grads = strategy.experimental_local_results(
      strategy.run(tf.function(step)))
  assert len(grads) == len(devices)
  for g in grads:
    np.testing.assert_allclose(g, step(), rtol=1e-10)


def test_unknown_kind_is_named():
  x, state0, w = case("lstm", 2)
  with pytest.raises(ValueError, match="kind must be one of .*'layer_norm_lstm'"
                     ".*got 'lstn'"):
    sequence.run("lstn", x, state0, w)


def test_zoneout_is_refused_where_not_built():
  x, state0, w = case("simple_rnn", 3)
  with pytest.raises(ValueError, match="zoneout is built for .*lstm.*not .simple_rnn"):
    sequence.run("simple_rnn", x, state0, w,
                 zoneout={"h": tf.zeros([3, B, H], tf.float64)})


@pytest.mark.parametrize("kind,outer,tapes", pairwise(
    ["lstm", "gru", "projected_lstm", "fused_lstm"],
    ["eager", "function", "xla"], ["persistent", "nested"]))
def test_first_order_under_persistent_and_nested_tapes(kind, outer, tapes):
  """A persistent tape, or a tape inside another (a gradient penalty, say),
  around the loop raised LookupError (no gradient for InplaceUpdate, or for
  BlockLSTMGradV2: "fused_lstm", a float32 LSTM on TensorFlow's kernels
  outside XLA): TF differentiates what the first order reads, back into the
  loops. The first order is the unroll's; a second order asked of the loop
  fails, naming the cause (NaN under XLA, which drops assertions)."""
  dtype, tol = ((tf.float32, 1e-5) if kind == "fused_lstm" else
                (tf.float64, 1e-10))
  kind = "lstm" if kind == "fused_lstm" else kind
  x, state0, w = tf.nest.map_structure(lambda t: tf.cast(t, dtype),
                                       case(kind, 7))
  sources = [x, state0, w]
  if dtype == tf.float32 and outer != "xla":
    assert fused_lstm.applies(kind, x, w, False, "graph", None, None, None)

  def loss(x, state0, w):
    return loss_of(*run_kind(kind, x, state0, w))

  if outer != "eager":
    loss = tf.function(loss, autograph=False, jit_compile=outer == "xla")
  with tf.GradientTape() as tape:
    tape.watch(sources)
    want = tape.gradient(loss_of(*unrolled(kind, x, state0, w)), sources)
  with tf.GradientTape(persistent=True) as outer_tape:
    outer_tape.watch(sources)
    with tf.GradientTape(persistent=tapes == "persistent") as tape:
      tape.watch(sources)
      value = loss(x, state0, w)
    got = tape.gradient(value, sources)
    if tapes == "persistent":  # A persistent tape answers twice.
      assert_all_close(tape.gradient(value, sources), want, tol=tol)
    total = tf.reduce_sum(got[0])
  assert_all_close(got, want, tol=tol)
  if outer == "xla":  # XLA drops the assertion: NaN, no finite number.
    assert np.isnan(outer_tape.gradient(total, x)).all()
    return
  with pytest.raises(tf.errors.InvalidArgumentError, match="second-order"):
    outer_tape.gradient(total, x)
