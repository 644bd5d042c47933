"""Keras 3 saving of `AttentionWrapper` and the mechanisms: `model.save(
"x.keras")` and `keras.models.load_model` without `custom_objects` give a
model computing the same outputs.

The memory is a tensor set up at run time, not config: each model with a
wrapper here sets its mechanisms' memory up in a layer's (or the model's)
`call`, as a Keras 3 model must (a layer cannot hold another layer's
symbolic output). A mechanism queried in a functional model itself takes
the encoder's symbolic output at construction, as in Addons (its Keras call
carries the memory: `test_functional_memory_*`). The wrapper's config holds
its cell, its mechanisms (their own configs, memory None), the attention
layer sizes or layers, `alignment_history`, `output_attention` and its
functions.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent import seq2seq

BATCH, SOURCE_STEPS, TARGET_STEPS, VOCAB = 2, 5, 4, 11
UNITS, TARGET_DEPTH = 6, 3


@keras.saving.register_keras_serializable(package="tf_recurrent_tests")
class AttendOver(keras.layers.Layer):
  """A recurrent layer around an AttentionWrapper, its memory set up in call.

  `inputs` is `[decoder inputs, memory]`, or one tensor that is both (the
  decoder attends over its own inputs: a one-input model, Sequential).
  """

  def __init__(self, rnn, **kwargs):
    super().__init__(**kwargs)
    self.rnn = rnn

  def call(self, inputs):
    x, memory = inputs if isinstance(inputs, (list, tuple)) else (inputs,
                                                                   inputs)
    for mechanism in self.rnn.cell.attention_mechanisms:
      mechanism.setup_memory(memory)
    return self.rnn(x)

  def get_config(self):
    return {**super().get_config(),
            "rnn": keras.saving.serialize_keras_object(self.rnn)}

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    config["rnn"] = keras.saving.deserialize_keras_object(config["rnn"])
    return cls(**config)


@keras.saving.register_keras_serializable(package="tf_recurrent_tests")
def halved_inputs(inputs, attention):
  return tf.concat([inputs * 0.5, attention], -1)


def mechanisms(kind):
  """A fresh mechanism (memory None) of a kind, or all four kinds."""
  make = {
      "luong": lambda: seq2seq.LuongAttention(UNITS, scale=True),
      "bahdanau": lambda: seq2seq.BahdanauAttention(4, normalize=True),
      "luong_monotonic": lambda: seq2seq.LuongMonotonicAttention(
          UNITS, scale=True, score_bias_init=-1.0),
      "bahdanau_monotonic": lambda: seq2seq.BahdanauMonotonicAttention(
          4, normalize=True, score_bias_init=0.5, mode="hard"),
  }
  if kind == "several":
    return [make[name]() for name in KINDS[:4]]
  return make[kind]()


def data():
  rng = np.random.default_rng(3)
  source = rng.integers(1, VOCAB, [BATCH, SOURCE_STEPS]).astype(np.int32)
  target = rng.normal(size=[BATCH, TARGET_STEPS, TARGET_DEPTH]).astype(
      np.float32)
  return source, target


KINDS = ["luong", "bahdanau", "luong_monotonic", "bahdanau_monotonic",
         "several"]


def tf_recurrent_rnn(cell, **kwargs):
  # A model this small gains nothing from XLA-compiled steps (docs/op.md).
  return tf_recurrent.RNN(cell, xla_steps=False, **kwargs)


def functional_model(layer_cls, mechanism, **wrapper_kwargs):
  """Source tokens -> embedding -> encoder (the memory); target vectors ->
  the attention decoder -> logits."""
  source = keras.Input([SOURCE_STEPS], dtype="int32")
  target = keras.Input([TARGET_STEPS, TARGET_DEPTH])
  memory = keras.layers.LSTM(UNITS, return_sequences=True)(
      keras.layers.Embedding(VOCAB, 4)(source))
  cell = seq2seq.AttentionWrapper(keras.layers.LSTMCell(UNITS), mechanism,
                                  **wrapper_kwargs)
  decoded = AttendOver(layer_cls(cell, return_sequences=True))(
      [target, memory])
  return keras.Model([source, target], keras.layers.Dense(VOCAB)(decoded))


def save_and_load(model, tmp_path):
  path = str(tmp_path / "model.keras")
  model.save(path)
  return keras.models.load_model(path)


def assert_same_outputs(model, loaded, inputs):
  want = model(inputs)
  got = loaded(inputs)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert len(loaded.weights) == len(model.weights)


# Every kind alone in Keras's RNN, each with other wrapper options; all
# four in one wrapper in tf_recurrent.RNN (whose eager calls trace the op
# anew per memory: one model there keeps the file's time down).
CASES = {
    # No attention layer: the attention is the context.
    "keras_rnn-luong-context": (keras.layers.RNN, "luong", dict()),
    "keras_rnn-bahdanau-cell_output": (
        keras.layers.RNN, "bahdanau",
        dict(attention_layer_size=4, output_attention=False)),
    "keras_rnn-luong_monotonic-attention_layer_and_cell_input_fn": (
        keras.layers.RNN, "luong_monotonic",
        dict(attention_layer=keras.layers.Dense(3, activation="tanh"),
             cell_input_fn=halved_inputs)),
    "keras_rnn-bahdanau_monotonic-attention_layer_size": (
        keras.layers.RNN, "bahdanau_monotonic", dict(attention_layer_size=5)),
    "tf_recurrent_rnn-several-attention_layer_sizes": (
        tf_recurrent_rnn, "several", dict(attention_layer_size=[5, 3, 4, 2])),
}


@pytest.mark.parametrize("layer_cls,kind,wrapper_kwargs", CASES.values(),
                         ids=CASES.keys())
def test_functional_model_saves_and_loads(layer_cls, kind, wrapper_kwargs,
                                          tmp_path):
  model = functional_model(layer_cls, mechanisms(kind), **wrapper_kwargs)
  inputs = data()
  for weight in model.weights:  # Not the initial weights.
    weight.assign(weight + 0.1)
  loaded = save_and_load(model, tmp_path)
  assert_same_outputs(model, loaded, inputs)
  assert type(loaded.layers[-2].rnn) is type(model.layers[-2].rnn)
  cell = loaded.layers[-2].rnn.cell
  assert isinstance(cell, seq2seq.AttentionWrapper)
  assert cell.get_config()["output_attention"] == wrapper_kwargs.get(
      "output_attention", True)
  # The same config: the mechanisms' kinds and settings, the options
  # (compared as JSON: a saved shape comes back a list, not a tuple).
  assert json.loads(json.dumps(cell.get_config())) == json.loads(json.dumps(
      model.layers[-2].rnn.cell.get_config()))


def test_sequential_model_saves_and_loads(tmp_path):
  # One input: the decoder attends over (a projection of) its own inputs.
  model = keras.Sequential([
      keras.Input([TARGET_STEPS, TARGET_DEPTH]),
      keras.layers.Dense(UNITS),
      AttendOver(keras.layers.RNN(seq2seq.AttentionWrapper(
          keras.layers.GRUCell(UNITS), mechanisms("bahdanau"),
          attention_layer_size=4), return_sequences=True)),
      keras.layers.Dense(2),
  ])
  _, target = data()
  loaded = save_and_load(model, tmp_path)
  assert_same_outputs(model, loaded, target)


@keras.saving.register_keras_serializable(package="tf_recurrent_tests")
class Translator(keras.Model):
  """A subclassed model that sets the memory up in its call."""

  def __init__(self, units=UNITS, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.embedding = keras.layers.Embedding(VOCAB, 4)
    self.encoder = tf_recurrent.LSTM(units, return_sequences=True)
    self.mechanism = seq2seq.LuongMonotonicAttention(units, mode="hard")
    self.decoder = tf_recurrent_rnn(
        seq2seq.AttentionWrapper(keras.layers.LSTMCell(units), self.mechanism,
                                 attention_layer_size=units),
        return_sequences=True)
    self.project = keras.layers.Dense(VOCAB)

  def call(self, inputs):
    source, target = inputs
    self.mechanism.setup_memory(self.encoder(self.embedding(source)))
    return self.project(self.decoder(target))

  def get_config(self):
    return {**super().get_config(), "units": self.units}


def test_subclassed_model_setting_memory_in_call(tmp_path):
  model = Translator()
  inputs = data()
  model(inputs)
  loaded = save_and_load(model, tmp_path)
  assert isinstance(loaded, Translator)
  assert_same_outputs(model, loaded, inputs)


def test_alignment_history_round_trips_for_dynamic_decode():
  # alignment_history keeps a TensorArray in the state, so it runs in
  # dynamic_decode (BasicDecoder), not in a recurrent layer: the cell
  # itself goes through Keras's serialization, its weights copied.
  memory = tf.random.stateless_normal([BATCH, SOURCE_STEPS, 5], seed=[1, 2])
  cell = seq2seq.AttentionWrapper(
      keras.layers.LSTMCell(UNITS), mechanisms("bahdanau_monotonic"),
      attention_layer_size=3, alignment_history=True)
  config = keras.saving.serialize_keras_object(cell)
  clone = keras.saving.deserialize_keras_object(config)
  assert clone.get_config()["alignment_history"] is True

  def decode(wrapper):
    wrapper.attention_mechanisms[0].setup_memory(memory)
    decoder = seq2seq.BasicDecoder(wrapper, seq2seq.TrainingSampler())
    inputs = tf.random.stateless_normal([BATCH, TARGET_STEPS, 2], seed=[3, 4])
    _, state, _ = decoder(inputs, initial_state=wrapper.get_initial_state(
        batch_size=BATCH, dtype=tf.float32))
    return state.alignment_history.stack()

  want = decode(cell)
  clone_history = decode(clone)  # Builds the clone's weights.
  assert clone_history.shape == want.shape
  clone.set_weights(cell.get_weights())
  np.testing.assert_allclose(decode(clone), want, rtol=1e-6, atol=1e-6)


def test_config_holds_no_tensors():
  # The memory (and its lengths) are run-time tensors: a mechanism built
  # around one configures one without it.
  memory = tf.ones([BATCH, SOURCE_STEPS, 5])
  mechanism = seq2seq.BahdanauAttention(UNITS, memory=memory,
                                        memory_sequence_length=[5, 2])
  cell = seq2seq.AttentionWrapper(keras.layers.LSTMCell(UNITS), mechanism)
  config = cell.get_config()
  assert config["attention_mechanism"]["config"]["memory"] is None
  clone = seq2seq.AttentionWrapper.from_config(config)
  assert not clone.attention_mechanisms[0].memory_initialized


def test_initial_cell_state_is_refused_in_config():
  mechanism = seq2seq.LuongAttention(UNITS, memory=tf.ones([BATCH, 3, 5]))
  cell = seq2seq.AttentionWrapper(
      keras.layers.LSTMCell(UNITS), mechanism,
      initial_cell_state=[tf.ones([BATCH, UNITS])] * 2)
  with pytest.raises(ValueError, match="initial_cell_state is a tensor"):
    cell.get_config()


def test_deserialized_layer_has_its_weights_before_any_memory():
  # The build config keeps each memory's depth: a deserialized recurrent
  # layer (and a mechanism alone) creates every weight before its memory
  # is set up, as load_model needs to assign them.
  memory = tf.constant(np.random.default_rng(1).normal(size=[2, 6, 7]))
  mechanism = seq2seq.BahdanauAttention(4, normalize=True, dtype="float64")
  mechanism.setup_memory(memory)
  layer = keras.layers.RNN(seq2seq.AttentionWrapper(
      keras.layers.LSTMCell(5, dtype="float64"), mechanism,
      attention_layer_size=3, dtype="float64"), return_sequences=True,
                           dtype="float64")
  x = tf.constant(np.random.default_rng(2).normal(size=[2, 4, 3]))
  want = layer(x)
  config = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
  assert config["config"]["cell"]["build_config"]["memory_depths"] == [7]
  clone = keras.saving.deserialize_keras_object(config)
  assert not clone.cell.attention_mechanisms[0].memory_initialized
  assert [w.shape for w in clone.weights] == [w.shape for w in layer.weights]
  assert {w.dtype for w in clone.weights} == {"float64"}
  clone.set_weights(layer.get_weights())
  clone.cell.attention_mechanisms[0].setup_memory(memory)
  np.testing.assert_allclose(clone(x), want, rtol=1e-12)

  alone = keras.saving.deserialize_keras_object(json.loads(json.dumps(
      keras.saving.serialize_keras_object(mechanism))))
  assert [w.shape for w in alone.weights] == [
      w.shape for w in mechanism.weights]


def functional_memory_model(mechanism_cls, lengths_input):
  """Addons' functional pattern (attention_wrapper_test's
  test_save_load_layer): the mechanism given the encoder's symbolic output
  (masked by the embedding's zeros, or by an input of lengths), queried
  with symbolic inputs."""
  source = keras.Input([SOURCE_STEPS], dtype="int32")
  memory = keras.layers.LSTM(UNITS, return_sequences=True)(
      keras.layers.Embedding(VOCAB, 4, mask_zero=not lengths_input)(source))
  inputs = [source]
  lengths = None
  if lengths_input:
    lengths = keras.Input([], dtype="int32")
    inputs.append(lengths)
  mechanism = mechanism_cls(UNITS, memory, memory_sequence_length=lengths)
  query, state = keras.Input([UNITS]), keras.Input([SOURCE_STEPS])
  alignments, next_state = mechanism([query, state])
  model = keras.Model(inputs + [query, state], [alignments, next_state])
  return model, mechanism, keras.Model(source, memory)


def functional_memory_data(lengths_input):
  rng = np.random.default_rng(4)
  source = rng.integers(1, VOCAB, [BATCH, SOURCE_STEPS]).astype(np.int32)
  data_ = [source]
  if lengths_input:
    data_.append(np.array([SOURCE_STEPS, 2], np.int32))
  else:
    source[1, 3:] = 0  # The embedding masks these steps.
  query = rng.normal(size=[BATCH, UNITS]).astype(np.float32)
  state = rng.normal(size=[BATCH, SOURCE_STEPS]).astype(np.float32)
  state = np.abs(state) / np.abs(state).sum(1, keepdims=True)
  return data_ + [query, state]


FUNCTIONAL_MEMORY_CASES = {
    "luong-mask": (seq2seq.LuongAttention, False),
    "bahdanau_monotonic-lengths": (seq2seq.BahdanauMonotonicAttention, True),
}


@pytest.mark.parametrize("mechanism_cls,lengths_input",
                         FUNCTIONAL_MEMORY_CASES.values(),
                         ids=FUNCTIONAL_MEMORY_CASES.keys())
def test_functional_memory_attends_over_the_encoders_output(
    mechanism_cls, lengths_input):
  # Each run sets the memory up from the encoder's output, its Keras mask
  # or the lengths input masking it: the alignments are those of the same
  # mechanism given that memory directly.
  model, mechanism, encoder = functional_memory_model(mechanism_cls,
                                                      lengths_input)
  assert not mechanism.memory_initialized  # Nothing left of the tracing.
  inputs = functional_memory_data(lengths_input)
  got = model(inputs)
  memory = encoder(inputs[0])
  if lengths_input:
    mechanism.setup_memory(memory, memory_sequence_length=inputs[1])
  else:
    mechanism.setup_memory(memory, memory_mask=inputs[0] != 0)
  want = mechanism(inputs[-2:])
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  masked = np.asarray(got[0])[1, 2 if lengths_input else 3:]
  np.testing.assert_array_equal(masked, 0.0)
  # Gradients reach the encoder and the memory layer through the memory.
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(inputs)[0] * inputs[-1])
  grads = tape.gradient(loss, [mechanism.memory_layer.kernel,
                               encoder.layers[-1].trainable_variables[0]])
  assert all(np.abs(g).max() > 0 for g in grads)


@pytest.mark.parametrize("mechanism_cls,lengths_input",
                         FUNCTIONAL_MEMORY_CASES.values(),
                         ids=FUNCTIONAL_MEMORY_CASES.keys())
def test_functional_memory_round_trips(mechanism_cls, lengths_input,
                                       tmp_path):
  model, _, _ = functional_memory_model(mechanism_cls, lengths_input)
  for weight in model.weights:  # Not the initial weights.
    weight.assign(weight + 0.1)
  inputs = functional_memory_data(lengths_input)
  want = model(inputs)
  from_config = keras.Model.from_config(model.get_config())
  from_config.set_weights(model.get_weights())
  for clone in (from_config, save_and_load(model, tmp_path)):
    for g, w in zip(clone(inputs), want):
      np.testing.assert_array_equal(g, w)


def test_symbolic_memory_in_a_wrapper_says_where_it_goes():
  memory = keras.Input([SOURCE_STEPS, UNITS])
  wrapper = seq2seq.AttentionWrapper(keras.layers.LSTMCell(UNITS),
                                     seq2seq.LuongAttention(UNITS, memory))
  with pytest.raises(ValueError, match="symbolic"):
    wrapper.get_initial_state(batch_size=BATCH, dtype=tf.float32)
