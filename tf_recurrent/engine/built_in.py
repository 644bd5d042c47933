"""The Keras cells the chunked loops run, and their run on those loops.

`BUILT_IN_CELLS` maps a Keras cell class (the exact class: a subclass may
compute something else) to a `BuiltInCell`, which tells the engine the
cell's `tf_recurrent.chunked` kind and what else `sequence.run` takes from
it; `find` says whether a cell instance is plain enough (its activations)
to run there. Keras's LSTM, GRU, SimpleRNN and ConvLSTM cells are here;
`tf_recurrent.layers`' peephole, layer-norm, projection and zoneout cells
add theirs. `run` is the chunked loop pair's call for such a cell, with
Keras's dropout masks, its `data_format`, its mixed-precision weights.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import keras
from keras.src import backend as keras_backend
from keras.src.layers.rnn import conv_lstm as keras_conv_lstm
import tensorflow as tf

from tf_recurrent.chunked import convolutional
from tf_recurrent.chunked import sequence
from tf_recurrent.engine import inference
from tf_recurrent.op import masks


def no_extras(*args) -> Dict[str, Any]:
  """No extra weights, options or run inputs (`BuiltInCell`'s default)."""
  del args
  return {}


def _never(cell) -> bool:
  """`BuiltInCell.channels_first`'s default."""
  del cell
  return False


def gru_kind(cell) -> str:
  """The chunked kind of a Keras GRU cell, by its `reset_after`."""
  return "gru" if cell.reset_after else "gru_reset_before"


@dataclasses.dataclass(frozen=True)
class BuiltInCell:
  """A Keras cell class the engine runs on the chunked loop pair.

  Attributes:
    kind: The cell's `tf_recurrent.chunked` kind, given the cell.
    plain: Attribute values the cell must have (its activations).
    extra_weights: The cell's weights `sequence.run` takes besides the
      kernels and biases, by name, given the cell.
    options: More keyword arguments of `sequence.run` (`norm_epsilon`),
      given the cell.
    run_inputs: Per-call tensor arguments of `sequence.run` (`zoneout`
      masks), given the cell, the number of steps, the initial state and
      `training`.
    channels_first: Whether the cell's maps have their channels first
      (ConvLSTM's `data_format`; the loops take them last), given the cell.
  """
  kind: Callable[[Any], str]
  plain: Dict[str, Any]
  extra_weights: Callable[[Any], Dict[str, Any]] = no_extras
  options: Callable[[Any], Dict[str, Any]] = no_extras
  run_inputs: Callable[..., Dict[str, Any]] = no_extras
  channels_first: Callable[[Any], bool] = _never


KERAS_GATES = {"activation": keras.activations.tanh,
               "recurrent_activation": keras.activations.sigmoid}


def _conv_geometry(cell) -> convolutional.Geometry:
  """A built Keras ConvLSTM cell's input convolution."""
  geometry = convolutional.Geometry(
      tuple(cell.kernel_size), tuple(cell.strides), cell.padding,
      tuple(cell.dilation_rate), tuple(cell.spatial_dims))
  geometry.check()
  return geometry


# The cells run by the chunked loops, by Keras cell class.
BUILT_IN_CELLS = {
    keras.layers.LSTMCell: BuiltInCell(lambda cell: "lstm", KERAS_GATES),
    keras.layers.GRUCell: BuiltInCell(gru_kind, KERAS_GATES),
    keras.layers.SimpleRNNCell: BuiltInCell(
        lambda cell: "simple_rnn", {"activation": keras.activations.tanh}),
    keras_conv_lstm.ConvLSTMCell: BuiltInCell(
        lambda cell: "conv_lstm", KERAS_GATES,
        options=lambda cell: {"geometry": _conv_geometry(cell)},
        channels_first=lambda cell: cell.data_format == "channels_first"),
}


def find(cell) -> Optional[BuiltInCell]:
  """The `BuiltInCell` of a plain built-in cell, or None."""
  spec = BUILT_IN_CELLS.get(type(cell))
  if spec is None or any(getattr(cell, k, None) != v
                         for k, v in spec.plain.items()):
    return None
  return spec


def fuses_as_lstm(cell) -> bool:
  """Whether TFLite's fused LSTM computes the cell: a plain
  `keras.layers.LSTMCell`, or an LSTM kind whose one extra weight is a
  projection (which `tflite.convert` gives the fused op); not peepholes,
  norms or zoneout."""
  spec = find(cell)
  if spec is None or spec.kind(cell) != "lstm" or (
      spec.run_inputs is not no_extras):
    return False
  return type(cell) is keras.layers.LSTMCell or (
      set(spec.extra_weights(cell)) == {"projection"})


def fused_kind(cell) -> Optional[str]:
  """The fused op a converter can make of the cell's inference loop:
  "lstm" (`fuses_as_lstm`), "gru" for a plain `keras.layers.GRUCell` with
  `reset_after` (ONNX's `GRU` op; TFLite has none), or None.

  Example:

  >>> [fused_kind(c) for c in (keras.layers.LSTMCell(2),
  ...                          keras.layers.GRUCell(2),
  ...                          keras.layers.GRUCell(2, reset_after=False),
  ...                          keras.layers.SimpleRNNCell(2))]
  ['lstm', 'gru', None, None]
  """
  if fuses_as_lstm(cell):
    return "lstm"
  spec = find(cell)
  if (type(cell) is keras.layers.GRUCell and spec is not None and
      spec.kind(cell) == "gru"):
    return "gru"
  return None


def _variable_dtype_value(variable) -> tf.Tensor:
  """A Keras weight read in its own (variable) dtype.

  Inside a layer's call under a mixed-precision policy Keras casts every
  float weight it reads to the compute dtype. The built-in steps cast the
  weights themselves, inside every step, so that the op sums their
  gradients over the steps in the variable's float32, not in bfloat16.
  """
  with keras_backend.AutocastScope(None):
    return tf.convert_to_tensor(variable)


def _steps(x: tf.Tensor, time_axis: int):
  """x's number of steps: a Python int where known while tracing."""
  static = x.shape[time_axis]
  return static if static is not None else tf.shape(x)[time_axis]


def _channels_to(t: tf.Tensor, leading: int, last: bool) -> tf.Tensor:
  """`[*leading, C, *spatial]` maps as `[*leading, *spatial, C]` (or back
  with `last=False`)."""
  rank = t.shape.rank
  spatial = list(range(leading + 1, rank)) if last else list(
      range(leading, rank - 1))
  channels = [leading] if last else [rank - 1]
  order = (list(range(leading)) + spatial + channels if last else
           list(range(leading)) + channels + spatial)
  return tf.transpose(t, order)


def _gate_masks(mask) -> Optional[tf.Tensor]:
  """A Keras cell's dropout mask as `sequence.run` takes it: its per-gate
  list (`implementation=1`) as `[gates, B, F]`, or one `[B, F]` mask for
  every gate (recurrent dropout before Keras 3.6)."""
  if isinstance(mask, (list, tuple)):
    return tf.stack(mask)
  return mask


def _sequence_weights(cell, spec: BuiltInCell) -> Dict[str, tf.Tensor]:
  """The cell's weights as `sequence.run` takes them, in their variable
  dtype: under a mixed precision policy the loops cast them and sum their
  gradients in float32."""
  kind = spec.kind(cell)
  weights = {"kernel": _variable_dtype_value(cell.kernel),
             "recurrent_kernel": _variable_dtype_value(cell.recurrent_kernel)}
  width = weights["recurrent_kernel"].shape[-1]
  bias_shape = [2, width] if kind == "gru" else [width]
  bias = (_variable_dtype_value(cell.bias) if cell.use_bias
          else tf.zeros(bias_shape, weights["kernel"].dtype))
  if kind == "gru":  # Keras's [input bias, recurrent bias] rows.
    weights["bias"], weights["recurrent_bias"] = bias[0], bias[1]
  else:
    weights["bias"] = bias
  for name, variable in spec.extra_weights(cell).items():
    if isinstance(variable, (list, tuple)):  # Rows kept as weights apart.
      weights[name] = tf.stack([_variable_dtype_value(v) for v in variable])
    else:
      weights[name] = _variable_dtype_value(variable)
  return weights


def run(cell, spec: BuiltInCell, x: tf.Tensor,
        initial_state: Sequence[tf.Tensor], mask: Optional[tf.Tensor],
        training: Any, recompute: bool, time_major: bool,
        zero_output_for_mask: bool
        ) -> Tuple[tf.Tensor, List[tf.Tensor], tf.Tensor]:
  """A plain built-in cell on `tf_recurrent.chunked`'s loop pair.

  Args:
    cell: The Keras cell, `find(cell)` being `spec`.
    spec: Its `BuiltInCell`.
    x: The `[B, T, ...]` inputs (`[T, B, ...]` if time_major).
    initial_state: The state list.
    mask: A time-major `[T, B]` bool mask, or None.
    training: Keras's training flag.
    recompute: Keep only the outputs per step.
    time_major: The layout of x and of the outputs.
    zero_output_for_mask: Whether a masked step emits zeros (else the
      previous output, Keras's default).

  Returns:
    (outputs, final states, last output).
  """
  kind = spec.kind(cell)
  dtype = cell.compute_dtype
  x = tf.cast(x, dtype)
  state0 = [tf.cast(s, dtype) for s in initial_state]
  # Keras drew the sequence's dropout masks before the loop (RNN.call):
  # one input mask for all gates, or with `implementation=1` (which
  # recurrent dropout implies from Keras 3.6) one per gate for the inputs
  # and for h.
  time_axis = 0 if time_major else 1
  dropout = {}
  if training and 0 < cell.dropout < 1:
    input_mask = cell.get_dropout_mask(tf.gather(x, 0, axis=time_axis))
    if isinstance(input_mask, (list, tuple)):
      dropout["inputs"] = _gate_masks(input_mask)
    else:  # The same mask for every step.
      x = x * tf.expand_dims(tf.cast(input_mask, dtype), time_axis)
  if training and 0 < cell.recurrent_dropout < 1:
    dropout["recurrent"] = _gate_masks(
        cell.get_recurrent_dropout_mask(state0[0]))
  channels_first = spec.channels_first(cell)
  if channels_first:  # The masks drawn as Keras draws them, then moved.
    x = _channels_to(x, 2, last=True)
    state0 = [_channels_to(s, 1, last=True) for s in state0]
    dropout = {k: _channels_to(m, 2, last=True) for k, m in dropout.items()}
  # A call no tape records (predict, evaluate, a serving signature) keeps
  # nothing per step; `tf.gradients` of its graph still gets the right
  # gradient, recomputed.
  recompute = recompute or inference.no_tape_records(training)
  carried, final = sequence.run(
      kind, x, state0, _sequence_weights(cell, spec), recompute=recompute,
      mask=mask, dropout=dropout, time_major=time_major,
      **spec.options(cell),
      **spec.run_inputs(cell, _steps(x, time_axis), state0, training))
  if channels_first:
    carried = _channels_to(carried, 2, last=False)
    final = [_channels_to(s, 1, last=False) for s in final]
  if mask is None:
    # The last output is h after the last step, the loop's final h: read
    # there, a model that uses only the last output leaves the outputs
    # without a gradient, and the backward pass adds no [T, B, H] zeros.
    return carried, final, final[0]
  # A masked step's row is the carried h; Keras emits the previous output
  # (zeros before the first unmasked step), or zeros with
  # zero_output_for_mask.
  emitted = mask if zero_output_for_mask else tf.cast(
      tf.cumsum(tf.cast(mask, tf.int32), axis=0), tf.bool)
  if not time_major:
    emitted = tf.transpose(emitted)
  outputs = tf.where(masks.expand(emitted, carried), carried,
                     tf.zeros_like(carried))
  return outputs, final, tf.gather(outputs, tf.shape(outputs)[time_axis] -
                                   1, axis=time_axis)
