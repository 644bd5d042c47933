"""tf_recurrent.RNN / LSTM / GRU against keras.layers.RNN / LSTM / GRU."""

import inspect
from typing import Union

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import pairwise, record_output_gradients
import tf_recurrent
from tf_recurrent.engine import built_in as layers_lib
from tf_recurrent.op import op as op_lib
from tf_recurrent.chunked import sequence as sequence_lib

B, T, D, H = 3, 6, 4, 5


@keras.saving.register_keras_serializable(package="tests")
class NestedStateCell(keras.layers.Layer):
  """A user cell with a nested state and an output unlike its states."""

  def __init__(self, units, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.state_size = [units, [units, 2]]
    self.output_size = 3

  def build(self, input_shape):
    self.w = self.add_weight(shape=(input_shape[-1], self.units), name="w")
    self.u = self.add_weight(shape=(self.units, self.units), name="u")
    self.out = self.add_weight(shape=(self.units, 3), name="out")
    self.built = True

  def get_initial_state(self, batch_size):
    return [tf.zeros([batch_size, self.units]),
            [tf.zeros([batch_size, self.units]), tf.zeros([batch_size, 2])]]

  def call(self, inputs, states):
    h, (c, n) = states
    h1 = tf.tanh(tf.matmul(inputs, self.w) + tf.matmul(h, self.u) + c)
    return tf.matmul(h1, self.out), [h1, [c * 0.5 + h1, n + 1.0]]

  def get_config(self):
    return {**super().get_config(), "units": self.units}


CELLS = {
    "lstm": lambda **kw: keras.layers.LSTMCell(H, **kw),
    "gru": lambda **kw: keras.layers.GRUCell(H, **kw),
    "gru_reset_before": lambda **kw: keras.layers.GRUCell(
        H, reset_after=False, **kw),
    "simple": lambda **kw: keras.layers.SimpleRNNCell(H, **kw),
    "stacked": lambda **kw: keras.layers.StackedRNNCells(
        [keras.layers.LSTMCell(H, **kw), keras.layers.GRUCell(H + 1, **kw)]),
    "list": lambda **kw: [keras.layers.SimpleRNNCell(H, **kw),
                          keras.layers.LSTMCell(H, **kw)],
    "nested": lambda **kw: NestedStateCell(H),
}


def pair(cell_name, cell_kwargs=None, recompute=False, **layer_kwargs):
  """A keras.layers.RNN and a tf_recurrent.RNN with the same weights."""
  cell_kwargs = cell_kwargs or {}
  ref = keras.layers.RNN(CELLS[cell_name](**cell_kwargs), **layer_kwargs)
  ours = tf_recurrent.RNN(CELLS[cell_name](**cell_kwargs), recompute=recompute,
                          **layer_kwargs)
  return ref, ours


def outputs_and_grads(layer, x, mode, **call_kwargs):
  def run(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = layer(x, **call_kwargs)
      loss = sum(tf.reduce_sum(tf.sin(o) * (i + 1.0))
                 for i, o in enumerate(tf.nest.flatten(out)))
    return out, tape.gradient(loss, [x] + layer.trainable_weights)
  if mode == "function":
    run = tf.function(run)
  return run(x)


def assert_close(a, b, tol=2e-5):
  for u, v in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol,
                               atol=tol)


def build_pair(ref, ours, x, **call_kwargs):
  ref(x, **call_kwargs)
  ours(x, **call_kwargs)
  ours.set_weights(ref.get_weights())


_SHARED = {}


def shared(key, make):
  """`make()`, made once per `key` in this process: the tests of one
  configuration in several modes share its built layers and Keras's
  result (the reference), instead of building and running them again."""
  if key not in _SHARED:
    _SHARED[key] = make()
  return _SHARED[key]


def seed_state(layer):
  """A copy of the layer's cell's seed generator state."""
  return tf.identity(layer.cell.seed_generator.state)


@pytest.mark.parametrize("cell_name", sorted(CELLS))
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_every_cell_matches_keras(cell_name, mode):
  def make():
    x = tf.random.normal([B, T, D], seed=1)
    ref, ours = pair(cell_name, return_sequences=True, return_state=True)
    build_pair(ref, ours, x)
    return ours, x, outputs_and_grads(ref, x, "eager")

  ours, x, want = shared(("every_cell", cell_name), make)
  assert_close(outputs_and_grads(ours, x, mode), want)


@pytest.mark.parametrize("layer_name", ["GRU", "SimpleRNN"])
@pytest.mark.parametrize("return_sequences", [False, True])
def test_last_output_alone_gives_the_loop_no_outputs_gradient(
    monkeypatch, layer_name, return_sequences):
  # The last output is the loop's final h: a model of it alone differentiates
  # no outputs, so the loop's backward pass adds none (and equals Keras's).
  seen = record_output_gradients(monkeypatch)
  x = tf.random.normal([B, T, D], seed=3)
  ref = getattr(keras.layers, layer_name)(H, return_sequences=return_sequences)
  ours = getattr(tf_recurrent, layer_name)(H,
                                            return_sequences=return_sequences)
  build_pair(ref, ours, x)
  assert_close(outputs_and_grads(ours, x, "function", training=True),
               outputs_and_grads(ref, x, "eager", training=True))
  assert seen and all(skipped != return_sequences for skipped in seen)


OPTIONS = {
    "last_output": dict(),
    "backwards": dict(go_backwards=True, return_sequences=True),
    "masked": dict(return_sequences=True, return_state=True),
    "masked_zero_output": dict(return_sequences=True, zero_output_for_mask=True,
                               return_state=True),
    "masked_backwards": dict(return_sequences=True, go_backwards=True),
    "unroll": dict(unroll=True, return_sequences=True),
}


# Cells x options x recompute, all pairs (the whole product with --full):
# recompute=True changes only the plain LSTM/GRU cells' path.
OPTION_CASES = pairwise(
    ["lstm", "gru", "simple", "stacked"], sorted(OPTIONS), [False, True],
    where=lambda cell_name, option, recompute: (
        not recompute or cell_name in ("lstm", "gru")))


@pytest.mark.parametrize("cell_name,option,recompute", OPTION_CASES)
def test_options_match_keras(cell_name, recompute, option):
  x = tf.random.normal([B, T, D], seed=2)
  ref, ours = pair(cell_name, recompute=recompute, **OPTIONS[option])
  call_kwargs = {}
  if option.startswith("masked"):
    # The first example starts masked (with a non-zero initial state),
    # the second has holes, the third is unmasked.
    call_kwargs["mask"] = tf.constant([[0, 0, 1, 1, 0, 1], [1, 0, 1, 0, 0, 1],
                                       [1] * 6]) > 0
    state_size = ref.cell.state_size
    call_kwargs["initial_state"] = tf.nest.map_structure(
        lambda s: tf.random.normal([B, s], seed=3),
        state_size if tf.nest.is_nested(state_size) else [state_size])
  build_pair(ref, ours, x, **call_kwargs)
  assert_close(outputs_and_grads(ours, x, "function", **call_kwargs),
               outputs_and_grads(ref, x, "eager", **call_kwargs))


def test_masking_and_embedding_layers_feed_the_mask():
  tokens = tf.constant([[3, 4, 0, 0, 0, 0], [5, 1, 2, 2, 1, 0]])
  embed = keras.layers.Embedding(8, D, mask_zero=True)
  ref, ours = tf_recurrent.LSTM(H, return_sequences=True), keras.layers.LSTM(
      H, return_sequences=True)
  x = embed(tokens)
  ref_out = ref(x, mask=embed.compute_mask(tokens))
  ours(x)
  ours.set_weights(ref.get_weights())
  model = keras.Sequential([embed, ours])
  np.testing.assert_allclose(model(tokens), ref_out, atol=1e-5)
  masked_model = keras.Sequential([keras.layers.Masking(0.0), ours])
  padded = tf.concat([tf.random.normal([2, 3, D]), tf.zeros([2, 3, D])], 1)
  want = keras.Sequential([keras.layers.Masking(0.0), ref])(padded)
  np.testing.assert_allclose(masked_model(padded), want, atol=1e-5)


@pytest.mark.parametrize("cell_name", ["lstm", "gru", "simple"])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_dropout_gradients_use_the_forward_masks(cell_name, mode):
  def make():  # Built and Keras's result computed once for both modes.
    x = tf.random.normal([B, T, D], seed=4)
    kwargs = dict(dropout=0.3, recurrent_dropout=0.25, seed=7)
    ref, ours = pair(cell_name, kwargs, return_sequences=True)
    build_pair(ref, ours, x)
    # Fresh seed generators: both layers now draw the same masks.
    state = seed_state(ours)
    ref.cell.seed_generator.state.assign(state)
    return ours, x, state, outputs_and_grads(ref, x, "eager", training=True)

  ours, x, state, want = shared(("dropout", cell_name), make)
  ours.cell.seed_generator.state.assign(state)
  got = outputs_and_grads(ours, x, mode, training=True)
  assert_close(got, want)
  assert not np.allclose(got[0], ours(x, training=False))


@pytest.mark.parametrize("layer_name", ["LSTM", "GRU"])
def test_input_dropout_on_the_fast_path(layer_name):
  x = tf.random.normal([B, T, D], seed=5)
  ref = getattr(keras.layers, layer_name)(H, dropout=0.4, seed=3,
                                          return_sequences=True)
  ours = getattr(tf_recurrent, layer_name)(H, dropout=0.4, seed=3,
                                           return_sequences=True)
  build_pair(ref, ours, x)
  ours.cell.seed_generator.state.assign(ref.cell.seed_generator.state)
  assert_close(outputs_and_grads(ours, x, "eager", training=True),
               outputs_and_grads(ref, x, "eager", training=True))


def test_stateful_carries_state_across_calls():
  x1, x2 = tf.random.normal([B, T, D], seed=6), tf.random.normal([B, T, D],
                                                                  seed=7)
  ref = keras.layers.GRU(H, stateful=True)
  ours = tf_recurrent.GRU(H, stateful=True)
  build_pair(ref, ours, x1)
  ref.reset_state()
  ours.reset_state()
  for x in (x1, x2):
    np.testing.assert_allclose(ours(x), ref(x), atol=1e-5)
  ours.reset_state()
  ref.reset_state()
  np.testing.assert_allclose(ours(x2), ref(x2), atol=1e-5)


def fit_model(module, layer, jit_compile):
  """A compiled model of `module`'s layer; "recompute" is an LSTM, with
  recompute=True in tf_recurrent."""
  if layer == "simple_rnn":
    rnn = module.RNN(keras.layers.SimpleRNNCell(H))
  elif layer == "recompute":
    rnn = (module.LSTM(H, recompute=True) if module is tf_recurrent
           else module.LSTM(H))
  else:
    rnn = getattr(module, layer)(H)
  m = keras.Sequential([keras.Input((T, D)), rnn, keras.layers.Dense(1)])
  m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse",
            jit_compile=jit_compile)
  return m


FIT_DATA = (np.random.default_rng(0).normal(size=[8, T, D]).astype(np.float32),
            np.random.default_rng(1).normal(size=[8, 1]).astype(np.float32))
FIT_KWARGS = dict(batch_size=4, epochs=2, verbose=0, shuffle=False)


def keras_fit(layer):
  """Keras's model's initial weights and its weights once fitted: the
  reference, fitted once per Keras layer ("recompute" is Keras's LSTM) for
  both jit_compile cases, without XLA (Keras's XLA and non-XLA fits are the
  same numbers; only random draws, absent here, differ under XLA)."""
  keras_layer = "LSTM" if layer == "recompute" else layer

  def make():
    ref = fit_model(keras.layers, keras_layer, False)
    initial = [w.copy() for w in ref.get_weights()]
    ref.fit(*FIT_DATA, **FIT_KWARGS)
    return initial, ref.get_weights()

  return shared(("fit", keras_layer), make)


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("layer", ["LSTM", "GRU", "simple_rnn", "recompute"])
def test_model_fit_matches_keras(jit_compile, layer):
  initial, want = keras_fit(layer)
  ours = fit_model(tf_recurrent, layer, jit_compile)
  ours.set_weights(initial)
  ours.fit(*FIT_DATA, **FIT_KWARGS)
  for a, b in zip(ours.get_weights(), want):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert all(not np.allclose(a, b) for a, b in zip(ours.get_weights(), initial))


@pytest.mark.parametrize("factory", [
    lambda: tf_recurrent.LSTM(H, return_sequences=True),
    lambda: tf_recurrent.LSTM(H, recompute=True),
    lambda: tf_recurrent.GRU(H, go_backwards=True),
    lambda: tf_recurrent.RNN(NestedStateCell(H)),
    lambda: tf_recurrent.RNN([keras.layers.LSTMCell(H),
                              keras.layers.GRUCell(H)]),
], ids=["lstm", "lstm_recompute", "gru", "nested", "list"])
def test_saves_and_loads_without_custom_objects(tmp_path, factory):
  x = tf.random.normal([2, T, D], seed=8)
  model = keras.Sequential([keras.Input((T, D)), factory()])
  path = str(tmp_path / "model.keras")
  model.save(path)
  loaded = keras.saving.load_model(path)
  assert type(loaded.layers[0]) is type(model.layers[0])
  assert loaded.layers[0].recompute == model.layers[0].recompute
  np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)


# (layer, variant): (its options, the sequence kind it runs, or None: the op).
FAST_PATH_VARIANTS = {
    ("LSTM", "default"): ({}, "lstm"), ("GRU", "default"): ({}, "gru"),
    ("SimpleRNN", "default"): ({}, "simple_rnn"),
    ("LSTM", "recompute"): ({"recompute": True}, "lstm"),
    ("SimpleRNN", "recompute"): ({"recompute": True}, "simple_rnn"),
    ("LSTM", "recurrent_dropout"): ({"recurrent_dropout": 0.2}, "lstm"),
    ("GRU", "reset_before"): ({"reset_after": False}, "gru_reset_before"),
    ("LSTM", "activation"): ({"recurrent_activation": "hard_sigmoid"}, None),
    ("SimpleRNN", "activation"): ({"activation": "relu"}, None),
}


# Layers x variants x masked, all pairs (the whole product with --full).
@pytest.mark.parametrize("layer_name,variant,masked", pairwise(
    ["LSTM", "GRU", "SimpleRNN"],
    ["default", "recompute", "recurrent_dropout", "reset_before",
     "activation"], [False, True],
    where=lambda layer_name, variant, masked: (
        (layer_name, variant) in FAST_PATH_VARIANTS)))
def test_fast_path_picked_automatically(monkeypatch, layer_name, variant,
                                        masked):
  """Keras's cells with their default activations run sequence.run (given
  the mask when masked), in every other configuration; others the op."""
  cell_kwargs, kind = FAST_PATH_VARIANTS[layer_name, variant]
  recurrent_calls, sequences = [], []
  original_recurrent = op_lib.recurrent
  original_run = sequence_lib.run

  def recording_recurrent(*args, **kwargs):
    recurrent_calls.append(1)
    return original_recurrent(*args, **kwargs)

  def recording_run(kind, *args, recompute=False, mask=None, **kwargs):
    sequences.append((kind, recompute, mask is not None))
    return original_run(kind, *args, recompute=recompute, mask=mask,
                        **kwargs)

  monkeypatch.setattr(op_lib, "recurrent", recording_recurrent)
  monkeypatch.setattr(sequence_lib, "run", recording_run)
  layer = getattr(tf_recurrent, layer_name)(H, **cell_kwargs)
  x = tf.random.normal([B, T, D])
  mask = tf.constant([[True] * T, [True] * (T - 2) + [False] * 2,
                      [True] * T]) if masked else None

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x, training=True, mask=mask))
    return tape.gradient(loss, layer.trainable_weights)

  assert all(g is not None for g in step(x))
  if kind is None:
    assert recurrent_calls and not sequences
  else:
    assert set(sequences) == {(kind, cell_kwargs.get("recompute", False),
                               masked)}
    assert not recurrent_calls


# The chunked loop's cases: (layer options, masked, in a Bidirectional).
CHUNKED_CASES = {
    "plain": ({}, False, False),
    "dropout": ({"dropout": 0.3, "recurrent_dropout": 0.25, "seed": 7}, True,
                False),
    "masked": ({}, True, False),
    "masked_zero_output_backwards": (
        {"zero_output_for_mask": True, "go_backwards": True}, True, False),
    "masked_bidirectional": ({}, True, True),
}
# An example starting masked with holes, a prefix (right padded), an
# all-masked (length-0) and an unmasked one.
CHUNKED_MASK = tf.constant([[0, 0, 1, 1, 0, 1], [1, 1, 1, 0, 0, 0], [0] * T,
                            [1] * T]) > 0


# The chunked layers: (class name, constructor options).
CHUNKED_LAYERS = {"LSTM": ("LSTM", {}), "GRU": ("GRU", {}),
                  "GRU_reset_before": ("GRU", {"reset_after": False}),
                  "SimpleRNN": ("SimpleRNN", {})}


CHUNKED_CASES_RUN = [
    ("plain", False), ("plain", True), ("masked", False), ("masked", True),
    ("dropout", False), ("dropout", True),
    ("masked_zero_output_backwards", True), ("masked_bidirectional", False)]


def _chunked_runs():
  """(mode, layer, case, recompute): every case of the LSTM and GRU in a
  tf.function, the plain, masked and dropout ones in every mode; the
  layers sharing their loops (whose math test_sequence.py checks in every
  mode) with dropout in every mode and plain and masked eagerly."""
  for name in sorted(CHUNKED_LAYERS):
    for case, recompute in CHUNKED_CASES_RUN:
      for mode in ("eager", "function", "xla"):
        if name in ("LSTM", "GRU"):
          keep = mode == "function" or case in ("plain", "masked", "dropout")
        else:
          keep = case == "dropout" or (mode == "eager" and
                                       case in ("plain", "masked"))
        if keep:
          yield mode, name, case, recompute


# Those runs' modes x layers x cases x recompute, all pairs (every run with
# --full); the values in the order that makes the greedy cover smallest, with
# the fewest XLA runs (18 runs, 4 compiled). The edge: an eager call whose
# forward loop earlier tests traced with the default chunk length (a build
# call records no tape, so it runs recompute=True) and whose backward loop
# this test traces with CHUNK=4: it fails unless both passes are given the
# chunk length `run` read once (it failed with that reverted).
CHUNKED_RUNS = list(_chunked_runs())
CHUNKED_PAIRS = pairwise(
    ["eager", "function", "xla"], ["GRU", "GRU_reset_before", "SimpleRNN",
                                   "LSTM"],
    ["dropout", "masked", "masked_bidirectional",
     "masked_zero_output_backwards", "plain"], [False, True],
    edges=[("eager", "LSTM", "plain", True)],
    where=lambda *run: run in CHUNKED_RUNS)


@pytest.mark.parametrize("mode,name,case,recompute", CHUNKED_PAIRS)
def test_chunked_loop_matches_keras(monkeypatch, mode, name, case, recompute):
  """Several chunks and a partial last one (T=6 in chunks of 4); masked
  from a non-zero initial state (but in a Bidirectional); input and
  recurrent dropout (per-gate masks) with the masks of Keras's seed."""
  monkeypatch.setattr(sequence_lib, "CHUNK", 4)
  options, masked, bidirectional = CHUNKED_CASES[case]
  class_name, layer_options = CHUNKED_LAYERS[name]
  options = {**options, **layer_options}
  x = tf.random.normal([4, T, D], seed=4)
  ref = getattr(keras.layers, class_name)(H, return_sequences=True,
                                           return_state=True, **options)
  ours = getattr(tf_recurrent, class_name)(
      H, return_sequences=True, return_state=True, recompute=recompute,
      **options)
  call_kwargs = {"training": True} if "dropout" in options else {}
  if bidirectional:
    ref = keras.layers.Bidirectional(ref)
    ours = keras.layers.Bidirectional(ours)
  elif masked:
    call_kwargs["initial_state"] = [tf.random.normal([4, H], seed=5 + i)
                                    for i in range(2 if name == "LSTM" else 1)]
  if masked:
    call_kwargs["mask"] = CHUNKED_MASK
  build_pair(ref, ours, x, **call_kwargs)
  if "dropout" in options:  # Fresh generators: both draw the same masks.
    ours.cell.seed_generator.state.assign(ref.cell.seed_generator.state)

  def run(layer, x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = layer(x, **call_kwargs)
      loss = sum(tf.reduce_sum(tf.sin(o) * (i + 1.0))
                 for i, o in enumerate(tf.nest.flatten(out)))
    return out, tape.gradient(loss, [x] + layer.trainable_weights)

  in_mode = lambda layer: run(layer, x) if mode == "eager" else tf.function(
      run, jit_compile=mode == "xla")(layer, x)
  got = in_mode(ours)
  # XLA draws other random numbers from the same seed (its own generator
  # algorithm): with dropout under XLA, Keras runs there too; otherwise
  # eagerly (the same draws, without a trace of the reference).
  assert_close(got, in_mode(ref) if "dropout" in options and mode == "xla"
               else run(ref, x))


def test_recompute_must_be_a_bool():
  with pytest.raises(TypeError, match="recompute must be a bool; got 'yes'"):
    tf_recurrent.LSTM(H, recompute="yes")


def test_cell_without_state_size():
  class NoState(keras.layers.Layer):
    def call(self, x, states):
      return x, states
  with pytest.raises(ValueError, match="state_size"):
    tf_recurrent.RNN(NoState())


def test_inputs_of_wrong_rank():
  with pytest.raises(ValueError, match="ndim|rank"):
    tf_recurrent.LSTM(H)(tf.ones([B, D]))


def test_mask_of_wrong_shape():
  with pytest.raises(ValueError, match=r"mask shape \(3, 5\) does not match"):
    tf_recurrent.LSTM(H)(tf.ones([B, T, D]), mask=tf.ones([B, 5], tf.bool))


def test_initial_state_of_wrong_structure():
  with pytest.raises(ValueError, match=r"initial_state must hold 2 tensor\(s\)"):
    tf_recurrent.LSTM(H)(tf.ones([B, T, D]), initial_state=[tf.zeros([B, H])])


@pytest.mark.parametrize("cell_name,recompute", [
    ("lstm", False), ("lstm", True), ("gru", False), ("simple", False)])
def test_mixed_bfloat16_policy_matches_keras(cell_name, recompute):
  """bfloat16 compute, float32 weights: outputs and float32 weight grads."""
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    x = tf.random.normal([B, T, D], seed=2)
    ref, ours = pair(cell_name, recompute=recompute, return_sequences=True)
    build_pair(ref, ours, x)
    got = outputs_and_grads(ours, x, "function")
    want = outputs_and_grads(ref, x, "eager")
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert got[0].dtype == tf.bfloat16
  assert [g.dtype for g in got[1][1:]] == [tf.float32] * len(got[1][1:])
  for u, v in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    u, v = (np.asarray(tf.cast(a, tf.float32)) for a in (u, v))
    np.testing.assert_allclose(u, v, rtol=0.05,
                               atol=0.05 * np.abs(v).max())


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_conv_lstm_mixed_precision_matches_keras(policy):
  keras.mixed_precision.set_global_policy(policy)
  try:
    x = video(2, 4, side=6)
    ref = keras.layers.ConvLSTM2D(3, 3, padding="same", return_sequences=True)
    ours = tf_recurrent.ConvLSTM2D(3, 3, padding="same",
                                   return_sequences=True)
    build_pair(ref, ours, x)
    got = outputs_and_grads(ours, x, "function")
    want = outputs_and_grads(ref, x, "eager")
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert got[0].dtype == policy.split("_")[1]
  assert [g.dtype for g in got[1][1:]] == [tf.float32] * 3
  for u, v in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    u, v = (np.asarray(tf.cast(a, tf.float32)) for a in (u, v))
    np.testing.assert_allclose(u, v, rtol=0.05,
                               atol=0.05 * np.abs(v).max())


def test_conv_lstm_saved_model_reload_keeps_values_and_gradients(tmp_path):
  """A tf.Module holding the layer, saved with its custom gradient and
  reloaded: the reloaded forward function's outputs, and a tape's gradient
  of them with respect to the reloaded variables."""
  layer = tf_recurrent.ConvLSTM3D(2, 3, padding="same", return_sequences=True)
  x = tf.random.normal([2, 3, 4, 4, 4, 2], seed=7)
  layer(x)
  module = tf.Module()
  module.layer = layer
  module.weights = layer.trainable_variables
  module.forward = tf.function(
      layer.call, input_signature=[tf.TensorSpec([None, None, 4, 4, 4, 2])])

  def loss_and_grads(forward, weights):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.sin(forward(x)))
    return loss, tape.gradient(loss, weights)

  want = loss_and_grads(module.forward, module.weights)
  tf.saved_model.save(module, str(tmp_path / "conv"), options=(
      tf.saved_model.SaveOptions(experimental_custom_gradients=True)))
  loaded = tf.saved_model.load(str(tmp_path / "conv"))
  assert_close(loss_and_grads(loaded.forward, loaded.weights), want,
               tol=1e-5)


def keras_unroll(cell_name, weights, x, compute_dtype):
  """Keras's LSTM / GRU (reset_after) equations, one step per iteration of
  a loop over the steps (a `tf.scan`).

  The float32 weights are cast to the compute dtype inside every step, so
  autodiff sums their per-step gradients in float32 (a while loop's
  gradient accumulates a captured tensor's in that tensor's dtype): what a
  drop-in must match under a mixed-precision policy. Returns the outputs
  `[B, T, H]`.
  """
  kernel, recurrent_kernel, bias = weights
  x = tf.cast(x, compute_dtype)
  batch, units = x.shape[0], recurrent_kernel.shape[0]

  def step(state, x_t):
    h, c = state
    w, u, b = (tf.cast(v, compute_dtype) for v in
               (kernel, recurrent_kernel, bias))
    if cell_name == "lstm":
      z = x_t @ w + h @ u + b
      zi, zf, zc, zo = tf.split(z, 4, axis=-1)
      c = tf.sigmoid(zf) * c + tf.sigmoid(zi) * tf.tanh(zc)
      h = tf.sigmoid(zo) * tf.tanh(c)
    else:
      xz, xr, xh = tf.split(x_t @ w + b[0], 3, axis=-1)
      rz, rr, rh = tf.split(h @ u + b[1], 3, axis=-1)
      z, r = tf.sigmoid(xz + rz), tf.sigmoid(xr + rr)
      h = z * h + (1.0 - z) * tf.tanh(xh + r * rh)
    return h, c

  zeros = tf.zeros([batch, units], compute_dtype)
  outputs, _ = tf.scan(step, tf.transpose(x, [1, 0, 2]),
                       initializer=(zeros, zeros))
  return tf.transpose(outputs, [1, 0, 2])


@tf.function(autograph=False)
def keras_unroll_weight_grads(cell_name, weights, x):
  """The unroll's weights' gradients of its bfloat16 outputs' sum."""
  with tf.GradientTape() as tape:
    tape.watch(weights)
    loss = tf.reduce_sum(tf.cast(
        keras_unroll(cell_name, weights, x, tf.bfloat16), tf.float32))
  return tape.gradient(loss, weights)


@pytest.mark.parametrize("cell_name", ["lstm", "gru"])
@pytest.mark.parametrize("recompute", [False, True])
def test_mixed_bfloat16_weight_gradients_sum_in_float32(cell_name,
                                                        recompute):
  """Issue 19: at T=1024 the weights' gradients are summed over the steps in
  float32, as an unroll with per-step casts sums them (computed once per
  cell, for the weights both recompute cases then take)."""
  batch, steps, dim, units = 4, 1024, 3, 4
  x = tf.random.stateless_uniform([batch, steps, dim], seed=[3, 4],
                                  minval=0.5, maxval=1.0)
  layer_cls = tf_recurrent.LSTM if cell_name == "lstm" else tf_recurrent.GRU
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    layer = layer_cls(units, return_sequences=True, recompute=recompute)
    layer.build((batch, steps, dim))
    # This cell's first layer's initial weights, for both recompute cases.
    weights = shared(("bfloat16_weights", cell_name), lambda: [
        tf.constant(w) for w in layer.get_weights()])
    layer.set_weights(weights)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.cast(layer(x), tf.float32))
    got = tape.gradient(loss, layer.trainable_weights)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert [w.dtype for w in layer.get_weights()] == [np.float32] * 3
  want = shared(("bfloat16_sum", cell_name),
                lambda: keras_unroll_weight_grads(cell_name, weights, x))
  for name, g, w in zip(("kernel", "recurrent_kernel", "bias"), got, want):
    assert g.dtype == tf.float32, name
    scale = np.abs(w).max()
    error = np.abs(np.asarray(g) - np.asarray(w)).max() / scale
    assert error < 0.005, (name, error)


KERAS_PAIRS = [(tf_recurrent.RNN, keras.layers.RNN),
               (tf_recurrent.LSTM, keras.layers.LSTM),
               (tf_recurrent.GRU, keras.layers.GRU),
               (tf_recurrent.SimpleRNN, keras.layers.SimpleRNN),
               (tf_recurrent.ConvLSTM2D, keras.layers.ConvLSTM2D)]


@pytest.mark.parametrize("ours,theirs", KERAS_PAIRS,
                         ids=[p[0].__name__ for p in KERAS_PAIRS])
def test_signature_is_keras_own_plus_recompute(ours, theirs):
  """Keras's parameters, names, kinds and defaults; recompute (and for RNN,
  whose any cell may run on the op, xla_steps) keyword-only before
  **kwargs."""
  want = list(inspect.signature(theirs.__init__).parameters.values())
  got = list(inspect.signature(ours.__init__).parameters.values())
  ours_only = [inspect.Parameter("recompute", inspect.Parameter.KEYWORD_ONLY,
                                 default=False, annotation=bool)]
  if ours is tf_recurrent.RNN:
    ours_only.append(inspect.Parameter(
        "xla_steps", inspect.Parameter.KEYWORD_ONLY, default="auto",
        annotation=Union[str, bool]))
  assert got == want[:-1] + ours_only + [want[-1]]


def revived_matches(layer):
  revived = type(layer).from_config(layer.get_config())
  return set(dir(layer)) == set(dir(revived))


@pytest.mark.parametrize("make", [
    lambda: tf_recurrent.RNN(cell=keras.layers.SimpleRNNCell(3)),
    lambda: tf_recurrent.LSTM(4, recompute=True),
    lambda: tf_recurrent.GRU(4, go_backwards=True),
    lambda: tf_recurrent.SimpleRNN(4, return_sequences=True),
    lambda: tf_recurrent.ConvLSTM2D(2, 3, padding="same"),
], ids=["rnn", "lstm", "gru", "simple_rnn", "conv_lstm"])
def test_from_config_revives_the_same_layer(make):
  """Keras's RNNTest.test_basics: a revived layer has the same attributes."""
  layer = make()
  assert not hasattr(layer, "_auto_config_error_args")
  assert revived_matches(layer)
  # As keras.layers.RNN does for its own.
  assert revived_matches(keras.layers.RNN(cell=keras.layers.SimpleRNNCell(3)))


# Keras's use_cudnn contract: accepted and kept; True hands the call to
# Keras's own cuDNN kernel, or raises Keras's own error where that cannot run.
CUDNN_CALLS = [
    ("LSTM", {}, {}),
    ("GRU", {}, {}),
    ("LSTM", {"recurrent_dropout": 0.2, "seed": 1}, {"training": True}),
    ("GRU", {"recurrent_dropout": 0.2, "seed": 1}, {"training": True}),
    ("LSTM", {"activation": "relu"}, {}),
    ("LSTM", {"use_bias": False}, {}),
    ("GRU", {"reset_after": False}, {}),
    ("GRU", {"unroll": True}, {}),
]


@pytest.mark.parametrize("name,options,call_kwargs", CUDNN_CALLS)
def test_use_cudnn_true_calls_as_keras_does(name, options, call_kwargs):
  """Construction accepts it; a call raises what Keras's raises (type and
  message) where cuDNN cannot run (every call on a machine without a GPU),
  and computes what Keras's cuDNN kernel computes where it can."""
  x = tf.random.normal([B, T, D], seed=4)
  ref = getattr(keras.layers, name)(H, use_cudnn=True, **options)
  ours = getattr(tf_recurrent, name)(H, use_cudnn=True, **options)
  assert ours.use_cudnn is True
  ref.build(x.shape)
  ours.build(x.shape)
  ours.set_weights(ref.get_weights())
  try:
    want = ref(x, **call_kwargs)
  except ValueError as e:
    with pytest.raises(ValueError) as got:
      ours(x, **call_kwargs)
    assert str(got.value) == str(e)
    assert "use_cudnn=True was specified" in str(e)
  else:
    assert tf.config.list_physical_devices("GPU"), "Keras ran without cuDNN"
    assert_close(ours(x, **call_kwargs), want)


def fake_cudnn_kernel(monkeypatch, name):
  """Stands in for Keras's cuDNN kernel (`backend.lstm` / `backend.gru`), as
  on a machine with a GPU: records its calls, returns sevens."""
  calls = []

  def kernel(inputs, *args, **kwargs):
    del args
    calls.append(kwargs)
    last = tf.fill([tf.shape(inputs)[0], H], 7.0)
    sequence = tf.fill([tf.shape(inputs)[0], tf.shape(inputs)[1], H], 7.0)
    return last, sequence, [last] * (2 if name == "LSTM" else 1)

  monkeypatch.setattr(layers_lib.keras_backend, "cudnn_ok",
                      lambda *args, **kwargs: True)
  monkeypatch.setattr(layers_lib.keras_backend, name.lower(), kernel)
  return calls


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_use_cudnn_true_hands_the_call_to_keras_cudnn_kernel(monkeypatch, name):
  """True runs Keras's kernel (and, like Keras, turns XLA off for the model);
  "auto" and False run tf_recurrent's loop, which XLA compiles."""
  calls = fake_cudnn_kernel(monkeypatch, name)
  assert not getattr(keras.layers, name)(H).supports_jit  # A GPU, to Keras.
  x = tf.random.normal([B, T, D], seed=5)
  cudnn = getattr(tf_recurrent, name)(H, use_cudnn=True, return_sequences=True)
  np.testing.assert_array_equal(cudnn(x), np.full([B, T, H], 7.0))
  assert calls and calls[0]["kernel"] is cudnn.cell.kernel
  assert not cudnn.supports_jit
  del calls[:]
  for use_cudnn in ("auto", False):
    ref = getattr(keras.layers, name)(H, use_cudnn=False)
    ours = getattr(tf_recurrent, name)(H, use_cudnn=use_cudnn)
    assert ours.supports_jit
    build_pair(ref, ours, x)
    assert_close(ours(x), ref(x))
  assert not calls


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
@pytest.mark.parametrize("use_cudnn", [True, False, "auto"])
def test_use_cudnn_survives_config_saving_and_bidirectional(tmp_path, name,
                                                            use_cudnn):
  layer = getattr(tf_recurrent, name)(H, use_cudnn=use_cudnn, recompute=True)
  config = layer.get_config()
  assert config["use_cudnn"] == use_cudnn
  assert type(layer).from_config(config).use_cudnn == use_cudnn
  model = keras.Sequential([keras.Input((None, D)), layer])
  path = str(tmp_path / "model.keras")
  model.save(path)
  loaded = keras.saving.load_model(path).layers[0]
  assert type(loaded) is type(layer) and loaded.use_cudnn == use_cudnn
  bidirectional = keras.layers.Bidirectional(layer)
  for each in (bidirectional.forward_layer, bidirectional.backward_layer):
    assert type(each) is type(layer)
    assert each.use_cudnn == use_cudnn and each.recompute
  try:
    bidirectional(tf.ones([B, T, D]))
  except ValueError as e:  # Keras's own, at the call, without a GPU.
    assert use_cudnn is True and "use_cudnn=True was specified" in str(e)
  else:
    assert use_cudnn is not True or tf.config.list_physical_devices("GPU")


def video(batch, frames, side=8, channels=3, seed=10):
  return tf.random.normal([batch, frames, side, side, channels], seed=seed)


# Keras layer name -> (constructor arguments, an input); each with options.
LAYER_CASES = {
    "SimpleRNN": ((H,), tf.random.normal([B, T, D], seed=9)),
    "ConvLSTM2D": ((3, 3), video(2, 4)),
    "ConvLSTM1D": ((3, 3), tf.random.normal([2, 4, 8, 3], seed=11)),
    "ConvLSTM3D": ((2, 3), tf.random.normal([2, 3, 4, 5, 4, 2], seed=12)),
}
LAYER_OPTIONS = [
    ("SimpleRNN", {"return_sequences": True, "return_state": True}),
    ("SimpleRNN", {"go_backwards": True}),
    ("SimpleRNN", {"dropout": 0.3, "seed": 2}),
    ("ConvLSTM2D", {"return_sequences": True, "return_state": True,
                    "padding": "same"}),
    ("ConvLSTM2D", {"go_backwards": True, "strides": 2}),
    ("ConvLSTM2D", {"dropout": 0.2, "recurrent_dropout": 0.2, "seed": 3,
                    "padding": "same"}),
    ("ConvLSTM2D", {"recompute": True, "dilation_rate": 2}),
    ("ConvLSTM1D", {"return_sequences": True, "padding": "same",
                    "dilation_rate": 2}),
    ("ConvLSTM1D", {"go_backwards": True, "strides": 2, "dropout": 0.3,
                    "seed": 4}),
    ("ConvLSTM3D", {"return_state": True, "padding": "same"}),
    ("ConvLSTM3D", {"strides": 2, "recurrent_dropout": 0.3, "seed": 5}),
]


# The options LAYER_OPTIONS sets (besides seeds); an entry's options as
# values of those axes: (layer, whether each is set).
LAYER_OPTION_KEYS = sorted({k for _, options in LAYER_OPTIONS
                            for k in options} - {"seed"})
LAYER_OPTION_VALUES = [(name,) + tuple(k in options for k in LAYER_OPTION_KEYS)
                       for name, options in LAYER_OPTIONS]
# Layers x each option set or not x modes, all pairs of the entries (every
# entry in both modes with --full): each mode runs every layer and every
# option (and its absence).
LAYER_RUNS = [(case[-1],) + LAYER_OPTIONS[LAYER_OPTION_VALUES.index(case[:-1])]
              for case in pairwise(
                  list(LAYER_CASES),
                  *[[False, True]] * len(LAYER_OPTION_KEYS),
                  ["eager", "function"],
                  where=lambda *case: case[:-1] in LAYER_OPTION_VALUES)]


@pytest.mark.parametrize(
    "mode,name,options", LAYER_RUNS,
    ids=[f"{name}-options{LAYER_OPTIONS.index((name, options))}-{mode}"
         for mode, name, options in LAYER_RUNS])
def test_layer_matches_keras(mode, name, options):
  training = "dropout" in options

  def make():  # Built and Keras's result computed once for both modes.
    args, x = LAYER_CASES[name]
    ref = getattr(keras.layers, name)(
        *args, **{k: v for k, v in options.items() if k != "recompute"})
    ours = getattr(tf_recurrent, name)(*args, **options)
    build_pair(ref, ours, x)
    state = seed_state(ref) if training else None
    return ours, x, state, outputs_and_grads(ref, x, "eager",
                                             training=training)

  ours, x, state, want = shared(
      ("layer", LAYER_OPTIONS.index((name, options))), make)
  if training:  # Both layers draw the same dropout masks.
    ours.cell.seed_generator.state.assign(state)
  assert_close(outputs_and_grads(ours, x, mode, training=training), want)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_conv_lstm_channels_first_and_masked(mode, rank):
  """channels_first (which Keras's CPU convolutions refuse) against Keras
  channels last on the transposed frames, with a padding mask."""
  shape = [2, 5] + [4] * rank + [3]
  to_first = [0, 1, rank + 2] + list(range(2, rank + 2))
  to_last = [0, 1] + list(range(3, rank + 3)) + [2]
  mask = tf.constant([[True, True, False, True, False], [False] * 5])
  options = dict(padding="same", return_sequences=True, return_state=True)

  def make():  # Built and Keras's result computed once for both modes.
    x_last = tf.random.normal(shape, seed=rank)
    x_first = tf.transpose(x_last, to_first)
    ref = getattr(keras.layers, f"ConvLSTM{rank}D")(2, 3, **options)
    ours = getattr(tf_recurrent, f"ConvLSTM{rank}D")(
        2, 3, data_format="channels_first", **options)
    ref(x_last)
    ours(x_first)
    ours.set_weights(ref.get_weights())
    return ours, x_first, outputs_and_grads(ref, x_last, "function",
                                            mask=mask)

  ours, x_first, want = shared(("channels_first", rank), make)
  got = outputs_and_grads(ours, x_first, mode, mask=mask)
  (sequences, h, c), (dx, *dw) = got
  state_to_last = [0] + list(range(2, rank + 2)) + [1]
  assert_close(((tf.transpose(sequences, to_last),
                 tf.transpose(h, state_to_last),
                 tf.transpose(c, state_to_last)),
                (tf.transpose(dx, to_last), *dw)), want)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_conv_lstm_bad_inputs_get_clear_errors(rank):
  """A frame of the wrong rank, and a kernel larger than the frame with
  padding="valid": errors at the call naming what was expected."""
  layer = getattr(tf_recurrent, f"ConvLSTM{rank}D")
  with pytest.raises(ValueError, match=rf"expected ndim={rank + 3}, found "
                     rf"ndim={rank + 2}"):
    layer(2, 3)(tf.ones([2, 3] + [6] * (rank - 1) + [2]))
  # Keras's own words: "zero or negative" in 3.15, "negative" in 3.8.
  with pytest.raises(ValueError, match=r"output size would be (zero or )?"
                     r"negative"):
    layer(2, 5)(tf.ones([2, 3] + [3] * rank + [2]))


def test_conv_lstm_2d_runs_the_chunked_loops_and_round_trips(tmp_path):
  """The ConvLSTM cell runs on the chunked loops (they trace once for this
  layer's frames), not the op's generic loop; a .keras file loads back."""
  model = keras.Sequential([keras.Input((None, 8, 8, 3)),
                            tf_recurrent.ConvLSTM2D(4, 3, padding="same")])
  path = str(tmp_path / "conv.keras")
  model.save(path)
  loaded = keras.saving.load_model(path)
  assert type(loaded.layers[0]) is tf_recurrent.ConvLSTM2D
  x = video(2, 5)
  np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)

  @tf.function
  def grads(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(x))
    return tape.gradient(loss, model.trainable_weights)

  traces = sequence_lib.tracing_count()
  grads(x)
  assert sequence_lib.tracing_count() == traces + 2  # Forward and backward.


# Behaviours of the built-in layers, each on every path that serves it.

LAYER_PATHS = [("LSTM", {}), ("LSTM", {"recompute": True}), ("GRU", {}),
               ("GRU", {"reset_after": False}), ("SimpleRNN", {})]
# The paths' options, by name: a path is a (layer name, options name).
PATH_OPTIONS = {"default": {}, "recompute": {"recompute": True},
                "reset_before": {"reset_after": False}}


def keras_and_ours(name, x, options, **layer_kwargs):
  """keras.layers.<name> and tf_recurrent.<name> with the same weights."""
  ref = getattr(keras.layers, name)(
      H, **{k: v for k, v in options.items() if k != "recompute"},
      **layer_kwargs)
  ours = getattr(tf_recurrent, name)(H, **options, **layer_kwargs)
  build_pair(ref, ours, x)
  return ref, ours


ACTIVATIONS = {"relu": {"activation": "relu"},
               "hard_sigmoid": {"recurrent_activation": "hard_sigmoid"},
               "both": {"activation": "softsign",
                        "recurrent_activation": "tanh"}}


# Layers x paths x activations, all pairs (the whole product with --full).
@pytest.mark.parametrize("name,path,activations", pairwise(
    ["LSTM", "GRU", "SimpleRNN"], list(PATH_OPTIONS), list(ACTIVATIONS),
    where=lambda name, path, activations: (
        (name, PATH_OPTIONS[path]) in LAYER_PATHS)))
def test_non_default_activations_match_keras(name, path, activations):
  options, activations = PATH_OPTIONS[path], ACTIVATIONS[activations]
  if name == "SimpleRNN" and "recurrent_activation" in activations:
    activations = {"activation": activations.get("activation", "elu")}
  x = tf.random.normal([B, T, D], seed=11)
  ref, ours = keras_and_ours(name, x, options, return_sequences=True,
                             **activations)
  assert_close(outputs_and_grads(ours, x, "function"),
               outputs_and_grads(ref, x, "eager"))


# Layers x paths x zero_output_for_mask, all pairs (the whole product with
# --full).
@pytest.mark.parametrize("name,path,zero_output_for_mask", pairwise(
    ["LSTM", "GRU", "SimpleRNN"], list(PATH_OPTIONS), [False, True],
    where=lambda name, path, zero_output_for_mask: (
        (name, PATH_OPTIONS[path]) in LAYER_PATHS)))
def test_masked_last_output_is_the_last_emitted_one(name, path,
                                                    zero_output_for_mask):
  """Examples ending masked, with a hole, fully masked, unmasked: the last
  output (and state) is what Keras returns for each."""
  options = PATH_OPTIONS[path]
  x = tf.random.normal([4, T, D], seed=12)
  mask = tf.constant([[1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 0, 1],
                      [0] * T, [1] * T]) > 0
  ref, ours = keras_and_ours(name, x, options, return_state=True,
                             zero_output_for_mask=zero_output_for_mask)
  got = outputs_and_grads(ours, x, "function", mask=mask)
  want = outputs_and_grads(ref, x, "eager", mask=mask)
  assert_close(got, want)
  # A fully masked example keeps its initial (zero) state as its output.
  np.testing.assert_array_equal(got[0][0][2], np.zeros([H]))


@pytest.mark.parametrize("name,options", LAYER_PATHS)
def test_input_dropout_only_when_training(name, options):
  x = tf.random.normal([B, T, D], seed=13)
  _, plain = keras_and_ours(name, x, options, return_sequences=True)
  _, dropping = keras_and_ours(name, x, options, return_sequences=True,
                               dropout=0.5, seed=4)
  dropping.set_weights(plain.get_weights())
  want = plain(x)
  for training in (None, False):
    np.testing.assert_array_equal(dropping(x, training=training), want)
  assert not np.allclose(dropping(x, training=True), want)
