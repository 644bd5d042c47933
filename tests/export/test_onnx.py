"""ONNX export of the Keras layers with a dynamic batch (issue 56): every
way out (Keras's `model.export(format="onnx")`, `tf2onnx.convert`'s
`from_function` and `from_keras`, the `--saved-model` command line on a
`model.export` SavedModel) loads in onnxruntime and computes what the model
does; plain LSTMs (a `Bidirectional` one too) become ONNX's fused `LSTM`
op, plain GRUs its `GRU` op, the others a `Loop`."""

import contextlib
import io
import logging
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
tf2onnx = pytest.importorskip("tf2onnx")
import tf2onnx.convert  # noqa: E402  pylint: disable=g-import-not-at-top

D, H, T = 3, 4, 5
BATCHES = (1, 4)
LENGTHS = (7, 2)  # For the inputs whose length is None.
TOLERANCE = 1e-6
# A layer norm over H=4 units scales float32 rounding by 1/std: TensorFlow's
# own two float32 loops for this layer (eager's training loop, a graph's
# inference loop) differ by up to 1.1e-6, onnxruntime (rsqrt as sqrt and a
# reciprocal) from either by up to 4.0e-6 (10 random models, T <= 11).
LAYER_NORM_TOLERANCE = 1e-5


def sequential(*layers, length=None):
  return lambda: keras.Sequential([keras.Input((length, D))] +
                                  [layer() for layer in layers])


# kind: (model builder, the ONNX ops it must become: {op: count}; "Loop"
# stands for one or more). Two kinds keep a static length.
KINDS = {
    "lstm": (sequential(lambda: tf_recurrent.LSTM(H, return_sequences=True)),
             {"LSTM": 1, "Loop": 0}),
    "gru_stack": (sequential(
        lambda: tf_recurrent.GRU(H, return_sequences=True),
        lambda: tf_recurrent.GRU(H + 1)), {"GRU": 2, "Loop": 0}),
    "simple_rnn": (sequential(lambda: tf_recurrent.SimpleRNN(H), length=T),
                   {"Loop": 1, "LSTM": 0, "GRU": 0}),
    "bidirectional_lstm": (sequential(lambda: keras.layers.Bidirectional(
        tf_recurrent.LSTM(H, return_sequences=True))),
                           {"LSTM": 1, "Loop": 0}),
    "masked_lstm": (sequential(
        keras.layers.Masking,
        lambda: tf_recurrent.LSTM(H, return_sequences=True)),
                    {"Loop": 1, "LSTM": 0}),
    "layer_norm_lstm": (sequential(lambda: tf_recurrent.LayerNormLSTM(
        H, return_sequences=True)), {"Loop": 1, "LSTM": 0}),
    "peephole_lstm": (sequential(lambda: tf_recurrent.PeepholeLSTM(
        H, return_sequences=True), length=T), {"Loop": 1, "LSTM": 0}),
    # Keras's GRU cell in tf_recurrent.RNN: plain, so fused like GRU's.
    "rnn_gru_cell": (sequential(lambda: tf_recurrent.RNN(
        keras.layers.GRUCell(H), return_sequences=True)),
                     {"GRU": 1, "Loop": 0}),
}


def randomized(model, seed):
  """`model` with every weight random (biases, gains and shifts too: zeros
  and ones would hide a bias or a norm the conversion drops)."""
  rng = np.random.default_rng(seed)
  for weight in model.weights:
    weight.assign(rng.normal(size=weight.shape, scale=0.5).astype(np.float32))
  return model


@pytest.fixture(scope="module")
def models():
  """Each kind built with random weights and called once (Keras exports
  only a model that has been called)."""
  built = {}
  for kind, (build, _) in KINDS.items():
    keras.utils.set_random_seed(len(kind))
    built[kind] = randomized(build(), len(kind))
    built[kind](inputs_for(kind, BATCHES[0], T))
  return built


def shapes(model):
  """The (batch, length) pairs a kind is run at: two batch sizes, and two
  lengths where the model's is None."""
  length = model.inputs[0].shape[1]
  return [(b, t) for b in BATCHES for t in ((length,) if length else LENGTHS)]


def inputs_for(kind, batch, length):
  x = np.random.default_rng(batch * 100 + length).normal(
      size=[batch, length, D]).astype(np.float32)
  if kind.startswith("masked"):
    x[0, length - 1:] = 0.0  # Masking() drops example 0's last step,
    x[1:, :1] = 0.0  # and the others' first.
  return x


def signature(model):
  return [tf.TensorSpec([None] + list(model.inputs[0].shape[1:]), tf.float32)]


def through_model_export(model, directory):
  path = str(directory / "model.onnx")
  model.export(path, format="onnx", verbose=False)
  return onnx.load(path)


def through_from_function(model, directory):
  del directory
  function = tf.function(lambda x: model(x))
  return tf2onnx.convert.from_function(function, signature(model))[0]


def through_from_keras(model, directory):
  """`tf2onnx.convert.from_keras`. tf2onnx 1.17 looks a Keras model's
  outputs up by `model.output_names`, which a Keras 3 `Sequential` lacks
  (KeyError: 'keras_tensor_...', for Keras's own layers too): a functional
  model over the same layers has them (so would `model.output_names = [...]`
  on the Sequential, `test_from_keras_with_named_outputs`)."""
  del directory
  return from_keras(
      lambda m: tf2onnx.convert.from_keras(
          keras.Model(m.inputs, m.outputs))[0], model, functional=True)


def through_saved_model(model, directory):
  """`python -m tf2onnx.convert --saved-model` on `model.export`'s
  SavedModel, run in this process: the command's `main` with its argv."""
  saved = str(directory / "saved_model")
  onnx_path = str(directory / "saved_model.onnx")
  model.export(saved, verbose=False)
  # The command configures logging for a process of its own: put back the
  # root logger, TensorFlow's and the C++ log level as they were.
  root = logging.getLogger()
  handlers, level = list(root.handlers), root.level
  tf_level = tf.get_logger().level
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(sys, "argv", ["tf2onnx.convert", "--saved-model", saved,
                                "--output", onnx_path])
    patch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # Undone on leaving.
    try:
      tf2onnx.convert.main()
    finally:
      root.handlers[:] = handlers
      root.setLevel(level)
      tf.get_logger().setLevel(tf_level)
  return onnx.load(onnx_path)


def keras_own_lstm_from_keras_error(functional):
  """None where `tf2onnx.convert.from_keras` converts Keras's own LSTM (a
  functional model, or a Sequential with named outputs), else its error.
  With Keras 3.8 (the floor) tf2onnx 1.17 looks the outputs up by layer
  names the traced function does not use (KeyError: 'lstm')."""
  model = keras.Sequential([keras.Input((None, D)), keras.layers.LSTM(H)])
  if functional:
    model = keras.Model(model.inputs, model.outputs)
  else:
    model.output_names = ["output_0"]
  try:
    tf2onnx.convert.from_keras(model)
  except KeyError as error:
    return f"{type(error).__name__}: {error}"
  return None


def from_keras(convert, model, functional):
  """`convert(model)`, or an xfail where tf2onnx's from_keras fails on
  Keras's own LSTM too: a route that does not work for Keras's layers in
  this Keras is not one ours can be held to."""
  try:
    return convert(model)
  except KeyError:
    error = keras_own_lstm_from_keras_error(functional)
    if error is None:
      raise
    pytest.xfail(f"tf2onnx {tf2onnx.__version__}'s from_keras fails on Keras "
                 f"{keras.__version__}'s own LSTM too ({error})")


PATHS = {"model_export": through_model_export,
         "from_function": through_from_function,
         "from_keras": through_from_keras,
         "saved_model_cli": through_saved_model}


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
  """`converted(kind, path)`: the ONNX model, converted once per module."""
  cache = {}

  def convert(kind, path):
    if (kind, path) not in cache:
      directory = tmp_path_factory.mktemp(f"{kind}_{path}")
      with contextlib.redirect_stdout(io.StringIO()):  # Keras's export log.
        cache[kind, path] = PATHS[path](models[kind], directory)
    return cache[kind, path]
  return convert


@pytest.fixture(scope="module")
def expected(models):
  """`expected(kind, batch, length)`: the model's own outputs (eager, the
  training loop's forward), once per module."""
  cache = {}

  def outputs(kind, batch, length):
    if (kind, batch, length) not in cache:
      cache[kind, batch, length] = np.asarray(
          models[kind](inputs_for(kind, batch, length)))
    return cache[kind, batch, length]
  return outputs


def op_counts(proto):
  """The ONNX graph's top-level ops, counted (a Loop's body not opened)."""
  counts = {}
  for node in proto.graph.node:
    counts[node.op_type] = counts.get(node.op_type, 0) + 1
  return counts


CASES = [(kind, path) for kind in KINDS for path in PATHS]


@pytest.mark.parametrize("kind,path", CASES)
def test_loads_in_onnxruntime_and_matches_tf(models, converted, expected,
                                             kind, path):
  session = ort.InferenceSession(converted(kind, path).SerializeToString(),
                                 providers=["CPUExecutionProvider"])
  (name,) = [i.name for i in session.get_inputs()]
  bound = LAYER_NORM_TOLERANCE if kind.startswith("layer_norm") else (
      TOLERANCE)
  for batch, length in shapes(models[kind]):
    want = expected(kind, batch, length)
    (got,) = session.run(None, {name: inputs_for(kind, batch, length)})
    assert got.shape == want.shape, (batch, length)
    np.testing.assert_allclose(got, want, rtol=0, atol=bound,
                               err_msg=f"batch {batch}, length {length}")


@pytest.mark.parametrize("kind,path", CASES)
def test_becomes_fused_ops_or_a_loop(converted, kind, path):
  counts = op_counts(converted(kind, path))
  for op, count in KINDS[kind][1].items():
    found = counts.get(op, 0)
    assert (found >= 1 if op == "Loop" and count else found == count), (
        op, counts)
  if kind == "bidirectional_lstm":  # One op for both directions.
    (lstm,) = [n for n in converted(kind, path).graph.node
               if n.op_type == "LSTM"]
    direction = {a.name: a.s for a in lstm.attribute}["direction"]
    assert direction == b"bidirectional"


@pytest.mark.parametrize("layer", [keras.layers.LSTM, tf_recurrent.LSTM])
def test_from_keras_with_named_outputs(layer):
  """The other way around tf2onnx's Keras 3 bug, as it is for Keras's own
  LSTM: a Sequential given output names converts, to the same fused op."""
  keras.utils.set_random_seed(11)
  model = randomized(sequential(lambda: layer(H))(), 11)
  x = inputs_for("lstm", 3, T)
  expected_outputs = model(x)
  model.output_names = ["output_0"]
  proto = from_keras(lambda m: tf2onnx.convert.from_keras(m)[0], model,
                     functional=False)
  assert op_counts(proto).get("LSTM") == 1, op_counts(proto)
  session = ort.InferenceSession(proto.SerializeToString(),
                                 providers=["CPUExecutionProvider"])
  (got,) = session.run(None, {session.get_inputs()[0].name: x})
  np.testing.assert_allclose(got, expected_outputs, rtol=0, atol=TOLERANCE)
