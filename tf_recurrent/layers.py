"""Keras drop-ins: `RNN`, `LSTM` and `GRU` whose loop is `tf_recurrent.recurrent`.

Each layer is the Keras layer of the same name with one method replaced:
`inner_loop`, the part of `keras.layers.RNN.call` that iterates over time.
Everything else (constructor arguments, `initial_state`, `stateful`, masks,
dropout-mask setup, `get_config`) is Keras's own, so swapping
`keras.layers.LSTM` for `tf_recurrent.LSTM` changes nothing but the loop and
its memory.

Plain LSTMCell and GRUCell configurations take the built-in steps of
`tf_recurrent.cells` (hand-written gradients, input projection hoisted out of
the loop; with `recompute=True`, projection and gates recomputed in the
backward pass instead of kept); any other cell runs as it is, its weights
getting gradients through the op's captured-variable support.
"""

from typing import Any, Optional

import keras
from keras.src import backend as keras_backend
import tensorflow as tf

from tf_recurrent import cells
from tf_recurrent import masks
from tf_recurrent import op
from tf_recurrent import structs


def _check_initial_state(layer, initial_state):
  """The initial state must have one tensor per entry of cell.state_size."""
  state_size = layer.cell.state_size
  want = len(tf.nest.flatten(state_size))
  got = tf.nest.flatten(initial_state)
  if len(got) != want:
    raise ValueError(
        f"{layer.name}: initial_state must hold {want} tensor(s) for a cell "
        f"with state_size={state_size}; got {len(got)}.")
  for i, (size, tensor) in enumerate(zip(tf.nest.flatten(state_size), got)):
    if isinstance(size, int) and tensor.shape.rank is not None and (
        tensor.shape[-1] not in (None, size)):
      raise ValueError(
          f"{layer.name}: initial_state[{i}] must have last dimension {size}; "
          f"got shape {tensor.shape}.")


def _variable_dtype_value(variable) -> tf.Tensor:
  """A Keras weight read in its own (variable) dtype.

  Inside a layer's call under a mixed-precision policy Keras casts every
  float weight it reads to the compute dtype. The built-in steps cast the
  weights themselves, inside every step, so that the op sums their
  gradients over the steps in the variable's float32, not in bfloat16.
  """
  with keras_backend.AutocastScope(None):
    return tf.convert_to_tensor(variable)


def _is_plain(cell, cell_type, **attrs) -> bool:
  if type(cell) is not cell_type:  # pylint: disable=unidiomatic-typecheck
    return False
  if cell.activation is not keras.activations.tanh or (
      cell.recurrent_activation is not keras.activations.sigmoid):
    return False
  return all(getattr(cell, k) == v for k, v in attrs.items())


class _DropoutMasks:
  """Pins the dropout masks Keras drew before the loop, for every later call.

  `keras.layers.RNN.call` draws each cell's dropout masks once per sequence
  and clears them after the loop. The gradient recomputes steps later, after
  the clearing; re-installing the very same mask tensors around each cell
  call makes the recompute see the forward pass's masks instead of drawing
  new ones.
  """

  _ATTRS = ("_dropout_mask", "_recurrent_dropout_mask")

  def __init__(self, cell):
    cells_ = list(getattr(cell, "cells", [])) + [cell]
    self._saved = [(c, attr, getattr(c, attr)) for c in cells_
                   for attr in self._ATTRS if getattr(c, attr, None) is not None]
    self._previous = []

  def __enter__(self):
    self._previous = [(c, attr, getattr(c, attr)) for c, attr, _ in self._saved]
    for c, attr, mask in self._saved:
      setattr(c, attr, mask)

  def __exit__(self, *exc):
    for c, attr, value in self._previous:
      setattr(c, attr, value)


class _RecurrentLoop:
  """Mixin replacing `keras.layers.RNN.inner_loop` by `tf_recurrent.recurrent`.

  Adds one constructor argument to Keras's: `recompute` (default False).
  False keeps, per time step, what the backward pass of a plain LSTM/GRU
  cell reads (the gates, the projected inputs): the fastest gradient. True
  keeps only the state and recomputes the rest step by step in the backward
  pass: about 4x less memory per step for about 10-20% more time. Other
  cells always recompute (their gradient is autodiff of the cell, per step).
  """

  def __init__(self, *args, recompute: bool = False, **kwargs):
    super().__init__(*args, **kwargs)
    if not isinstance(recompute, bool):
      raise TypeError(f"recompute must be a bool; got {recompute!r}.")
    self.recompute = recompute

  def get_config(self):
    return {**super().get_config(), "recompute": self.recompute}

  def inner_loop(self, sequences, initial_state, mask, training=False):
    """Runs the cell over time; returns (last_output, outputs, states)."""
    if tf.nest.is_nested(mask):
      mask = tf.nest.flatten(mask)[0]
    x = structs.swap_batch_and_time(sequences, "inputs")
    if mask is not None:
      mask = tf.convert_to_tensor(mask)
      if mask.shape.rank != 2:
        raise ValueError(
            f"{self.name}: mask must have shape [batch, time]; got shape "
            f"{mask.shape} for inputs of shape {tf.nest.flatten(sequences)[0].shape}.")
      if not mask.shape.is_compatible_with(tf.nest.flatten(sequences)[0].shape[:2]):
        raise ValueError(
            f"{self.name}: mask shape {mask.shape} does not match the inputs' "
            f"[batch, time] = {tf.nest.flatten(sequences)[0].shape[:2]}.")
      mask = tf.transpose(tf.cast(mask, tf.bool))
    if self.go_backwards:
      x = tf.nest.map_structure(lambda t: tf.reverse(t, [0]), x)
      mask = None if mask is None else tf.reverse(mask, [0])
    if not tf.nest.is_nested(initial_state):
      initial_state = [initial_state]
    _check_initial_state(self, initial_state)
    fast = self._fast_loop(x, initial_state, mask, training)
    if fast is not None:
      outputs, final_states, last_output = fast
    else:
      outputs, final_states, last_output = self._generic_loop(
          x, initial_state, mask, training)
    outputs = structs.swap_batch_and_time(outputs, "outputs")
    return last_output, outputs, final_states

  def _generic_loop(self, x, initial_state, mask, training):
    """Any Keras cell: its call is the cell_fn, autodiff-recomputed per step."""
    cell = self.cell
    kwargs = {}
    if isinstance(cell, keras.layers.Layer) and cell._call_has_training_arg:  # pylint: disable=protected-access
      kwargs["training"] = training
    batch = tf.shape(tf.nest.flatten(initial_state)[0])[0]
    output_size = getattr(cell, "output_size", None)
    if isinstance(output_size, int):
      zero_output = tf.zeros([batch, output_size], self.cell.compute_dtype)
    else:
      zero_output = tf.zeros_like(tf.nest.flatten(initial_state)[0])
    zero_output_for_mask = self.zero_output_for_mask
    pin_masks = _DropoutMasks(cell)

    def cell_fn(theta, state, inputs_t):
      del theta
      with pin_masks:
        output, new_states = cell(inputs_t["x"], state["cell"], **kwargs)
      if not tf.nest.is_nested(new_states):
        new_states = [new_states]
      new_states = tf.nest.pack_sequence_as(state["cell"],
                                            tf.nest.flatten(new_states))
      if "mask" in inputs_t:
        keep = inputs_t["mask"]
        fallback = (tf.zeros_like(output) if zero_output_for_mask
                    else state["output"])
        output = masks.select(keep, output, fallback)
        new_states = tf.nest.map_structure(
            lambda n, o: masks.select(keep, n, o), new_states, state["cell"])
      return {"cell": new_states, "output": output}, []

    inputs = {"x": x}
    if mask is not None:
      inputs["mask"] = mask
    state0 = {"cell": list(initial_state), "output": zero_output}
    # Only the outputs are read per step; the cell states' rows get no
    # gradient tensor (see recurrent's accumulate_state).
    per_step = {"cell": tf.nest.map_structure(lambda _: False, state0["cell"]),
                "output": True}
    acc, final = op.recurrent({}, state0, inputs, cell_fn,
                                         accumulate_state=per_step)
    return acc["output"], list(final["cell"]), final["output"]

  def _fast_loop(self, x, initial_state, mask, training):
    """Plain LSTMCell/GRUCell: built-in steps with hand-written gradients."""
    cell = self.cell
    if tf.nest.is_nested(x):
      return None
    if _is_plain(cell, keras.layers.LSTMCell, recurrent_dropout=0.0):
      step, grad = cells.lstm_step, cells.lstm_grad
      width = 4 * cell.units
    elif _is_plain(cell, keras.layers.GRUCell, recurrent_dropout=0.0,
                   reset_after=True):
      step, grad = cells.gru_step, cells.gru_grad
      width = 3 * cell.units
    else:
      return None
    dtype = cell.compute_dtype
    x = tf.cast(x, dtype)
    if training and 0 < cell.dropout < 1:
      # Keras applies one input-dropout mask, drawn per sequence, to all
      # gates; it was drawn before the loop (RNN.call).
      x = x * tf.cast(cell.get_dropout_mask(x[0]), dtype)
    # The weights stay in their variable dtype: under a mixed precision
    # policy the steps cast them, and the op sums their gradients over the
    # steps in float32.
    kernel = _variable_dtype_value(cell.kernel)
    recurrent_kernel = _variable_dtype_value(cell.recurrent_kernel)
    if cell.use_bias:
      bias = _variable_dtype_value(cell.bias)
    else:
      bias = tf.zeros([2, width] if step is cells.gru_step else [width],
                      recurrent_kernel.dtype)
    if step is cells.lstm_step:
      theta = {"recurrent_kernel": recurrent_kernel}
      input_bias = bias
      state0 = {"h": initial_state[0], "c": initial_state[1]}
    else:
      theta = {"recurrent_kernel": recurrent_kernel, "recurrent_bias": bias[1]}
      input_bias = bias[0]
      state0 = {"h": initial_state[0]}
    lstm = step is cells.lstm_step
    if self.recompute:
      theta = {"cell": theta, "kernel": kernel, "bias": input_bias}
      step, grad = cells.recomputing(step, grad)
      inputs = x
    else:
      inputs = cells.project_inputs(x, tf.cast(kernel, dtype),
                                    tf.cast(input_bias, dtype))
    state0 = tf.nest.map_structure(lambda s: tf.cast(s, dtype), state0)
    # Only h is read per step; c's rows get no gradient tensor.
    per_step = {"h": True, "c": False} if lstm else {"h": True}
    if mask is None:
      acc, final = op.recurrent(theta, state0, inputs, step, grad,
                                           accumulate_state=per_step)
      outputs = acc["h"]
    else:
      masked_step, masked_grad = cells.masked(step, grad)
      acc, final = op.recurrent(
          theta, state0, {"x": inputs, "mask": mask}, masked_step,
          masked_grad, accumulate_state=per_step)
      # Keras emits the previous output at a masked step (zeros before the
      # first unmasked one), or zeros with zero_output_for_mask.
      emitted = mask if self.zero_output_for_mask else tf.cast(
          tf.cumsum(tf.cast(mask, tf.int32), axis=0), tf.bool)
      outputs = tf.where(emitted[:, :, None], acc["h"], tf.zeros_like(acc["h"]))
    last_output = outputs[-1]
    states = [final["h"], final["c"]] if lstm else [final["h"]]
    return outputs, states, last_output


@keras.saving.register_keras_serializable(package="tf_recurrent")
class RNN(_RecurrentLoop, keras.layers.RNN):
  """`keras.layers.RNN` whose loop is `tf_recurrent.recurrent`.

  Takes the arguments of `keras.layers.RNN` (`cell`, `return_sequences`,
  `return_state`, `go_backwards`, `stateful`, `unroll` (accepted; the loop is
  never unrolled), `zero_output_for_mask`) and behaves the same, but the
  backward pass keeps only per-step states. `recompute=True` matters only
  for a plain LSTMCell/GRUCell (see `LSTM`).

  Example:

  >>> import keras
  >>> import tf_recurrent
  >>> layer = tf_recurrent.RNN(keras.layers.SimpleRNNCell(4),
  ...                          return_sequences=True)
  >>> layer(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 4])
  """


@keras.saving.register_keras_serializable(package="tf_recurrent")
class LSTM(_RecurrentLoop, keras.layers.LSTM):
  """`keras.layers.LSTM` on `tf_recurrent.recurrent` with a hand-written gradient.

  Example:

  >>> import tf_recurrent
  >>> tf_recurrent.LSTM(8)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 8])

  For long sequences, `recompute=True` keeps only the state per step:

  >>> lean = tf_recurrent.LSTM(8, return_sequences=True, recompute=True)
  >>> lean(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 8])
  """


@keras.saving.register_keras_serializable(package="tf_recurrent")
class GRU(_RecurrentLoop, keras.layers.GRU):
  """`keras.layers.GRU` on `tf_recurrent.recurrent` with a hand-written gradient.

  Example:

  >>> import tf_recurrent
  >>> tf_recurrent.GRU(8, return_sequences=True)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 8])
  >>> tf_recurrent.GRU(8, recompute=True).get_config()["recompute"]
  True
  """
