"""Round trips of the linear recurrent layers (MinGRU, MinLSTM,
GriffinBlock, RGLRU in one model): tf.train.Checkpoint (into a built model
and deferred), .keras, .weights.h5, the streaming SavedModel (whole
sequences and one step at a time, reloaded by tf.saved_model.load), its
one-step signature converted to TFLite and to ONNX (tf2onnx,
onnxruntime): every one gives the model's numbers."""

import contextlib
import io

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from conftest import tflite_unavailable_reason

B, T, D, H = 2, 7, 3, 4


def make_model():
  return keras.Sequential([
      keras.Input((None, D)),
      tf_recurrent.MinGRU(H, return_sequences=True, chunk_size=3),
      tf_recurrent.MinLSTM(H, return_sequences=True),
      tf_recurrent.GriffinBlock(H, lru_width=5, return_sequences=True),
      tf_recurrent.RGLRU(H, return_sequences=True),
      keras.layers.Dense(2),
  ])


@pytest.fixture(scope="module")
def model():
  model = make_model()
  rng = np.random.default_rng(0)
  model.set_weights([rng.normal(size=w.shape).astype(np.float32) * 0.5 +
                     (2.0 if "decay" in w.path else 0.0)
                     for w in model.weights])
  return model


@pytest.fixture(scope="module")
def inputs():
  return tf.constant(np.random.default_rng(1).normal(size=(B, T, D)),
                     tf.float32)


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
  path = str(tmp_path_factory.mktemp("linear") / "streaming")
  tf_recurrent.export_saved_model(model, path)
  return path


@pytest.fixture(scope="module")
def loaded(exported):
  """The streaming SavedModel reloaded, once for the tests that serve it."""
  return tf.saved_model.load(exported)


def assert_same(got, want, tol=0.0):
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol,
                             atol=tol)


@pytest.mark.parametrize("deferred", [False, True])
def test_checkpoint_restores(model, inputs, tmp_path, deferred):
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  fresh = make_model() if not deferred else keras.Sequential([
      tf_recurrent.MinGRU(H, return_sequences=True, chunk_size=3),
      tf_recurrent.MinLSTM(H, return_sequences=True),
      tf_recurrent.GriffinBlock(H, lru_width=5, return_sequences=True),
      tf_recurrent.RGLRU(H, return_sequences=True), keras.layers.Dense(2)])
  status = tf.train.Checkpoint(model=fresh).read(path)
  assert_same(fresh(inputs), model(inputs))  # Deferred: restored at build.
  status.assert_existing_objects_matched()


def test_keras_file_and_weights_h5(model, inputs, tmp_path):
  model.save(tmp_path / "model.keras")
  loaded = keras.models.load_model(tmp_path / "model.keras")
  assert_same(loaded(inputs), model(inputs))
  assert [l.get_config() for l in loaded.layers] == [
      l.get_config() for l in model.layers]
  model.save_weights(tmp_path / "model.weights.h5")
  fresh = make_model()
  fresh.load_weights(tmp_path / "model.weights.h5")
  assert_same(fresh(inputs), model(inputs))


def stepped(step, initial, x):
  """Outputs of feeding `x`'s steps one at a time to `step(inputs,
  states) -> (output, states)`."""
  states, outputs = initial, []
  for t in range(x.shape[1]):
    output, states = step(x[:, t], states)
    outputs.append(output)
  return np.stack(outputs, 1)


def test_saved_model_serves_sequences_and_steps(model, inputs, loaded):
  """The one-step signature starts from each layer's own initial state:
  minGRU's and minLSTM's g(0) = 0.5, not zeros."""
  assert_same(loaded.signatures["serve"](inputs=inputs)["output"],
              model(inputs), tol=1e-6)
  initial = loaded.signatures["initial_state"](batch_size=tf.constant(B))
  names = sorted(initial, key=lambda k: int(k.split("_")[1]))

  def step(x_t, states):
    out = loaded.signatures["step"](inputs=x_t, **states)
    return out["output"], {k: out[k] for k in names}

  assert_same(stepped(step, initial, inputs), model(inputs), tol=1e-5)


def test_tflite_steps_the_saved_model_step(model, inputs, exported, loaded):
  """The SavedModel's step signature converts to builtin TFLite ops only
  (the whole-sequence call does not: its loop writes in place) and steps
  from the initial_state signature's state."""
  if tflite_unavailable_reason():
    pytest.skip(tflite_unavailable_reason())
  converter = tf.lite.TFLiteConverter.from_saved_model(
      exported, signature_keys=["step"])
  with contextlib.redirect_stdout(io.StringIO()):
    flatbuffer = converter.convert()
  ops = tf_recurrent.tflite.op_names(flatbuffer)
  assert not [op for op in ops if op.startswith("Flex")], ops
  runner = tf.lite.Interpreter(
      model_content=flatbuffer).get_signature_runner()
  initial = {k: v.numpy() for k, v in loaded.signatures["initial_state"](
      batch_size=tf.constant(B)).items()}

  def step(x_t, states):
    out = runner(inputs=np.asarray(x_t), **states)
    return out["output"], {k: v for k, v in out.items() if k != "output"}

  assert_same(stepped(step, initial, inputs), model(inputs), tol=1e-5)


def test_onnx_steps_with_a_dynamic_batch(model, inputs):
  tf2onnx = pytest.importorskip("tf2onnx")
  onnxruntime = pytest.importorskip("onnxruntime")
  module = tf_recurrent.StreamingModule(model)
  signature = module.step.input_signature
  names = [s.name for s in signature[1:]]

  # tf2onnx cannot name an output as an input: the states come back as
  # next_state_i.
  @tf.function(input_signature=signature, autograph=False)
  def step_fn(inputs, *states):
    out = module.step(inputs, *states)
    return {"output": out["output"],
            **{f"next_{k}": out[k] for k in names}}

  with contextlib.redirect_stdout(io.StringIO()):
    proto, _ = tf2onnx.convert.from_function(
        step_fn, input_signature=signature, opset=17)
  session = onnxruntime.InferenceSession(proto.SerializeToString())
  outputs = [o.name for o in session.get_outputs()]
  for batch in (B, 1):
    x = inputs[:batch]
    initial = {k: v.numpy() for k, v in
               module.initial_state(tf.constant(batch)).items()}

    def step(x_t, states):
      values = dict(zip(outputs, session.run(
          None, {"inputs": np.asarray(x_t), **states})))
      return values["output"], {k: values[f"next_{k}"] for k in names}

    assert_same(stepped(step, initial, x), model(x), tol=1e-5)
