"""Keras drop-ins whose time loop is `tf_recurrent.recurrent`.

`RNN`, `LSTM`, `GRU`, `SimpleRNN` and `ConvLSTM1D/2D/3D` are the Keras
layers of the same names, with Keras's own constructor arguments (plus
`recompute`), with one method replaced: `inner_loop`, the part of
`keras.layers.RNN.call` that iterates over time. Everything else
(`initial_state`, `stateful`, masks, dropout-mask setup, `get_config`,
saving) is Keras's own, so swapping `keras.layers.LSTM` for
`tf_recurrent.LSTM` changes nothing but the loop and its memory.

Keras's LSTMCell, GRUCell (either `reset_after`) and SimpleRNNCell with
their default activations run their own chunked loop pair
(`tf_recurrent.sequence`: one sequential GEMM per step each way, two for a
`reset_after=False` GRU, the input projection and weight gradients batched
per chunk of steps, a hand-written gradient), in every configuration:
masks, input and recurrent dropout, `go_backwards`, initial and stateful
states. So does Keras's ConvLSTM cell of every rank, its convolutions
batched over chunks of frames like the LSTM's GEMMs. With
`recompute=True` the gates are rebuilt in the backward pass instead of
kept. Any other cell (another activation, a user's cell) runs as it is on
`tf_recurrent.recurrent`, recomputed step by step in the backward pass, its
weights getting gradients through the op's captured-variable support.

Options a user sets are honoured or refused, never dropped: `unroll=True`
runs Keras's own unrolled loop; `use_cudnn=True` (LSTM, GRU) runs Keras's
own inner loop, its cuDNN kernel on a GPU, which keeps every activation of
every step for the backward pass, and where cuDNN cannot run (no GPU,
recurrent dropout, another activation, ...) raises Keras's own error at the
call; "auto" (the default) and False run tf_recurrent's loop. Unlike
Keras's, the layers keep `use_cudnn` in `get_config`.
"""

import dataclasses
from typing import Any, Callable, Dict, Optional, Union

import keras
from keras.src import backend as keras_backend
from keras.src.layers.rnn import conv_lstm as keras_conv_lstm
import tensorflow as tf

from tf_recurrent import convolutional
from tf_recurrent import masks
from tf_recurrent import op
from tf_recurrent import sequence
from tf_recurrent import step_clusters
from tf_recurrent import structs
from tf_recurrent import tflite


def _check_initial_state(layer, initial_state):
  """The initial state must have one tensor per entry of cell.state_size."""
  state_size = layer.cell.state_size
  sizes = tf.nest.flatten(state_size)
  if not all(isinstance(s, int) and s > 0 for s in sizes):
    return  # A cell that sizes its state itself (ConvLSTM's -1).
  got = tf.nest.flatten(initial_state)
  if len(got) != len(sizes):
    raise ValueError(
        f"{layer.name}: initial_state must hold {len(sizes)} tensor(s) for a "
        f"cell with state_size={state_size}; got {len(got)}.")
  for i, (size, tensor) in enumerate(zip(sizes, got)):
    if tensor.shape.rank is not None and tensor.shape[-1] not in (None, size):
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


def _nothing(*args) -> Dict[str, Any]:
  """No extra weights, options or run inputs (`BuiltInCell`'s default)."""
  del args
  return {}


def _never(cell) -> bool:
  """`BuiltInCell.channels_first`'s default."""
  del cell
  return False


def gru_kind(cell) -> str:
  """The sequence kind of a Keras GRU cell, by its `reset_after`."""
  return "gru" if cell.reset_after else "gru_reset_before"


@dataclasses.dataclass(frozen=True)
class BuiltInCell:
  """A Keras cell class the layers run on the chunked loop pair.

  Attributes:
    kind: The cell's `tf_recurrent.sequence` kind, given the cell.
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
  extra_weights: Callable[[Any], Dict[str, Any]] = _nothing
  options: Callable[[Any], Dict[str, Any]] = _nothing
  run_inputs: Callable[..., Dict[str, Any]] = _nothing
  channels_first: Callable[[Any], bool] = _never


KERAS_GATES = {"activation": keras.activations.tanh,
                "recurrent_activation": keras.activations.sigmoid}

# The cells run by `tf_recurrent.sequence`, by Keras cell class (the exact
# class: a subclass may compute something else). `tf_recurrent.peephole`,
# `layer_norm`, `projection` and `zoneout` add theirs.
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


def _steps(x: tf.Tensor, time_axis: int):
  """x's number of steps: a Python int where known while tracing."""
  static = x.shape[time_axis]
  return static if static is not None else tf.shape(x)[time_axis]


def _conv_geometry(cell) -> convolutional.Geometry:
  """A built Keras ConvLSTM cell's input convolution."""
  geometry = convolutional.Geometry(
      tuple(cell.kernel_size), tuple(cell.strides), cell.padding,
      tuple(cell.dilation_rate), tuple(cell.spatial_dims))
  geometry.check()
  return geometry


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


def _fuses_as_lstm(cell) -> bool:
  """Whether TFLite's fused LSTM computes the cell: a plain
  `keras.layers.LSTMCell`, or an LSTM kind whose one extra weight is a
  projection (which `tflite.convert` gives the fused op); not peepholes,
  norms or zoneout."""
  spec = _built_in(cell)
  if spec is None or spec.kind(cell) != "lstm" or (
      spec.run_inputs is not _nothing):
    return False
  return type(cell) is keras.layers.LSTMCell or (
      set(spec.extra_weights(cell)) == {"projection"})


def _built_in(cell) -> Optional[BuiltInCell]:
  """The `BuiltInCell` of a plain built-in cell, or None."""
  spec = BUILT_IN_CELLS.get(type(cell))
  if spec is None or any(getattr(cell, k, None) != v
                         for k, v in spec.plain.items()):
    return None
  return spec


def _gate_masks(mask) -> Optional[tf.Tensor]:
  """A Keras cell's dropout mask as `sequence.run` takes it: its per-gate
  list (`implementation=1`) as `[gates, B, F]`, or one `[B, F]` mask for
  every gate (recurrent dropout before Keras 3.6)."""
  if isinstance(mask, (list, tuple)):
    return tf.stack(mask)
  return mask


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
  False keeps, per time step, what the backward pass of a plain
  LSTM/GRU/SimpleRNN cell reads besides the outputs (an LSTM's gate
  activations and c, a GRU's gates; a SimpleRNN nothing): the fastest
  gradient. True keeps only the outputs and rebuilds the gates per chunk
  in the backward pass, for more time (benchmarks/RESULTS.md). Other cells
  always recompute (their gradient is autodiff of the cell, per step).
  """

  def _set_recompute(self, recompute: bool):
    if not isinstance(recompute, bool):
      raise TypeError(f"recompute must be a bool; got {recompute!r}.")
    self.recompute = recompute

  def get_config(self):
    config = {**super().get_config(), "recompute": self.recompute}
    if hasattr(self, "use_cudnn"):
      # Keras leaves it out (a saved use_cudnn=True comes back "auto");
      # kept here, so a saved layer runs the loop it ran.
      config["use_cudnn"] = self.use_cudnn
    return config

  def inner_loop(self, sequences, initial_state, mask, training=False):
    """Runs the cell over time; returns (last_output, outputs, states)."""
    if (getattr(self, "unroll", False) or
        getattr(self, "use_cudnn", None) is True):
      # Asked for by name: Keras's own unrolled loop (static T), which
      # keeps every step's activations for its gradient; or Keras's own
      # inner loop with its cuDNN kernel, which raises Keras's own error
      # where cuDNN cannot run.
      return super().inner_loop(sequences, initial_state, mask, training)
    if tf.nest.is_nested(mask):
      mask = tf.nest.flatten(mask)[0]
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
      # Time-major, [T, B], as the loops take it (a bool per step: small).
      mask = tf.transpose(tf.cast(mask, tf.bool))
    # Batch-major, as Keras passes them.
    x = sequences
    if self.go_backwards:
      x = tf.nest.map_structure(lambda t: tf.reverse(t, [1]), x)
      mask = None if mask is None else tf.reverse(mask, [0])
    if not tf.nest.is_nested(initial_state):
      initial_state = [initial_state]
    _check_initial_state(self, initial_state)
    if tflite.takes_inference_path(training, sequences):
      # A graph nothing differentiates: loops TFLite converts (tflite.py).
      return tflite.inner_loop(
          self, sequences, structs.swap_batch_and_time(x, "inputs"),
          initial_state, mask, _fuses_as_lstm(self.cell))
    # The built-in cells' loops read and write batch-major rows; any other
    # cell runs on the op, time-major.
    fast = self._fast_loop(x, initial_state, mask, training)
    if fast is not None:
      outputs, final_states, last_output = fast
    else:
      outputs, final_states, last_output = self._generic_loop(
          structs.swap_batch_and_time(x, "inputs"), initial_state, mask,
          training)
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
    if isinstance(output_size, int) and output_size > 0:
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
        new_states = masks.select_structure(keep, new_states, state["cell"])
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
                              accumulate_state=per_step,
                              xla_steps=getattr(self, "xla_steps", "auto"))
    return acc["output"], list(final["cell"]), final["output"]

  def _fast_loop(self, x, initial_state, mask, training, time_major=False):
    """A plain built-in cell on `tf_recurrent.sequence`'s chunked loops.

    Args:
      x: The `[B, T, ...]` inputs (`[T, B, ...]` if time_major).
      initial_state: The state list.
      mask: A time-major `[T, B]` bool mask, or None.
      training: Keras's training flag.
      time_major: The layout of x and of the outputs.

    Returns:
      (outputs, final states, last output), or None for any other cell.
    """
    cell = self.cell
    spec = _built_in(cell)
    if spec is None or tf.nest.is_nested(x):
      return None
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
    recompute = self.recompute or tflite.no_tape_records(training)
    carried, final = sequence.run(
        kind, x, state0, self._sequence_weights(spec), recompute=recompute,
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
    emitted = mask if self.zero_output_for_mask else tf.cast(
        tf.cumsum(tf.cast(mask, tf.int32), axis=0), tf.bool)
    if not time_major:
      emitted = tf.transpose(emitted)
    outputs = tf.where(masks.expand(emitted, carried), carried,
                       tf.zeros_like(carried))
    return outputs, final, tf.gather(outputs, tf.shape(outputs)[time_axis] -
                                     1, axis=time_axis)

  def _sequence_weights(self, spec):
    """The cell's weights as `sequence.run` takes them, in their variable
    dtype: under a mixed precision policy the loops cast them and sum their
    gradients in float32."""
    cell = self.cell
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
      weights[name] = _variable_dtype_value(variable)
    return weights


def _keras_arguments(arguments: Dict[str, Any]) -> Dict[str, Any]:
  """A constructor's `locals()` as keyword arguments for Keras's __init__."""
  passed = {k: v for k, v in arguments.items()
            if k not in ("self", "__class__", "recompute", "xla_steps",
                         "kwargs")}
  return {**passed, **arguments["kwargs"]}


def _jit_unless_cudnn(layer):
  """Keras turns XLA off for an LSTM/GRU that may run cuDNN (on a machine
  with a GPU, for "auto" too); ours runs cuDNN only for use_cudnn=True."""
  if layer.use_cudnn is not True:
    layer.supports_jit = True


@keras.saving.register_keras_serializable(package="tf_recurrent")
class RNN(_RecurrentLoop, keras.layers.RNN):
  """`keras.layers.RNN` whose loop is `tf_recurrent.recurrent`.

  Takes the arguments of `keras.layers.RNN` and behaves the same, but the
  backward pass keeps only per-step states. `unroll=True` runs Keras's own
  unrolled loop. `recompute=True` matters only for a plain
  LSTMCell/GRUCell/SimpleRNNCell (see `LSTM`). Any other cell runs on
  `tf_recurrent.recurrent`, its step recomputed and differentiated in the
  backward pass; `xla_steps` is that op's argument ("auto": outside XLA,
  each step and each step's gradient run as one XLA cluster where that
  computes what the plain ops compute; True or False force it).

  Example:

  >>> import keras
  >>> import tf_recurrent
  >>> layer = tf_recurrent.RNN(keras.layers.SimpleRNNCell(4),
  ...                          return_sequences=True)
  >>> layer(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 4])
  """

  def __init__(self, cell, return_sequences=False, return_state=False,
               go_backwards=False, stateful=False, unroll=False,
               zero_output_for_mask=False, *, recompute: bool = False,
               xla_steps: Union[str, bool] = "auto", **kwargs):
    super().__init__(**_keras_arguments(locals()))
    self._set_recompute(recompute)
    self.xla_steps = step_clusters.check_setting(xla_steps)

  def get_config(self):
    return {**super().get_config(), "xla_steps": self.xla_steps}


@keras.saving.register_keras_serializable(package="tf_recurrent")
class LSTM(_RecurrentLoop, keras.layers.LSTM):
  """`keras.layers.LSTM` on `tf_recurrent.recurrent` with a hand-written gradient.

  Takes the arguments of `keras.layers.LSTM`, plus `recompute`.
  `use_cudnn="auto"` or False run tf_recurrent's loop. `use_cudnn=True`
  hands the call to Keras's own inner loop, as `keras.layers.LSTM` runs it:
  its cuDNN kernel on a GPU, which keeps every activation of every step for
  the backward pass (none of tf_recurrent's memory savings, and no XLA for
  the model), and where cuDNN cannot run (no GPU, recurrent dropout, a
  non-default activation, no bias, `unroll=True`) Keras's own ValueError at
  the call. `unroll=True` runs Keras's own unrolled loop.

  Which loop trains it: without a mask, dropout or XLA, a float32 LSTM of at
  most 64 units runs on TensorFlow's whole-sequence LSTM kernels (one op each
  way, where the chunked loops' per-step ops cost more than the step's
  math; `tf_recurrent.fused_lstm`); every other configuration, and
  `recompute=True`, on the chunked loops of `tf_recurrent.sequence`.

  Example:

  >>> import tf_recurrent
  >>> tf_recurrent.LSTM(8)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 8])

  For long sequences, `recompute=True` keeps only the state per step:

  >>> lean = tf_recurrent.LSTM(8, return_sequences=True, recompute=True)
  >>> lean(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 8])
  """

  def __init__(self, units, activation="tanh", recurrent_activation="sigmoid",
               use_bias=True, kernel_initializer="glorot_uniform",
               recurrent_initializer="orthogonal", bias_initializer="zeros",
               unit_forget_bias=True, kernel_regularizer=None,
               recurrent_regularizer=None, bias_regularizer=None,
               activity_regularizer=None, kernel_constraint=None,
               recurrent_constraint=None, bias_constraint=None, dropout=0.0,
               recurrent_dropout=0.0, seed=None, return_sequences=False,
               return_state=False, go_backwards=False, stateful=False,
               unroll=False, use_cudnn="auto", *, recompute: bool = False,
               **kwargs):
    super().__init__(**_keras_arguments(locals()))
    self._set_recompute(recompute)
    _jit_unless_cudnn(self)


@keras.saving.register_keras_serializable(package="tf_recurrent")
class GRU(_RecurrentLoop, keras.layers.GRU):
  """`keras.layers.GRU` on `tf_recurrent.recurrent` with a hand-written gradient.

  Takes the arguments of `keras.layers.GRU`, plus `recompute`. Both
  `reset_after` settings run the chunked loop (`reset_after=False` with two
  sequential GEMMs per step each way). `use_cudnn` and `unroll` as for
  `LSTM` (Keras's cuDNN GRU also needs `reset_after=True`).

  Example:

  >>> import tf_recurrent
  >>> tf_recurrent.GRU(8, return_sequences=True)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 8])
  >>> tf_recurrent.GRU(8, recompute=True).get_config()["recompute"]
  True
  """

  def __init__(self, units, activation="tanh", recurrent_activation="sigmoid",
               use_bias=True, kernel_initializer="glorot_uniform",
               recurrent_initializer="orthogonal", bias_initializer="zeros",
               kernel_regularizer=None, recurrent_regularizer=None,
               bias_regularizer=None, activity_regularizer=None,
               kernel_constraint=None, recurrent_constraint=None,
               bias_constraint=None, dropout=0.0, recurrent_dropout=0.0,
               seed=None, return_sequences=False, return_state=False,
               go_backwards=False, stateful=False, unroll=False,
               reset_after=True, use_cudnn="auto", *,
               recompute: bool = False, **kwargs):
    super().__init__(**_keras_arguments(locals()))
    self._set_recompute(recompute)
    _jit_unless_cudnn(self)


@keras.saving.register_keras_serializable(package="tf_recurrent")
class SimpleRNN(_RecurrentLoop, keras.layers.SimpleRNN):
  """`keras.layers.SimpleRNN` on `tf_recurrent.recurrent`, hand-written gradient.

  Takes the arguments of `keras.layers.SimpleRNN`, plus `recompute`. With
  the tanh activation (Keras's default) it runs the chunked loop, keeping
  nothing per step but its outputs; another activation runs the cell as it
  is.

  Example:

  >>> import tf_recurrent
  >>> tf_recurrent.SimpleRNN(8, return_sequences=True)(
  ...     tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 8])
  """

  def __init__(self, units, activation="tanh", use_bias=True,
               kernel_initializer="glorot_uniform",
               recurrent_initializer="orthogonal", bias_initializer="zeros",
               kernel_regularizer=None, recurrent_regularizer=None,
               bias_regularizer=None, activity_regularizer=None,
               kernel_constraint=None, recurrent_constraint=None,
               bias_constraint=None, dropout=0.0, recurrent_dropout=0.0,
               return_sequences=False, return_state=False, go_backwards=False,
               stateful=False, unroll=False, seed=None, *,
               recompute: bool = False, **kwargs):
    super().__init__(**_keras_arguments(locals()))
    self._set_recompute(recompute)


class _ConvLstmLayer(_RecurrentLoop):
  """The ConvLSTM layers' constructor: Keras's arguments, plus `recompute`."""

  def __init__(self, filters, kernel_size, strides=1, padding="valid",
               data_format=None, dilation_rate=1, activation="tanh",
               recurrent_activation="sigmoid", use_bias=True,
               kernel_initializer="glorot_uniform",
               recurrent_initializer="orthogonal", bias_initializer="zeros",
               unit_forget_bias=True, kernel_regularizer=None,
               recurrent_regularizer=None, bias_regularizer=None,
               activity_regularizer=None, kernel_constraint=None,
               recurrent_constraint=None, bias_constraint=None, dropout=0.0,
               recurrent_dropout=0.0, seed=None, return_sequences=False,
               return_state=False, go_backwards=False, stateful=False, *,
               recompute: bool = False, **kwargs):
    super().__init__(**_keras_arguments(locals()))
    self._set_recompute(recompute)


_CONV_LSTM_DOC = """`keras.layers.ConvLSTM{rank}D` on tf_recurrent's chunked loops.

  Takes the arguments of `keras.layers.ConvLSTM{rank}D`, plus `recompute`.
  With its default activations the cell runs on `tf_recurrent.sequence`'s
  loop pair (`tf_recurrent.convolutional`): per chunk of frames the input
  convolution is one batched convolution, and so are the kernels' and the
  inputs' gradients; a frame's step convolves only h forward and back.
  Keras's cell convolves every frame's input inside its loop and keeps
  every gate map and convolution of every frame for its gradient. Kept per
  frame here: the four gate maps (about Keras's memory), or with
  `recompute=True` nothing but the outputs (about 0.6x Keras's memory; the
  backward pass rebuilds a chunk's gates with two batched convolutions, a
  third more convolution work). `data_format="channels_first"` runs
  channels last inside the loops. Another activation runs the cell as it
  is on `tf_recurrent.recurrent`. Figures: benchmarks/CONVLSTM.md.

  Example:

  >>> import tf_recurrent
  >>> layer = tf_recurrent.ConvLSTM{rank}D(4, 3, padding="same",
  ...                                 return_sequences=True)
  >>> layer(tf.ones([2, 5, {frame}, 3])).shape
  TensorShape([2, 5, {frame}, 4])
  """


@keras.saving.register_keras_serializable(package="tf_recurrent")
class ConvLSTM1D(_ConvLstmLayer, keras.layers.ConvLSTM1D):
  __doc__ = _CONV_LSTM_DOC.format(rank=1, frame="8")


@keras.saving.register_keras_serializable(package="tf_recurrent")
class ConvLSTM2D(_ConvLstmLayer, keras.layers.ConvLSTM2D):
  __doc__ = _CONV_LSTM_DOC.format(rank=2, frame="8, 8")


@keras.saving.register_keras_serializable(package="tf_recurrent")
class ConvLSTM3D(_ConvLstmLayer, keras.layers.ConvLSTM3D):
  __doc__ = _CONV_LSTM_DOC.format(rank=3, frame="4, 4, 4")
