"""SavedModel export with a full-sequence and a one-step (streaming) signature.

A server decoding token by token should not re-run the prefix for every new
token. `export` writes a SavedModel of a Keras `Sequential` stack holding
recurrent layers with three signatures:

* `serving_default(inputs)`: the model on whole sequences `[B, T, ...]`
  (dynamic batch and time), returning `{"output": ...}`;
* `initial_state(batch_size)`: each layer's initial state (zeros for
  Keras's cells), `{"state_0": ..., ...}`;
* `step(inputs, state_0, state_1, ...)`: one time step `[B, ...]` from a
  given state, returning `{"output": ..., "state_0": ..., ...}`; fed its own
  states back, it reproduces the full-sequence outputs step by step.

The SavedModel needs neither tf_recurrent nor Keras to load, and keeps the
op's custom gradient, so a reloaded model can be fine-tuned.
"""

import contextlib
import inspect
import io
from typing import List

import keras
import tensorflow as tf


def _recurrent_layers(model: keras.Model) -> List[keras.layers.RNN]:
  layers = [l for l in model.layers if isinstance(l, keras.layers.RNN)]
  if not isinstance(model, keras.Sequential) or not layers:
    raise ValueError(
        "export needs a keras.Sequential holding at least one recurrent "
        f"layer; got {type(model).__name__} with layers "
        f"{[type(l).__name__ for l in model.layers]}.")
  for layer in layers:
    if layer.go_backwards:
      raise ValueError(
          f"{layer.name} has go_backwards=True; a layer that reads the "
          "sequence from its end cannot be served one step at a time.")
  for layer in layers[:-1]:
    if not layer.return_sequences:
      raise ValueError(
          f"{layer.name} feeds another recurrent layer, so it must have "
          "return_sequences=True.")
  return layers


class StreamingModule(tf.Module):
  """A `tf.Module` serving a recurrent `Sequential` whole or step by step.

  Example:

  >>> import keras
  >>> import tf_recurrent
  >>> model = keras.Sequential([keras.Input((None, 3)),
  ...                           tf_recurrent.GRU(4, return_sequences=True)])
  >>> module = StreamingModule(model)
  >>> state = module.initial_state(tf.constant(2))
  >>> out = module.step(tf.ones([2, 3]), state["state_0"])
  >>> out["output"].shape
  TensorShape([2, 4])
  """

  def __init__(self, model: keras.Sequential):
    super().__init__()
    self.model = model
    self._rnns = _recurrent_layers(model)
    self._state_sizes = [
        tf.nest.flatten(layer.cell.state_size) for layer in self._rnns]
    feature_shape = model.inputs[0].shape[2:]
    dtype = model.inputs[0].dtype
    self.serve = tf.function(
        self._serve,
        input_signature=[tf.TensorSpec([None, None] + list(feature_shape),
                                       dtype, name="inputs")])
    self.initial_state = tf.function(
        self._initial_state,
        input_signature=[tf.TensorSpec([], tf.int32, name="batch_size")])
    state_specs = [
        tf.TensorSpec([None, size], self.model.compute_dtype,
                      name=f"state_{i}")
        for i, size in enumerate(s for sizes in self._state_sizes
                                 for s in sizes)]
    self.step = tf.function(
        self._step,
        input_signature=[tf.TensorSpec([None] + list(feature_shape), dtype,
                                       name="inputs")] + state_specs)

  def _checked(self, inputs, shape):
    # Signature wrappers check rank and dtype; the feature size is only met
    # deep inside a matmul, so say it at the door.
    return tf.ensure_shape(inputs, shape, name="inputs_shape_check")

  def _serve(self, inputs):
    inputs = self._checked(inputs, self.serve.input_signature[0].shape)
    return {"output": self.model(inputs, training=False)}

  def _initial_state(self, batch_size):
    # Each layer's own (zeros for Keras's cells; minGRU's g(0) = 0.5).
    flat = [tf.cast(s, self.model.compute_dtype) for layer in self._rnns
            for s in tf.nest.flatten(layer.get_initial_state(batch_size))]
    return {f"state_{i}": s for i, s in enumerate(flat)}

  def _step(self, inputs, *flat_states):
    inputs = self._checked(inputs, self.step.input_signature[0].shape)
    hidden = tf.expand_dims(inputs, 1)  # A sequence of one step.
    flat_states = list(flat_states)
    new_states = []
    for layer in self.model.layers:
      if not isinstance(layer, keras.layers.RNN):
        hidden = layer(hidden, training=False)
        continue
      count = len(tf.nest.flatten(layer.cell.state_size))
      mine, flat_states = flat_states[:count], flat_states[count:]
      state = tf.nest.pack_sequence_as(
          layer.cell.state_size if tf.nest.is_nested(layer.cell.state_size)
          else [layer.cell.state_size], mine)
      output, state = layer.cell(hidden[:, 0], state, training=False)
      new_states += tf.nest.flatten(state)
      hidden = tf.expand_dims(output, 1)
    result = {"output": hidden[:, 0]}
    result.update({f"state_{i}": s for i, s in enumerate(new_states)})
    return result


def export(model: keras.Sequential, directory: str) -> StreamingModule:
  """Saves `model` with full-sequence, initial-state and one-step signatures.

  Writes through `keras.export.ExportArchive`, so the SavedModel also serves
  from TF1-style loaders such as `saved_model_cli run`.

  Args:
    model: A built `keras.Sequential` with recurrent layers (tf_recurrent or
      Keras); the last recurrent layer may return sequences or not.
    directory: Where to write the SavedModel.

  Returns:
    The `StreamingModule` whose functions were saved.

  Raises:
    ValueError: If the model cannot be served step by step.

  Example:

  >>> import tempfile, keras, tf_recurrent
  >>> model = keras.Sequential([keras.Input((None, 3)),
  ...                           tf_recurrent.LSTM(4, return_sequences=True),
  ...                           keras.layers.Dense(1)])
  >>> path = tempfile.mkdtemp()
  >>> _ = export(model, path)
  >>> sorted(tf.saved_model.load(path).signatures)
  ['initial_state', 'serve', 'serving_default', 'step']
  """
  module = StreamingModule(model)
  archive = keras.export.ExportArchive()
  archive.track(model)
  for name in ("serve", "initial_state", "step"):
    function = getattr(module, name)
    archive.add_endpoint(name, function.python_function,
                         function.input_signature)
  options = tf.saved_model.SaveOptions(experimental_custom_gradients=True)
  # Keras before 3.6 has no `verbose`, and before 3.9 prints "Saved artifact
  # at ..." whatever it says: keep the export quiet on every supported Keras.
  quiet = ({"verbose": False} if "verbose" in inspect.signature(
      archive.write_out).parameters else {})
  with contextlib.redirect_stdout(io.StringIO()):
    archive.write_out(directory, options=options, **quiet)
  return module
