"""Keras drop-ins whose time loop is tf_recurrent's engine.

`RNN`, `LSTM`, `GRU`, `SimpleRNN` and `ConvLSTM1D/2D/3D` are the Keras
layers of the same names, with Keras's own constructor arguments (plus
`recompute`), with one method replaced: `inner_loop`, the part of
`keras.layers.RNN.call` that iterates over time. Everything else
(`initial_state`, `stateful`, masks, dropout-mask setup, `get_config`,
saving) is Keras's own, so swapping `keras.layers.LSTM` for
`tf_recurrent.LSTM` changes nothing but the loop and its memory. The
loop is `tf_recurrent.engine.run`'s choice:

Keras's LSTMCell, GRUCell (either `reset_after`) and SimpleRNNCell with
their default activations run the chunked loop pair
(`tf_recurrent.chunked.sequence`: one sequential GEMM per step each way,
two for a `reset_after=False` GRU, the input projection and weight gradients batched
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

from typing import Any, Dict, Union

import keras
import tensorflow as tf

from tf_recurrent import engine
from tf_recurrent.engine import tracking
from tf_recurrent.op import step_clusters
from tf_recurrent.op import unconverted


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


class _RecurrentLoop(unconverted.EntryPoint):
  """Mixin replacing `keras.layers.RNN.inner_loop` by `tf_recurrent.engine`.

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
    if not tf.nest.is_nested(initial_state):
      initial_state = [initial_state]
    _check_initial_state(self, initial_state)
    outputs, final_states, last_output = engine.run(
        self.cell, sequences, initial_state, mask=mask, training=training,
        recompute=self.recompute, go_backwards=self.go_backwards,
        zero_output_for_mask=self.zero_output_for_mask,
        xla_steps=getattr(self, "xla_steps", "auto"))
    return last_output, outputs, final_states


def _track_stacked_cells(cell):
  """Keras 3's `StackedRNNCells` keeps its cells in a list that
  `tf.train.Checkpoint` does not follow (keras.layers.RNN's checkpoints
  lose them): tracked here as tf.keras did, `cell/cells/0/...`."""
  if isinstance(cell, keras.layers.StackedRNNCells):
    tracking.track_list(cell, "cells")
    for inner in cell.cells:
      _track_stacked_cells(inner)


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
    # A list of cells is Keras's StackedRNNCells by now.
    _track_stacked_cells(self.cell)

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
  math; `tf_recurrent.chunked.fused_lstm`); every other configuration, and
  `recompute=True`, on the chunked loops of `tf_recurrent.chunked.sequence`.

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
  With its default activations the cell runs on `tf_recurrent.chunked.sequence`'s
  loop pair (`tf_recurrent.chunked.convolutional`): per chunk of frames the input
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
