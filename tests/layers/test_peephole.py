"""The peephole LSTM: its chunked loops against a float64 unroll, and the
Keras layer against Keras's own loop running `PeepholeLSTMCell`.

Chunks are 3 steps long (T=7: 3 + 3 + 1), as in test_sequence.py.
"""

import functools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from conftest import GRAPH_MODES
from conftest import loop_values_and_grads
from conftest import pairwise
from conftest import values_and_grads
import tf_recurrent
from tf_recurrent.chunked import sequence

B, D, H, T = 2, 3, 4, 7


@pytest.fixture(autouse=True)
def short_chunks(monkeypatch):
  monkeypatch.setattr(sequence, "CHUNK", 3)


def linear(a, kernel, masks):
  """`a @ kernel`, gate g's column block reading `a * masks[g]`."""
  if masks is None:
    return a @ kernel
  return tf.concat([(a * masks[g]) @ k for g, k in
                    enumerate(tf.split(kernel, 4, axis=-1))], axis=-1)


def unrolled(x, state0, w, mask=None, dropout=None):
  """The equations, step by step (Keras gate order [i, f, c, o]); a masked
  step carries h and c."""
  dropout = dropout or {}
  h, c = state0
  p_i, p_f, p_o = tf.unstack(w["peephole"])
  outputs = []
  for t in range(x.shape[0]):
    z = (linear(x[t], w["kernel"], dropout.get("inputs")) + w["bias"] +
         linear(h, w["recurrent_kernel"], dropout.get("recurrent")))
    zi, zf, zg, zo = tf.split(z, 4, axis=-1)
    i = tf.sigmoid(zi + p_i * c)
    f = tf.sigmoid(zf + p_f * c)
    c1 = f * c + i * tf.tanh(zg)
    o = tf.sigmoid(zo + p_o * c1)
    h1 = o * tf.tanh(c1)
    if mask is not None:
      h1 = tf.where(mask[t][:, None], h1, h)
      c1 = tf.where(mask[t][:, None], c1, c)
    h, c = h1, c1
    outputs.append(h)
  return tf.stack(outputs), [h, c]


# Per example, a `[T]` pattern: holes (one across the chunk boundary 2|3)
# and an all-masked example.
HOLES = ("1100101", "0000000")


def holes():
  rows = [[ch == "1" for ch in pattern] for pattern in HOLES]
  return tf.constant(np.array(rows).T)


def case(dtype=tf.float64, seed=0):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: tf.constant(rng.normal(size=shape), dtype)
  w = {"kernel": normal(D, 4 * H), "bias": normal(4 * H),
       "recurrent_kernel": normal(H, 4 * H) * 0.5,
       "peephole": normal(3, H)}
  return normal(T, B, D), [normal(B, H), normal(B, H)], w


def dropout_masks(seed=3, dtype=tf.float64):
  rng = np.random.default_rng(seed)
  keep = lambda width: tf.constant(
      (rng.random([4, B, width]) < 0.7) / 0.7, dtype)
  return {"inputs": keep(D), "recurrent": keep(H)}


def loss_of(outputs, final):
  loss = tf.reduce_sum(tf.sin(outputs) * tf.cast(
      tf.range(1, tf.shape(outputs)[0] + 1), outputs.dtype)[:, None, None])
  return loss + sum((i + 2.0) * tf.reduce_sum(tf.cos(f))
                    for i, f in enumerate(final))


def loop_inputs(masked, dropped, dtype):
  def make():
    x, state0, w = tf.nest.map_structure(lambda t: tf.cast(t, dtype),
                                         case())
    return (x, state0, w), (holes() if masked else None,
                            dropout_masks(dtype=dtype) if dropped else None)
  return make


@functools.lru_cache(maxsize=None)
def unrolled_reference(masked, dropped):
  """The float64 unroll's values and gradients, shared by every mode,
  recompute choice and dtype of ours."""
  return loop_values_and_grads("eager", loop_inputs(masked, dropped,
                                                    tf.float64),
                               unrolled, loss_of)


def run_both(mode, recompute, masked, dropped, dtype=tf.float64):
  ours = loop_values_and_grads(
      mode, loop_inputs(masked, dropped, dtype),
      lambda x, s, w, m, d: sequence.run("peephole_lstm", x, s, w,
                                         recompute=recompute, mask=m,
                                         dropout=d), loss_of)
  return ours, unrolled_reference(masked, dropped)


def assert_close(ours, want, tol):
  for got, expected in zip(tf.nest.flatten(ours), tf.nest.flatten(want)):
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


# Modes x recompute x inputs: all pairs (the whole product with --full).
# Dropout unmasked: with the holes the second example is all masked and its
# dropout masks would go unchecked.
INPUTS = {"plain": (False, False), "holes": (True, False),
          "dropout": (False, True)}


@pytest.mark.parametrize("mode,recompute,inputs", pairwise(
    GRAPH_MODES, [False, True], list(INPUTS)),
                         ids=lambda v: {False: "keep_gates",
                                        True: "recompute"}.get(v))
def test_matches_float64_unroll(mode, recompute, inputs):
  ours, want = run_both(mode, recompute, *INPUTS[inputs])
  assert_close(ours, want, 1e-10)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("recompute", [False, True],
                         ids=["keep_gates", "recompute"])
def test_fused_float32_gradient_matches_float64(mode, recompute):
  """The TF executor's fused `LSTMBlockCellGrad` (peepholes) in float32."""
  ours, want = run_both(mode, recompute, True, False, dtype=tf.float32)
  assert_close(ours, want, 2e-5)


def keras_weights(seed=5):
  """Random weights in Keras 2's layout for a built cell of D inputs: kernel,
  recurrent kernel, bias, then the input, forget and output gates'
  peephole weights."""
  rng = np.random.default_rng(seed)
  return [rng.normal(size=s).astype(np.float32) * 0.5
          for s in ([D, 4 * H], [H, 4 * H], [4 * H], [H], [H], [H])]


def layer_pair(**cell_kwargs):
  """`tf_recurrent.PeepholeLSTM` and Keras's own loop over the same cell
  class, with the same weights."""
  ours = tf_recurrent.PeepholeLSTM(H, return_sequences=True,
                                   return_state=True, **cell_kwargs)
  theirs = keras.layers.RNN(tf_recurrent.PeepholeLSTMCell(H, **cell_kwargs),
                            return_sequences=True, return_state=True)
  for layer in (ours, theirs):
    layer.build((B, T, D))
    layer.set_weights(keras_weights())
  return ours, theirs


def layer_inputs():
  rng = np.random.default_rng(6)
  x = tf.constant(rng.normal(size=[B, T, D]), tf.float32)
  return x, tf.transpose(holes())  # Keras's [B, T] mask.


def test_layer_runs_the_chunked_loop(monkeypatch):
  """The layer's cell is a built-in: its loop is sequence.run's."""
  kinds = []
  real_run = sequence.run
  monkeypatch.setattr(sequence, "run",
                      lambda kind, *a, **k: kinds.append(kind) or
                      real_run(kind, *a, **k))
  ours, _ = layer_pair()
  ours(layer_inputs()[0])
  assert kinds == ["peephole_lstm"]


def layer_run(layer, masked):
  """`values_and_grads`'s `build` of the layer's training call."""
  x, mask = layer_inputs()

  def run(watch):
    watch(x)
    outputs, h, c = layer(x, mask=mask if masked else None, training=True)
    values = [outputs, h, c]
    loss = sum(tf.reduce_sum(tf.sin(v) * (k + 1.0))
               for k, v in enumerate(values))
    return values, loss, [x] + layer.trainable_variables
  return run


_KERAS_RESULTS = {}


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("masked,cell_kwargs", [
    (False, {}), (True, {}),
    # Same seed: the same per-gate masks drawn by both (implementation=1);
    # unmasked, so that both examples' masks count.
    (False, {"dropout": 0.3, "recurrent_dropout": 0.3, "seed": 7})],
                         ids=["plain", "holes", "dropout"])
def test_layer_matches_keras_rnn_of_cell(mode, masked, cell_kwargs):
  ours, theirs = layer_pair(**cell_kwargs)
  got = values_and_grads(mode, layer_run(ours, masked))
  # Keras's loop (the reference): the same weights and draws (fresh seed
  # generators) in every mode, run eagerly once per case.
  key = (masked, tuple(sorted(cell_kwargs.items())))
  if key not in _KERAS_RESULTS:
    _KERAS_RESULTS[key] = values_and_grads("eager", layer_run(theirs, masked))
  want = _KERAS_RESULTS[key]
  assert len(got[1]) == 7  # x, kernel, recurrent kernel, bias, 3 peepholes.
  assert all(np.abs(g).max() > 1e-3 for g in want[1] + got[1])
  assert_close(got, want, 2e-5)


def test_keras_save_and_load(tmp_path):
  x, mask = layer_inputs()
  inputs = keras.Input((T, D))
  outputs = tf_recurrent.PeepholeLSTM(
      H, return_sequences=True, recompute=True,
      peephole_initializer="random_normal")(inputs)
  model = keras.Model(inputs, outputs)
  path = os.path.join(tmp_path, "model.keras")
  model.save(path)
  loaded = keras.models.load_model(path)
  layer = loaded.layers[-1]
  assert isinstance(layer, tf_recurrent.PeepholeLSTM)
  assert isinstance(layer.cell, tf_recurrent.PeepholeLSTMCell)
  assert layer.recompute
  assert layer.get_config() == model.layers[-1].get_config()
  np.testing.assert_allclose(loaded(x), model(x), rtol=1e-6, atol=1e-6)
  del mask


class Keras2PeepholeLSTMCell(tf_keras.layers.LSTMCell):
  """Keras 2's `tf.keras.experimental.PeepholeLSTMCell` (which tf_keras no
  longer ships): its three `[units]` peephole weights and its math
  (`implementation=2`)."""

  def build(self, input_shape):
    super().build(input_shape)
    for gate in ("input_gate", "forget_gate", "output_gate"):
      setattr(self, f"{gate}_peephole_weights", self.add_weight(
          shape=(self.units,), name=f"{gate}_peephole_weights",
          initializer=self.kernel_initializer))

  def _compute_carry_and_output_fused(self, z, c_tm1):
    z0, z1, z2, z3 = z
    i = self.recurrent_activation(z0 + self.input_gate_peephole_weights *
                                  c_tm1)
    f = self.recurrent_activation(z1 + self.forget_gate_peephole_weights *
                                  c_tm1)
    c = f * c_tm1 + i * self.activation(z2)
    o = self.recurrent_activation(z3 + self.output_gate_peephole_weights * c)
    return c, o


def test_keras2_layout_loads(tmp_path):
  """A Keras 2 model's weights load: set_weights(its get_weights()), its .h5
  file, and the earlier one-[3, units] layout (issue 49)."""
  x = layer_inputs()[0].numpy()
  old = tf_keras.Sequential([tf_keras.layers.RNN(
      Keras2PeepholeLSTMCell(H, implementation=2), return_sequences=True)])
  old.build((None, T, D))
  old.set_weights(keras_weights())
  assert [w.name.split("/")[-1].split(":")[0] for w in old.weights][3:] == [
      "input_gate_peephole_weights", "forget_gate_peephole_weights",
      "output_gate_peephole_weights"]
  want = old(x).numpy()
  path = str(tmp_path / "keras2.h5")
  old.save_weights(path)

  def ours():
    model = keras.Sequential([keras.Input((T, D)), tf_recurrent.PeepholeLSTM(
        H, return_sequences=True)])
    return model

  by_weights, by_file = ours(), ours()
  by_weights.set_weights(old.get_weights())
  by_file.load_weights(path)
  one_weight = ours()
  k, u, b, p_i, p_f, p_o = keras_weights()
  one_weight.layers[-1].set_weights([k, u, b, np.stack([p_i, p_f, p_o])])
  for model in (by_weights, by_file, one_weight):
    np.testing.assert_allclose(model(x), want, rtol=1e-5, atol=1e-5)
