"""The layers of one cell class (`cell_layers.CellLayer`: the layer-norm
LSTM and SimpleRNN, the projected LSTM) against Keras's own loop running
the same cells (`keras.layers.RNN(cell)`, autodiff), with the same weights.

The loops' math is checked against float64 unrolls of the published
equations in test_sequence.py (TF Addons' layer-norm cells; PyTorch's
`nn.LSTM(proj_size)`). The peephole LSTM has its own test_peephole.py.
"""

import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import pairwise, values_and_grads
import tf_recurrent
from tf_recurrent.chunked import sequence

B, D, H, T = 2, 3, 4, 7

P = 3  # The projected LSTM's proj_size.
# kind: (layer class, cell class, the arguments both need).
LAYERS = {"layer_norm_lstm": (tf_recurrent.LayerNormLSTM,
                              tf_recurrent.LayerNormLSTMCell, {}),
          "layer_norm_simple_rnn": (tf_recurrent.LayerNormSimpleRNN,
                                    tf_recurrent.LayerNormSimpleRNNCell, {}),
          "projected_lstm": (tf_recurrent.ProjectedLSTM,
                             tf_recurrent.ProjectedLSTMCell,
                             {"proj_size": P}),
          "zoneout_lstm": (tf_recurrent.ZoneoutLSTM,
                           tf_recurrent.ZoneoutLSTMCell,
                           {"zoneout_h": 0.3, "zoneout_c": 0.2}),
          "zoneout_gru": (tf_recurrent.ZoneoutGRU, tf_recurrent.ZoneoutGRUCell,
                          {"zoneout_h": 0.3})}
# Zoneout draws per step in Keras's loop and per call in ours: the two
# compare in inference (the expectation); training is tested on its own.
ZONEOUT = ("zoneout_lstm", "zoneout_gru")


@pytest.fixture(autouse=True)
def short_chunks(monkeypatch):
  monkeypatch.setattr(sequence, "CHUNK", 3)  # T=7: 3 + 3 + 1.


def layer_pair(kind, **kwargs):
  """Ours and `keras.layers.RNN` of the same cell class, same weights (the
  norms' gammas and betas random too, so that their gradients matter)."""
  layer_class, cell_class, needed = LAYERS[kind]
  kwargs = {**needed, **kwargs}
  ours = layer_class(H, return_sequences=True, return_state=True, **kwargs)
  theirs = keras.layers.RNN(cell_class(H, **kwargs), return_sequences=True,
                            return_state=True)
  rng = np.random.default_rng(5)
  for layer in (ours, theirs):
    layer.build((B, T, D))
  weights = [rng.normal(size=w.shape).astype(np.float32) * 0.5 + (
      1.0 if "gamma" in w.path else 0.0) for w in ours.weights]
  for layer in (ours, theirs):
    layer.set_weights(weights)
  return ours, theirs


def layer_inputs():
  rng = np.random.default_rng(6)
  x = tf.constant(rng.normal(size=[B, T, D]), tf.float32)
  # Holes (one across the chunk boundary 2|3) and an all-masked example.
  mask = tf.constant([[c == "1" for c in row] for row in ("1100101",
                                                           "0000000")])
  return x, mask


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_layer_runs_the_chunked_loop(monkeypatch, kind):
  kinds = []
  real_run = sequence.run
  monkeypatch.setattr(sequence, "run", lambda k, *a, **kw: kinds.append(
      (k, kw.get("norm_epsilon"), sorted(a[2]), sorted(kw.get("zoneout") or
                                                       {})))
      or real_run(k, *a, **kw))
  ours, _ = layer_pair(kind)
  ours(layer_inputs()[0])
  lstm = ["bias", "kernel", "recurrent_kernel"]
  norms = [f"{p}_{w}" for p in ("kernel", "recurrent", "state")
           for w in ("beta", "gamma")]
  assert kinds == {  # Addons' default epsilons.
      "layer_norm_lstm": [(kind, 1e-3, sorted(lstm + norms), [])],
      "layer_norm_simple_rnn": [(kind, 1e-5, sorted(lstm + ["gamma"]), [])],
      "projected_lstm": [("lstm", None, sorted(lstm + ["projection"]), [])],
      "zoneout_lstm": [("lstm", None, lstm, ["c", "h"])],
      "zoneout_gru": [("gru", None, sorted(lstm + ["recurrent_bias"]),
                       ["h"])],
  }[kind]


CASES = {"plain": (False, {}), "holes_backwards": (True, {"go_backwards": True}),
         # The same seed: both draw the same masks (one for all gates).
         # Unmasked: the holes' second example is all masked, its dropout
         # masks would go unchecked.
         "dropout": (False, {"dropout": 0.3, "recurrent_dropout": 0.3,
                             "seed": 7})}


# Kinds x modes x cases, all pairs (the whole product with --full); the
# cases in the order that makes the greedy cover smallest (15 runs).
@pytest.mark.parametrize("kind,mode,case", pairwise(
    sorted(LAYERS), ["eager", "function", "xla"],
    ["dropout", "holes_backwards", "plain"],
    # XLA draws other random numbers from a seed than Keras does eagerly;
    # the zoneout layers compare in inference, where dropout is off.
    where=lambda kind, mode, case: not (mode == "xla" and case == "dropout")
    and not (kind in ZONEOUT and case == "dropout")))
def test_layer_matches_keras_rnn_of_cell(kind, mode, case):
  masked, kwargs = CASES[case][0], dict(CASES[case][1])
  layer_kwargs = {k: kwargs.pop(k) for k in ("go_backwards",) if k in kwargs}
  ours, theirs = layer_pair(kind, **kwargs)
  if layer_kwargs:
    theirs = keras.layers.RNN(theirs.cell, return_sequences=True,
                              return_state=True, **layer_kwargs)
    ours = type(ours).from_config({**ours.get_config(), **layer_kwargs})
    ours.build((B, T, D))
    ours.set_weights(theirs.get_weights())
  x, mask = layer_inputs()

  def build(layer):
    def run(watch):
      watch(x)
      values = layer(x, mask=mask if masked else None,
                     training=kind not in ZONEOUT)
      loss = sum(tf.reduce_sum(tf.sin(v) * (k + 1.0))
                 for k, v in enumerate(values))
      return values, loss, [x] + layer.trainable_variables
    return run

  got = values_and_grads(mode, build(ours))
  # Keras's loop (the reference) runs eagerly: a trace of it (a second or
  # so) would check nothing more. Its weights and draws are the case's.
  want = values_and_grads("eager", build(theirs))
  assert len(got[1]) == len(ours.trainable_variables) + 1
  assert all(np.abs(g).max() > 1e-4 for g in want[1])
  for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    np.testing.assert_allclose(a, b, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_bidirectional_matches_keras(kind):
  ours, theirs = layer_pair(kind)
  x, mask = layer_inputs()
  needed = LAYERS[kind][2]
  pair = [keras.layers.Bidirectional(type(ours)(H, return_sequences=True,
                                                **needed)),
          keras.layers.Bidirectional(keras.layers.RNN(
              type(theirs.cell)(H, **needed), return_sequences=True))]
  for layer in pair:
    layer.build((B, T, D))
  pair[1].set_weights(pair[0].get_weights())
  results = []
  for layer in pair:
    with tf.GradientTape() as tape:
      out = layer(x, mask=mask)
      loss = tf.reduce_sum(tf.sin(out))
    results.append([out] + tape.gradient(loss, layer.trainable_variables))
  for a, b in zip(*results):
    np.testing.assert_allclose(a, b, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_keras_save_load_and_saved_model_reload(tmp_path, kind):
  layer_class, _, needed = LAYERS[kind]
  x, _ = layer_inputs()
  inputs = keras.Input((T, D))
  # (No dropout: Keras's seed generator cannot be saved in a tf.Module,
  # keras.layers.SimpleRNN(dropout=0.1)'s neither.)
  outputs = layer_class(H, return_sequences=True, recompute=True,
                        kernel_initializer="random_normal", **needed)(inputs)
  model = keras.Model(inputs, outputs)
  path = os.path.join(tmp_path, "model.keras")
  model.save(path)
  loaded = keras.models.load_model(path)
  layer = loaded.layers[-1]
  assert isinstance(layer, layer_class)
  assert layer.recompute
  assert layer.get_config() == model.layers[-1].get_config()
  np.testing.assert_allclose(loaded(x), model(x), rtol=1e-6, atol=1e-6)

  # A SavedModel: the reloaded function's output and input gradient.
  module = tf.Module()
  module.model = model
  module.f = tf.function(lambda v: model(v),
                         input_signature=[tf.TensorSpec([None, T, D])])
  tf.saved_model.save(module, os.path.join(tmp_path, "saved"))
  reloaded = tf.saved_model.load(os.path.join(tmp_path, "saved"))
  grads = []
  for fn in (module.f, reloaded.f):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = fn(x)
      loss = tf.reduce_sum(tf.sin(out))
    grads.append((out, tape.gradient(loss, x)))
  for a, b in zip(*grads):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_cell_config_round_trip():
  cell = tf_recurrent.LayerNormLSTMCell(
      3, norm_epsilon=1e-4, norm_gamma_initializer="random_normal")
  again = tf_recurrent.LayerNormLSTMCell.from_config(cell.get_config())
  assert again.norm_epsilon == 1e-4
  assert isinstance(again.norm_gamma_initializer,
                    keras.initializers.RandomNormal)
  rnn = tf_recurrent.LayerNormSimpleRNNCell(3, layernorm_epsilon=1e-2,
                                            gamma_regularizer="l2")
  again = tf_recurrent.LayerNormSimpleRNNCell.from_config(rnn.get_config())
  assert again.layernorm_epsilon == 1e-2
  assert again.layernorm.gamma_regularizer is not None


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_inference_graph_matches_keras(kind):
  """A graph nothing differentiates runs the layers' inference loops (the
  ones TFLite converts): the same numbers as Keras's loop."""
  ours, theirs = layer_pair(kind)
  x, _ = layer_inputs()
  inferred = tf.function(lambda v: ours(v, training=False))(x)
  # Keras's loop (the reference) eagerly: its trace would check nothing more.
  for a, b in zip(inferred, theirs(x, training=False)):
    np.testing.assert_allclose(a, b, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize("proj_size", [0, -2, 2.5, None, True])
def test_projected_lstm_names_a_bad_proj_size(proj_size):
  with pytest.raises(ValueError, match=r"proj_size must be a positive int.*"
                     + re.escape(repr(proj_size))):
    tf_recurrent.ProjectedLSTM(4, proj_size=proj_size)


def test_projected_lstm_shapes_as_pytorch_documents():
  """`nn.LSTM(input_size=D, hidden_size=H, proj_size=P)`: outputs and h P
  wide, c H wide; weight_hh `[4H, P]`, weight_hr `[P, H]` (Keras's layout
  is their transpose)."""
  layer = tf_recurrent.ProjectedLSTM(H, proj_size=P, return_sequences=True,
                                     return_state=True)
  outputs, h, c = layer(layer_inputs()[0])
  assert (outputs.shape, h.shape, c.shape) == ((B, T, P), (B, P), (B, H))
  cell = layer.cell
  assert tuple(cell.recurrent_kernel.shape) == (P, 4 * H)
  assert tuple(cell.projection.shape) == (H, P)


@pytest.mark.parametrize("kind", ZONEOUT)
@pytest.mark.parametrize("mode", ["eager", "xla"])
def test_zoneout_training_keeps_units_at_the_rate_reproducibly(kind, mode):
  """Training: about `zoneout_h` of the units keep their previous output,
  the same ones for the same seed; inference: none (the expectation)."""
  layer_class, _, needed = LAYERS[kind]
  x = tf.random.stateless_normal([16, 40, D], seed=[1, 2])

  weights = []

  def outputs(training):  # A fresh layer: its seed generator starts over.
    layer = layer_class(8, return_sequences=True, seed=11, **needed)
    layer.build(x.shape)
    if weights:
      layer.set_weights(weights)
    weights[:] = layer.get_weights()
    call = lambda v: layer(v, training=training)
    return (call if mode == "eager" else tf.function(
        call, jit_compile=True))(x)

  def kept(out):
    return float(tf.reduce_mean(tf.cast(out[:, 1:] == out[:, :-1],
                                        tf.float32)))

  first, again = outputs(True), outputs(True)
  np.testing.assert_array_equal(first, again)
  assert abs(kept(first) - needed["zoneout_h"]) < 0.03, kept(first)
  assert kept(outputs(False)) < 0.01


@pytest.mark.parametrize("rate", [-0.1, 1.5, "0.1", True])
def test_zoneout_names_a_bad_rate(rate):
  with pytest.raises(ValueError, match=r"zoneout_c must be a float in "
                     r"\[0, 1\]; got " + re.escape(repr(rate))):
    tf_recurrent.ZoneoutLSTM(4, zoneout_c=rate)


def outputs_and_grads(kind, policy, keras_too=True):
  """Ours and Keras's loop over the cell under a dtype policy, the same
  weights: per layer, the outputs and the input and weight gradients (ours
  alone unless `keras_too`)."""
  keras.mixed_precision.set_global_policy(policy)
  try:
    x, mask = layer_inputs()
    results = []
    for layer in layer_pair(kind)[:2 if keras_too else 1]:
      with tf.GradientTape() as tape:
        tape.watch(x)
        outputs = layer(x, mask=mask)[0]
        loss = tf.reduce_sum(tf.sin(tf.cast(outputs, tf.float32)))
      results.append([outputs] + tape.gradient(
          loss, [x] + layer.trainable_variables))
    return results
  finally:
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_mixed_bfloat16_policy_is_as_precise_as_keras(kind):
  """bfloat16 compute, float32 weights: bfloat16 outputs, float32 weight
  gradients, each no further from the float32 result than Keras's loop
  over the cell is (its norms computed in float32, as Keras's)."""
  ours, theirs = outputs_and_grads(kind, "mixed_bfloat16")
  (exact,) = outputs_and_grads(kind, "float32", keras_too=False)
  assert ours[0].dtype == tf.bfloat16
  assert {g.dtype for g in ours[1:]} == {tf.float32}
  for got, keras_, want in zip(ours, theirs, exact):
    got, keras_, want = (np.asarray(tf.cast(a, tf.float32))
                         for a in (got, keras_, want))
    scale = np.abs(want).max()
    error, keras_error = (np.abs(a - want).max() for a in (got, keras_))
    assert error <= 3 * keras_error + 0.01 * scale, (error, keras_error)
    np.testing.assert_allclose(got, keras_, rtol=0.05, atol=0.05 * scale)
