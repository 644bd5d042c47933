"""The engine: runs a Keras cell over a sequence on the loop that fits it.

The Keras layers (`tf_recurrent.layers`) and the `dynamic_rnn` family
(`tf_recurrent.compat.dynamic`) call `run`; it is the one place that
chooses a loop, from the cell and the call (see `run`'s table).
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar, Union

import tensorflow as tf

from tf_recurrent.engine import built_in
from tf_recurrent.engine import generic as generic_lib
from tf_recurrent.engine import inference
from tf_recurrent.op import structs

T = TypeVar("T")


def _time_major_mask(mask: Optional[tf.Tensor], lengths: Optional[tf.Tensor],
                     x: Any, time_major: bool) -> Optional[tf.Tensor]:
  """The `[T, B]` bool mask the loops take, from a mask in the inputs'
  layout or from `[B]` lengths."""
  if lengths is not None:
    steps = tf.shape(tf.nest.flatten(x)[0])[0 if time_major else 1]
    return tf.transpose(tf.sequence_mask(lengths, steps))
  if mask is None:
    return None
  mask = tf.cast(mask, tf.bool)
  return mask if time_major else tf.transpose(mask)


def run(cell: Any,
        inputs: Any,
        initial_state: Sequence[tf.Tensor],
        *,
        mask: Optional[tf.Tensor] = None,
        lengths: Optional[tf.Tensor] = None,
        training: Any = False,
        recompute: bool = False,
        time_major: bool = False,
        go_backwards: bool = False,
        zero_output_for_mask: bool = False,
        xla_steps: Union[str, bool] = "auto",
        convertible: bool = True,
        generic: Optional[Callable[[], T]] = None,
        own_step: bool = False
        ) -> Union[Tuple[Any, List[tf.Tensor], tf.Tensor], T]:
  """Runs a Keras cell over a sequence; returns (outputs, states, last).

  The loop, chosen from the cell and the call, the first that applies
  (ARCHITECTURE.md draws the same table):

  1. `convertible`, batch-major, a graph being traced that nothing will
     differentiate (`training` falsy, no tape), whatever its batch size:
     `inference.run`, loops TFLite and ONNX converters convert (a plain
     LSTM unmasked: tf_keras's fused `standard_lstm` function, ONNX's
     `LSTM`; a plain GRU unmasked: tf_keras's step, ONNX's `GRU`; else a
     `tf.while_loop` over the cell's call).
     A call that could be differentiated must keep its gradient's memory
     small, which these loops do not.
  2. A plain built-in cell (`built_in.find`: Keras's LSTM, GRU, SimpleRNN
     and ConvLSTM cells with their default activations, and
     `tf_recurrent.layers`' peephole, projected, zoneout and layer-norm
     cells), built, one input tensor: `built_in.run`, the chunked loop
     pair with a hand-written gradient (`chunked.sequence.run`); there a
     float32 LSTM of at most `fused_lstm.MAX_UNITS` units without mask,
     dropout, recompute or XLA runs on TensorFlow's whole-sequence
     kernels (`chunked.fused_lstm`), whose per-step cost is lower.
  3. Any other cell: `generic()` if given, else `generic.run`, the cell's
     own call on `tf_recurrent.recurrent`, recomputed per step.

  Args:
    cell: A Keras cell (`state_size`, `call(inputs, states)`).
    inputs: `[B, T, ...]` inputs (`[T, B, ...]` if `time_major`), or a
      structure of them.
    initial_state: The state list, one tensor per entry of
      `cell.state_size`.
    mask: Optional bool mask in the inputs' layout, `[B, T]` (`[T, B]` if
      `time_major`): a False step carries the state and emits the previous
      output (zeros with `zero_output_for_mask`), Keras's semantics.
    lengths: Optional `[B]` int lengths instead of a mask.
    training: Keras's training flag (dropout; a falsy Python value with no
      tape recording keeps nothing per step).
    recompute: Keep only the outputs per step and rebuild the built-in
      cells' gates in the backward pass.
    time_major: The layout of the inputs, the mask and the outputs.
    go_backwards: Read the inputs from their last step (the outputs are in
      the order run, as Keras's).
    zero_output_for_mask: See `mask`.
    xla_steps: The op's `xla_steps`, for the generic loop.
    convertible: Whether a call nothing differentiates may take the loops
      TFLite converts (a Keras layer's call; `dynamic_rnn`'s graphs are
      differentiated by `tf.gradients`, which no tape shows).
    generic: Runs a cell the chunked loops do not take, instead of the
      op's loop for a Keras cell (`dynamic_rnn` steps RNNCell-protocol
      objects its own way); its result is returned as it is.
    own_step: Run a built-in cell's own call on the op too (case 3), not
      the chunked loops, whose fused kernels round the same math
      differently in the last bit: for a caller promising the step loop's
      numbers (a teacher-forced `seq2seq.BasicDecoder`).

  Returns:
    `(outputs, final states (a list), last output)`, the outputs in the
    inputs' layout; or what `generic` returned.

  Example:

  >>> import keras
  >>> cell = keras.layers.GRUCell(4)
  >>> cell.build((None, 3))
  >>> outputs, (h,), last = run(cell, tf.ones([2, 5, 3]), [tf.zeros([2, 4])])
  >>> outputs.shape, h.shape, last.shape
  (TensorShape([2, 5, 4]), TensorShape([2, 4]), TensorShape([2, 4]))
  """
  initial_state = list(initial_state)
  takes_inference_path = (convertible and not time_major and
                          inference.takes_inference_path(training, inputs))
  spec = built_in.find(cell)
  chunked = (spec is not None and not tf.nest.is_nested(inputs) and
             getattr(cell, "built", True) and not own_step)
  if generic is not None and not (takes_inference_path or chunked):
    return generic()
  mask = _time_major_mask(mask, lengths, inputs, time_major)
  x = inputs
  if go_backwards:
    x = tf.nest.map_structure(
        lambda t: tf.reverse(t, [0 if time_major else 1]), x)
    mask = None if mask is None else tf.reverse(mask, [0])
  if takes_inference_path:
    # A graph nothing differentiates: loops TFLite converts.
    last, outputs, states = inference.run(
        cell, inputs, structs.swap_batch_and_time(x, "inputs"),
        initial_state, mask, built_in.fused_kind(cell), go_backwards,
        zero_output_for_mask)
    return outputs, states, last
  if chunked:
    # The built-in cells' loops read and write either layout.
    return built_in.run(cell, spec, x, initial_state, mask, training,
                        recompute, time_major, zero_output_for_mask)
  if not time_major:  # The op runs time-major.
    x = structs.swap_batch_and_time(x, "inputs")
  outputs, states, last = generic_lib.run(cell, x, initial_state, mask,
                                          training, zero_output_for_mask,
                                          xla_steps)
  if not time_major:
    outputs = structs.swap_batch_and_time(outputs, "outputs")
  return outputs, states, last
