"""TFLite conversion of the Keras layers (tf_recurrent/tflite.py): builtin
ops only, plain LSTMs as the fused UNIDIRECTIONAL_SEQUENCE_LSTM, int8."""

import contextlib
import io

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent.engine import inference
from tf_recurrent.export import tflite
from conftest import tflite_unavailable_reason

B, T, D, H = 2, 5, 3, 4
FUSED = "UNIDIRECTIONAL_SEQUENCE_LSTM"


def skip_without_converter():
  """Skips the test where the converter converts no Keras model at all
  (TensorFlow 2.16.1 with Keras 3.5.0, the dependency floor)."""
  if tflite_unavailable_reason():
    pytest.skip(tflite_unavailable_reason())


def convert(converter) -> bytes:
  skip_without_converter()
  with contextlib.redirect_stdout(io.StringIO()):  # Keras's export log.
    return converter.convert()


def interpret(flatbuffer: bytes, inputs):
  """The model's outputs (in order) on `inputs` (a list, in input order)."""
  interpreter = tf.lite.Interpreter(model_content=flatbuffer)
  if not interpreter.get_signature_list():  # from_concrete_functions
    interpreter.allocate_tensors()
    for detail, value in zip(interpreter.get_input_details(), inputs):
      interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"])
            for d in interpreter.get_output_details()]
  runner = interpreter.get_signature_runner()
  names = list(runner.get_input_details())
  assert len(names) == len(inputs)
  outputs = runner(**dict(zip(names, inputs)))
  return [outputs[k] for k in sorted(outputs, key=lambda k: int(k.split("_")[-1]))]


class MinimalCell(keras.layers.Layer):
  """A user's cell: h = tanh(x W) + h U (the Keras RNN guide's example)."""

  def __init__(self, units, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.state_size = units

  def build(self, input_shape):
    self.w = self.add_weight(shape=(input_shape[-1], self.units))
    self.u = self.add_weight(shape=(self.units, self.units))

  def call(self, inputs, states):
    h = tf.tanh(inputs @ self.w) + states[0] @ self.u * 0.5
    return h, [h]


def sequential(*layers, shape=(T, D), batch=B):
  return lambda: keras.Sequential([keras.Input(shape, batch_size=batch)] +
                                  [l() for l in layers])


def lstm(**kwargs):
  return lambda: tf_recurrent.LSTM(H, **kwargs)


def masked_inputs(x):
  x = x.copy()
  x[0, 3:] = 0.0  # Masking() drops the last two steps of example 0.
  x[1, :1] = 0.0  # and the first step of example 1.
  return x


def return_state_model():
  inputs = keras.Input((T, D), batch_size=B)
  outputs = tf_recurrent.LSTM(H, return_state=True)(inputs)
  return keras.Model(inputs, list(outputs))


def initial_state_model():
  inputs = [keras.Input((T, D), batch_size=B), keras.Input((H,), batch_size=B),
            keras.Input((H + 1,), batch_size=B)]
  h0 = keras.layers.Dense(H)(inputs[2])  # c0 is inputs[1]: one shape each.
  outputs = tf_recurrent.LSTM(H, return_sequences=True)(
      inputs[0], initial_state=[h0, inputs[1]])
  return keras.Model(inputs, outputs)


# name: (model builder, number of fused LSTM ops; 0: a WHILE loop instead).
CASES = {
    "lstm_sequences": (sequential(lstm(return_sequences=True)), 1),
    "lstm_last": (sequential(lstm()), 1),
    "lstm_go_backwards": (sequential(lstm(return_sequences=True,
                                          go_backwards=True)), 1),
    "lstm_go_backwards_last": (sequential(lstm(go_backwards=True)), 1),
    "lstm_stacked": (sequential(lstm(return_sequences=True),
                                lambda: tf_recurrent.LSTM(H + 1)), 2),
    "lstm_no_bias": (sequential(lstm(use_bias=False, return_sequences=True)),
                     1),
    "lstm_dynamic_time": (sequential(lstm(return_sequences=True),
                                     shape=(None, D)), 1),
    "lstm_initial_state": (initial_state_model, 1),
    "bidirectional_lstm": (sequential(lambda: keras.layers.Bidirectional(
        tf_recurrent.LSTM(H, return_sequences=True))), 2),
    "bidirectional_lstm_sum": (sequential(lambda: keras.layers.Bidirectional(
        tf_recurrent.LSTM(H), merge_mode="sum")), 2),
    "lstm_relu": (sequential(lstm(activation="relu", return_sequences=True)),
                  0),
    "lstm_masked": (sequential(keras.layers.Masking,
                               lstm(return_sequences=True)), 0),
    "lstm_return_state": (return_state_model, 0),
    "lstm_recurrent_dropout": (sequential(lstm(recurrent_dropout=0.3,
                                               return_sequences=True)), 1),
    "gru": (sequential(lambda: tf_recurrent.GRU(H, return_sequences=True)), 0),
    "gru_reset_before_backwards": (sequential(lambda: tf_recurrent.GRU(
        H, reset_after=False, go_backwards=True)), 0),
    "gru_dynamic_time": (sequential(lambda: tf_recurrent.GRU(H),
                                    shape=(None, D)), 0),
    "gru_masked": (sequential(keras.layers.Masking, lambda: tf_recurrent.GRU(
        H, return_sequences=True, zero_output_for_mask=True)), 0),
    "simple_rnn": (sequential(lambda: tf_recurrent.SimpleRNN(H)), 0),
    "rnn_user_cell": (sequential(lambda: tf_recurrent.RNN(
        MinimalCell(H), return_sequences=True)), 0),
    "rnn_stacked_cells": (sequential(lambda: tf_recurrent.RNN(
        keras.layers.StackedRNNCells([keras.layers.LSTMCell(H),
                                      keras.layers.GRUCell(H + 1)]),
        return_sequences=True)), 0),
    "bidirectional_gru": (sequential(lambda: keras.layers.Bidirectional(
        tf_recurrent.GRU(H, return_sequences=True))), 0),
    # A list of cells (StackedRNNCells), ours, in a Bidirectional.
    "bidirectional_rnn_cell_list": (sequential(
        lambda: keras.layers.Bidirectional(tf_recurrent.RNN(
            [tf_recurrent.ZoneoutGRUCell(H, zoneout_h=0.3),
             tf_recurrent.PeepholeLSTMCell(H)], return_sequences=True))), 0),
    # The cells Keras 3 does not ship: a builtin loop (the fused LSTM's
    # peephole and layer-norm inputs compute other math; its projection
    # the converter cannot pass, tflite.convert writes it in, see
    # PROJECTED_CASES; zoneout at inference is its expectation, which the
    # fused op lacks).
    "peephole_lstm": (sequential(lambda: tf_recurrent.PeepholeLSTM(
        H, return_sequences=True)), 0),
    "layer_norm_lstm": (sequential(lambda: tf_recurrent.LayerNormLSTM(
        H, return_sequences=True)), 0),
    "layer_norm_simple_rnn": (sequential(
        lambda: tf_recurrent.LayerNormSimpleRNN(H)), 0),
    "projected_lstm": (sequential(lambda: tf_recurrent.ProjectedLSTM(
        H, proj_size=H - 1, return_sequences=True)), 0),
    "zoneout_lstm": (sequential(lambda: tf_recurrent.ZoneoutLSTM(
        H, zoneout_h=0.3, zoneout_c=0.2, return_sequences=True)), 0),
    "conv_lstm_1d": (sequential(lambda: tf_recurrent.ConvLSTM1D(
        2, 3, padding="same", return_sequences=True), shape=(3, 5, 2),
                                batch=1), 0),
    "conv_lstm_2d": (sequential(lambda: tf_recurrent.ConvLSTM2D(
        2, 3, padding="same", return_sequences=True), shape=(3, 5, 5, 2),
                                batch=1), 0),
    # TFLite slices at most 5-D tensors: the loop reads 3-D frames as rows.
    "conv_lstm_3d": (sequential(lambda: tf_recurrent.ConvLSTM3D(
        2, 2, strides=2, padding="valid"), shape=(3, 4, 4, 4, 1),
                                batch=1), 0),
    "conv_lstm_3d_sequences": (sequential(lambda: tf_recurrent.ConvLSTM3D(
        2, 3, padding="same", return_sequences=True), shape=(3, 3, 3, 3, 1),
                                          batch=1), 0),
}


def case_inputs(name, model, steps=None):
  rng = np.random.default_rng(len(name))
  values = []
  for spec in model.inputs:
    shape = [steps if d is None else d for d in spec.shape]
    values.append(rng.normal(size=shape).astype(np.float32))
  if "masked" in name:
    values[0] = masked_inputs(values[0])
  return values


@pytest.fixture(scope="module")
def converted():
  """Every case built and converted once, with from_keras_model."""
  result = {}
  for name, (build, _) in CASES.items():
    keras.utils.set_random_seed(len(name))
    model = build()
    result[name] = (model, convert(
        tf.lite.TFLiteConverter.from_keras_model(model)))
  return result


def assert_ops(flatbuffer, fused):
  names = tflite.op_names(flatbuffer)
  assert not [n for n in names if n.startswith("Flex")], names
  assert names.count(FUSED) == fused, names
  if fused:
    assert "WHILE" not in names, names
  else:
    assert "WHILE" in names, names


@pytest.mark.parametrize("name", sorted(CASES))
def test_converts_with_builtin_ops_and_matches_keras(converted, name):
  model, flatbuffer = converted[name]
  assert_ops(flatbuffer, CASES[name][1])
  for steps in ([T, 2 * T + 1, 1] if "dynamic" in name else [None]):
    inputs = case_inputs(name, model, steps)
    expected = model(inputs if len(inputs) > 1 else inputs[0])
    expected = [np.asarray(e) for e in tf.nest.flatten(expected)]
    got = interpret(flatbuffer, inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
      np.testing.assert_allclose(g, e, rtol=0, atol=1e-5)


def test_saved_model_from_model_export_fuses(tmp_path):
  skip_without_converter()  # Before export(): Keras 3.5 has no input_signature.
  keras.utils.set_random_seed(1)
  model = sequential(lstm(return_sequences=True), lambda: keras.layers.Dense(2),
                     shape=(None, D))()
  # A fixed batch size: TFLite lowers loops only with static row shapes.
  with contextlib.redirect_stdout(io.StringIO()):
    model.export(str(tmp_path), input_signature=[
        tf.TensorSpec([1, None, D], tf.float32)])
  flatbuffer = convert(tf.lite.TFLiteConverter.from_saved_model(
      str(tmp_path)))
  assert_ops(flatbuffer, 1)
  x = np.random.default_rng(0).normal(size=[1, 7, D]).astype(np.float32)
  np.testing.assert_allclose(interpret(flatbuffer, [x])[0], model(x),
                             rtol=0, atol=1e-5)


@pytest.mark.parametrize("layer", ["lstm", "gru"])
def test_concrete_function_converts_to_a_loop(layer):
  keras.utils.set_random_seed(2)
  model = sequential(lambda: {"lstm": tf_recurrent.LSTM,
                              "gru": tf_recurrent.GRU}[layer](H))()
  function = tf.function(lambda x: model(x)).get_concrete_function(
      tf.TensorSpec([B, T, D], tf.float32))
  # Freezing a concrete function inlines every call, the LSTM's too: a loop.
  flatbuffer = convert(tf.lite.TFLiteConverter.from_concrete_functions(
      [function]))
  assert_ops(flatbuffer, 0)
  x = np.random.default_rng(0).normal(size=[B, T, D]).astype(np.float32)
  np.testing.assert_allclose(interpret(flatbuffer, [x])[0], model(x),
                             rtol=0, atol=1e-5)


def test_stateful_lstm_carries_its_state_between_calls():
  keras.utils.set_random_seed(6)
  model = sequential(lstm(stateful=True, return_sequences=True))()
  flatbuffer = convert(tf.lite.TFLiteConverter.from_keras_model(model))
  assert_ops(flatbuffer, 0)  # The state is read and written: a loop.
  runner = tf.lite.Interpreter(model_content=flatbuffer).get_signature_runner()
  (name,) = runner.get_input_details()
  for seed in range(2):  # The second call starts from the first's state.
    x = np.random.default_rng(seed).normal(size=[B, T, D]).astype(np.float32)
    (got,) = runner(**{name: x}).values()
    np.testing.assert_allclose(got, model(x), rtol=0, atol=1e-5)


def test_without_cell_clip_computes_what_keras_does_past_ten():
  """A cell state counting up to 20 and back down: the fused op clips it at
  10, so its outputs change sign where Keras's do not."""
  model = sequential(lstm(return_sequences=True), shape=(35, 1), batch=1)()
  cell = model.layers[0].cell
  # Gates i, f, c, o: input and forget gates open (sigmoid(20) ~ 1), the
  # candidate tanh(20 x) = +-1, so c counts the inputs' running sum.
  cell.kernel.assign(np.repeat([[0.0, 0.0, 20.0, 0.0]], H, axis=1))
  cell.recurrent_kernel.assign(np.zeros([H, 4 * H]))
  cell.bias.assign(np.repeat([20.0, 20.0, 0.0, 0.0], H))
  x = np.concatenate([np.ones(20), -np.ones(15)]).astype(np.float32)
  x = x.reshape([1, 35, 1])
  expected = np.asarray(model(x))
  flatbuffer = convert(tf.lite.TFLiteConverter.from_keras_model(model))
  clipped = interpret(flatbuffer, [x])[0]
  assert np.abs(clipped - expected).max() > 0.5  # c: 10 - 15 against 20 - 15.
  unclipped = tflite.without_cell_clip(flatbuffer)
  assert_ops(unclipped, 1)
  np.testing.assert_allclose(interpret(unclipped, [x])[0], expected, rtol=0,
                             atol=1e-5)


def projected(proj_size=H - 1, **kwargs):
  return lambda: tf_recurrent.ProjectedLSTM(H, proj_size=proj_size, **kwargs)


# name: (model builder, fused LSTM ops with tflite.convert). The projected
# LSTMs (converter.convert() makes loops of them, CASES["projected_lstm"]).
PROJECTED_CASES = {
    "sequences": (sequential(projected(return_sequences=True)), 1),
    "go_backwards_last": (sequential(projected(2, go_backwards=True)), 1),
    # proj_size == units: h as wide as c, found by its kernels all the same.
    "stacked_with_plain": (sequential(projected(H, return_sequences=True),
                                      projected(1, return_sequences=True),
                                      lstm()), 3),
    "bidirectional": (sequential(lambda: keras.layers.Bidirectional(
        tf_recurrent.ProjectedLSTM(H, proj_size=2, return_sequences=True))),
                      2),
    "masked": (sequential(keras.layers.Masking,
                          projected(return_sequences=True)), 0),
}


@pytest.mark.parametrize("name", sorted(PROJECTED_CASES))
def test_convert_fuses_projected_lstms_and_matches_keras(name):
  keras.utils.set_random_seed(len(name))
  build, fused = PROJECTED_CASES[name]
  model = build()
  skip_without_converter()
  with contextlib.redirect_stdout(io.StringIO()):
    flatbuffer = tflite.convert(tf.lite.TFLiteConverter.from_keras_model(
        model))
  assert_ops(flatbuffer, fused)
  x = case_inputs(name, model)[0]
  np.testing.assert_allclose(interpret(flatbuffer, [x])[0], model(x),
                             rtol=0, atol=1e-5)


@pytest.mark.parametrize("proj_size", [H - 1, H])
def test_convert_projects_every_fused_projected_lstm(monkeypatch, proj_size):
  """The converter's fused op is P wide but does not project: without the
  projection `convert` writes in, its outputs are wrong, and a fused op
  left without one that could be a projected LSTM's is an error."""
  keras.utils.set_random_seed(7)
  model = sequential(projected(proj_size, return_sequences=True))()
  traced = []
  monkeypatch.setattr(tflite, "_with_projections",
                      lambda content, projections: traced.extend(
                          projections) or content)
  skip_without_converter()
  with contextlib.redirect_stdout(io.StringIO()):
    unprojected = tflite.convert(tf.lite.TFLiteConverter.from_keras_model(
        model))
  monkeypatch.undo()
  assert_ops(unprojected, 1)
  x = case_inputs("projection", model)[0]
  assert np.abs(interpret(unprojected, [x])[0] - model(x)).max() > 1e-2
  wide = f"h {proj_size} and c {H} wide and no projection"
  if proj_size != H:  # h narrower than c: no plain LSTM's.
    with pytest.raises(ValueError, match=wide):
      tflite._with_projections(unprojected, [])  # pylint: disable=protected-access
  # A traced projected LSTM whose kernels no op holds, of the op's widths.
  with pytest.raises(ValueError, match=wide):
    tflite._with_projections(unprojected, [traced[0]._replace(  # pylint: disable=protected-access
        kernel=traced[0].kernel + 1.0)])
  projected_model = tflite._with_projections(unprojected, traced)  # pylint: disable=protected-access
  np.testing.assert_allclose(interpret(projected_model, [x])[0], model(x),
                             rtol=0, atol=1e-5)


def test_convert_keeps_quantized_projected_lstms_as_loops():
  keras.utils.set_random_seed(8)
  model = sequential(projected(return_sequences=True))()
  converter = tf.lite.TFLiteConverter.from_keras_model(model)
  converter.optimizations = [tf.lite.Optimize.DEFAULT]
  skip_without_converter()
  with contextlib.redirect_stdout(io.StringIO()):
    flatbuffer = tflite.convert(converter)
  assert_ops(flatbuffer, 0)
  x = case_inputs("quantized", model)[0]
  expected = np.asarray(model(x))
  np.testing.assert_allclose(interpret(flatbuffer, [x])[0], expected,
                             rtol=0, atol=0.02 * np.abs(expected).max())


def test_convert_runs_one_conversion_at_a_time(monkeypatch):
  monkeypatch.setattr(inference, "_projections", [])
  with pytest.raises(RuntimeError, match="one model at a time"):
    tflite.convert(tf.lite.TFLiteConverter.from_keras_model(
        sequential(lstm())()))


def test_dynamic_batch_fails_at_conversion():
  """A dynamic batch runs the training loop's forward, whose row writes
  TFLite has no builtin for: the converter stops, never the interpreter."""
  model = sequential(lambda: tf_recurrent.GRU(H), batch=None)()
  with pytest.raises(Exception, match="(?i)tensor ?list|InplaceUpdate"):
    convert(tf.lite.TFLiteConverter.from_keras_model(model))


def implements(concrete_function):
  """The api_implements names of the functions a traced graph calls."""
  library = concrete_function.graph.as_graph_def().library.function
  return [f.attr["api_implements"].s.decode() for f in library
          if "api_implements" in f.attr]


@pytest.mark.parametrize("batch", [B, None])
def test_only_graphs_nothing_differentiates_take_the_inference_path(batch):
  """Whatever the batch size (an unknown one for ONNX's sake)."""
  keras.utils.set_random_seed(3)
  model = sequential(lstm(return_sequences=True))()
  spec = tf.TensorSpec([batch, T, D], tf.float32)
  inference = tf.function(lambda x: model(x)).get_concrete_function(spec)
  assert [n[:5] for n in implements(inference)] == ["lstm_"]
  training = tf.function(lambda x: model(x, training=True)
                         ).get_concrete_function(spec)
  assert implements(training) == []

  def under_tape(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = model(x)  # training unset, but a gradient is asked for.
    return tape.gradient(y, x)
  assert implements(tf.function(under_tape).get_concrete_function(spec)) == []


@pytest.mark.parametrize("name", ["lstm_go_backwards", "gru_masked",
                                  "rnn_stacked_cells"])
def test_inference_graph_computes_what_the_training_loop_does(name):
  keras.utils.set_random_seed(4)
  model = CASES[name][0]()
  x = case_inputs(name, model)[0]
  eager = model(x)  # Eager: tf_recurrent's own loop.
  graph = tf.function(lambda x: model(x))(tf.constant(x))
  np.testing.assert_allclose(graph, eager, rtol=0, atol=1e-6)


# The three inference loops: the LSTM's function, the GRU's step, a cell's
# own call (masked).
@pytest.mark.parametrize("name", ["lstm_go_backwards", "gru", "gru_masked"])
def test_gradients_of_an_inference_graph_are_the_training_loops(name):
  """`tf.gradients` of a graph traced with an unknown batch and no tape (the
  inference loops, autodiff) against the tape's gradient in eager (the
  training loops' hand-written one)."""
  keras.utils.set_random_seed(9)
  model = CASES[name][0]()
  x = case_inputs(name, model)[0]
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(x) ** 2)
  expected = tape.gradient(loss, model.trainable_weights)

  @tf.function(input_signature=[tf.TensorSpec([None] + list(x.shape[1:]))])
  def gradients(x):
    return tf.gradients(tf.reduce_sum(model(x) ** 2),
                        model.trainable_weights)

  graph = gradients.get_concrete_function().graph.as_graph_def()
  ops = {n.op for n in graph.node} | {
      n.op for f in graph.library.function for n in f.node_def}
  assert "TensorListFromTensor" in ops and "InplaceUpdate" not in ops, ops
  got = gradients(x)
  assert len(got) == len(expected) > 0
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=0, atol=1e-5 * np.abs(e).max())


@pytest.fixture(scope="module")
def quantized():
  """A one-layer LSTM big enough to quantize, converted three ways."""
  keras.utils.set_random_seed(5)
  model = keras.Sequential([keras.Input((8, 16), batch_size=1),
                            tf_recurrent.LSTM(64, return_sequences=True),
                            keras.layers.Dense(4)])
  data = np.random.default_rng(0).normal(size=[48, 1, 8, 16]).astype(
      np.float32)
  models = {"float": convert(tf.lite.TFLiteConverter.from_keras_model(model))}
  converter = tf.lite.TFLiteConverter.from_keras_model(model)
  converter.optimizations = [tf.lite.Optimize.DEFAULT]
  models["dynamic_range"] = convert(converter)
  converter = tf.lite.TFLiteConverter.from_keras_model(model)
  converter.optimizations = [tf.lite.Optimize.DEFAULT]
  converter.representative_dataset = lambda: ([x] for x in data[:32])
  converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
  converter.inference_input_type = tf.int8
  converter.inference_output_type = tf.int8
  models["int8"] = convert(converter)
  held_out = data[32:]
  expected = np.stack([model(x) for x in held_out])
  return models, held_out, expected


def run_quantized(flatbuffer, x):
  interpreter = tf.lite.Interpreter(model_content=flatbuffer)
  interpreter.allocate_tensors()
  inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
  if inp["dtype"] == np.int8:
    scale, zero = inp["quantization"]
    x = np.clip(np.round(x / scale + zero), -128, 127).astype(np.int8)
  interpreter.set_tensor(inp["index"], x)
  interpreter.invoke()
  y = interpreter.get_tensor(out["index"])
  if out["dtype"] == np.int8:
    scale, zero = out["quantization"]
    y = (y.astype(np.float32) - zero) * scale
  return y


# Measured (TF 2.21): the largest output error over 16 held-out inputs,
# relative to the largest float output (0.48): dynamic range 0.0062, int8
# 0.0155; both models 3.4x smaller than float. The bounds leave 2.5-3x
# headroom.
@pytest.mark.parametrize("kind,bound", [("dynamic_range", 0.02),
                                        ("int8", 0.04)])
def test_quantized_lstm_stays_fused_and_close(quantized, kind, bound):
  models, held_out, expected = quantized
  flatbuffer = models[kind]
  assert_ops(flatbuffer, 1)
  got = np.stack([run_quantized(flatbuffer, x) for x in held_out])
  error = np.abs(got - expected).max() / np.abs(expected).max()
  assert error <= bound, error
  assert len(flatbuffer) * 3 <= len(models["float"]), (
      len(flatbuffer), len(models["float"]))
