"""The loops a Keras layer's inference call runs: graphs TFLite and ONNX
converters convert.

The training loops (`tf_recurrent.recurrent`, `tf_recurrent.chunked`) keep
per-step rows in TensorLists with an unknown element shape, written with
`Empty` and `InplaceUpdate`, and carry a custom gradient; TFLite's converter
cannot lower them to builtin ops, and tf2onnx has no ONNX op for them. A
layer call that needs no gradient takes these loops instead (the engine
chooses them, `takes_inference_path`):

* a plain LSTM (tanh/sigmoid `LSTMCell`, no mask; dropout is off at inference)
  calls `lstm_function(...)`, a `tf.function` with the attributes and the
  argument/result layout of tf_keras's `standard_lstm`. TFLite's converter
  (`prepare_composite_functions_tf.cc`, `lstm_utils.cc`) replaces such a
  function by one fused `UNIDIRECTIONAL_SEQUENCE_LSTM` op when the batch
  size is static and only its first two results (last output, outputs) are
  read; otherwise it converts the function's body, a builtin `WHILE` loop.
  While `tflite.convert` runs (`tracing_projections`), a float32 projected
  LSTM does too, and `convert` then writes its projection into the fused op
  (the contract has no argument for it). The body's step is Keras's, op for
  op (`bias_add(x_t @ kernel + h @ recurrent_kernel, bias)`, one split,
  `f * c + i * g`, `o * tanh(c)`), the pattern by which tf2onnx
  (`lstm_tf2_rewriter.py`) makes one ONNX `LSTM` op of the loop, and of two
  such loops over the same inputs, one forward and one reversed (a
  `Bidirectional`), one bidirectional `LSTM`;
* a plain GRU (`GRUCell`, `reset_after`, no mask) runs `gru_step` in
  `run_cell`: tf_keras's step, which tf2onnx (`gru_tf2_rewriter.py`) makes
  one ONNX `GRU` op (`linear_before_reset`); TFLite has no fused GRU;
* any other cell (SimpleRNN, ConvLSTM, a user's cell, a masked LSTM or GRU)
  runs its own call in `run_cell`, a `tf.while_loop` reading its inputs
  from and writing its outputs into `tf.TensorArray`s: a builtin `WHILE`
  loop after TFLite's conversion, a `Loop` after ONNX's.

The engine takes this path when `training` is falsy, no `tf.GradientTape` is
recording, and the call is being traced into a graph (eager calls, which
nothing converts, keep the op's cached loop). The batch size may be unknown:
ONNX converters take these loops with a dynamic batch (a SavedModel's or
`model.export`'s signature), TFLite lowers a TensorArray only with a static
element shape, so it converts them with a static batch only, as it did the
training loop (neither converts with an unknown batch). The loops compute
what the training loop computes (to float rounding); gradients through them
(`tf.gradients` of an inference graph, a reloaded SavedModel's) are plain
autodiff, as correct but keeping every step's intermediates.

Example:

>>> lstm = lstm_function(go_backwards=False).get_concrete_function(
...     *[tf.TensorSpec(shape) for shape in
...       ([1, 6, 3], [1, 4], [1, 4], [3, 16], [4, 16], [16])])
>>> lstm.function_def.attr["api_implements"].s.decode()[:5]
'lstm_'
"""

import contextlib
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Tuple
import uuid

import numpy as np
import tensorflow as tf

from tf_recurrent.op import masks

try:  # TF >= 2.13; the one place the active tapes are visible from Python.
  from tensorflow.python.eager import record as _record
except ImportError:  # pragma: no cover - depends on the TF build.
  from tensorflow.python.eager import tape as _record

# The converter's contract (tf_keras's gru_lstm_utils.py): `api_implements`
# starting with "lstm_" marks a Keras LSTM; `time_major` and `go_backwards`
# tell it how to read the input.
_API_PREFIX = "lstm_"
_RUNTIME_CPU = 1.0  # tf_keras's fifth result: 1 = the CPU implementation.


class Projection(NamedTuple):
  """A projected LSTM's weights as `convert` traced them (float32)."""
  projection: np.ndarray  # [H, P]
  kernel: np.ndarray  # [D, 4H], Keras's gates [i, f, c, o]
  recurrent_kernel: np.ndarray  # [P, 4H]


# While `convert` runs: the projected LSTMs its trace made fused functions
# of, in trace order; otherwise None (and projected LSTMs trace loops).
_projections: Optional[List[Projection]] = None


@contextlib.contextmanager
def tracing_projections(fused: bool) -> Iterator[Optional[List[Projection]]]:
  """While `tflite.convert` runs its converter: the projected LSTMs traced
  meanwhile, in trace order, as fused functions (`fused`: an unquantized
  conversion) or as loops (None).

  Raises:
    RuntimeError: When a conversion is already running.
  """
  global _projections
  if _projections is not None:
    raise RuntimeError("tf_recurrent.tflite.convert is already running; "
                       "convert one model at a time.")
  traced = [] if fused else None
  _projections = traced
  try:
    yield traced
  finally:
    _projections = None


def _value(variable) -> np.ndarray:
  """A variable's value now, as float32, also while a graph is traced."""
  with tf.init_scope():
    return np.asarray(tf.convert_to_tensor(variable), np.float32)


def no_tape_records(training: Any) -> bool:
  """True when `training` is a falsy Python value and no tape records the
  call (eager or traced): nothing will take its gradient but, in a graph,
  `tf.gradients`.

  Example:

  >>> no_tape_records(False)
  True
  >>> with tf.GradientTape():
  ...   no_tape_records(False)
  False
  """
  if isinstance(training, (tf.Tensor, tf.Variable)) or training:
    return False
  return not _record.could_possibly_record()


def takes_inference_path(training: Any, sequences: Any) -> bool:
  """Whether a layer call should run the convertible inference loops.

  Args:
    training: The layer call's `training` argument.
    sequences: Its batch-major inputs (a tensor or a structure of them).

  Returns:
    True when nothing will differentiate the call (`training` is a falsy
    Python value and no tape records) and it is traced into a graph, with
    a known or an unknown batch size (the module docstring says why).

  Example:

  >>> takes_inference_path(False, tf.zeros([1, 5, 3]))  # eager
  False
  """
  if tf.executing_eagerly() or not no_tape_records(training):
    return False
  return all(t.shape.rank is not None and t.shape.rank >= 2
             for t in tf.nest.flatten(sequences))


def lstm_function(go_backwards: bool, projection: Optional[np.ndarray] = None
                  ) -> Callable[..., Tuple[tf.Tensor, ...]]:
  """A fresh `standard_lstm` tf.function that TFLite fuses into one op.

  The function takes `(inputs [B, T, D], init_h [B, H], init_c [B, H],
  kernel [D, 4H], recurrent_kernel [H, 4H], bias [4H])`, Keras's weights
  with gates in the order i, f, c, o, and returns `(last_output [B, H],
  outputs [B, T, H], h [B, H], c [B, H], runtime)`: the layout of tf_keras's
  `standard_lstm` with `time_major=False`, no mask and no sequence lengths.
  With `go_backwards` it reads the input from its end and returns the
  outputs in the order it ran them, as Keras does. Each call makes a new
  function with a unique `api_implements` name, as tf_keras does, so two
  layers never share one.

  With a `projection` `[H, P]` (a `ProjectedLSTM`'s, read when `convert`
  traces the model), h is `(o * tanh(c)) @ projection`, P wide, and the
  recurrent kernel `[P, 4H]`: the converter's fused op is then P wide but
  does not project until `convert` gives it the projection (the contract
  has no argument for it; the body, a constant, is what a converter that
  does not fuse runs).

  Args:
    go_backwards: Whether to run the sequence from its last step.
    projection: None, or the projection's value, a float array `[H, P]`.

  Returns:
    The tf.function.

  Example:

  >>> import numpy as np
  >>> lstm = lstm_function(go_backwards=False)
  >>> last, outputs, h, c, _ = lstm(
  ...     tf.ones([2, 5, 3]), tf.zeros([2, 4]), tf.zeros([2, 4]),
  ...     tf.ones([3, 16]) * 0.1, tf.zeros([4, 16]), tf.zeros([16]))
  >>> outputs.shape, bool(np.allclose(last, outputs[:, -1]))
  (TensorShape([2, 5, 4]), True)
  """
  attributes = {
      "api_implements": _API_PREFIX + uuid.uuid4().hex,
      "api_preferred_device": "CPU",
      "time_major": False,
      "go_backwards": go_backwards,
  }

  def standard_lstm(inputs, init_h, init_c, kernel, recurrent_kernel, bias):
    if go_backwards:
      inputs = tf.reverse(inputs, [1])

    def step(x_t, states):
      # Keras's step, op for op: ONNX converters fuse the loop into one
      # `LSTM` op by this pattern (module docstring).
      h, c = states
      z = tf.nn.bias_add(tf.matmul(x_t, kernel) +
                         tf.matmul(h, recurrent_kernel), bias)
      i, f, g, o = tf.split(z, 4, axis=1)
      c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
      h = tf.sigmoid(o) * tf.tanh(c)
      if projection is not None:
        h = tf.matmul(h, tf.constant(projection, h.dtype))
      return h, [h, c]

    outputs, (h, c), _ = run_cell(
        step, tf.transpose(inputs, [1, 0, 2]), [init_h, init_c],
        tf.zeros_like(init_h))
    # Unmasked, the last output is the final h (init_h for no steps, as
    # the training loop returns it); read there, the loop has no other
    # result, and an ONNX converter that fuses it leaves no loop behind.
    return (h, tf.transpose(outputs, [1, 0, 2]), h, c,
            tf.constant(_RUNTIME_CPU))

  return tf.function(standard_lstm, autograph=False,
                     experimental_attributes=attributes)


def run_cell(step: Callable[[Any, Any], Tuple[tf.Tensor, Any]],
             inputs: Any, states: Any, zero_output: tf.Tensor,
             mask: Optional[tf.Tensor] = None,
             zero_output_for_mask: bool = False
             ) -> Tuple[tf.Tensor, Any, tf.Tensor]:
  """Runs `step` over time in a loop TFLite lowers to builtin ops (with a
  static batch) and ONNX converters to a `Loop` (or a fused op).

  Args:
    step: `(inputs_t, states) -> (output, new_states)`, a Keras cell call;
      new_states may be nested otherwise than states, with the same leaves.
    inputs: Time-major `[T, B, ...]` inputs (a tensor or a structure).
    states: The initial states, a structure of `[B, ...]` tensors.
    zero_output: Zeros shaped like one step's output; its static shape is
      the outputs' TensorArray's element shape (TFLite needs it fully
      known, ONNX converters take an unknown batch).
    mask: Optional time-major `[T, B]` bool mask: a masked step keeps the
      states and emits the previous output (zeros with
      `zero_output_for_mask`), as Keras's loop does.
    zero_output_for_mask: As Keras's RNN argument.

  Returns:
    `(outputs [T, B, ...], final states like `states`, last output)`.

  Example:

  >>> outputs, (h,), last = run_cell(
  ...     lambda x, s: (x + s[0], [x + s[0]]), tf.ones([3, 2, 4]),
  ...     [tf.zeros([2, 4])], tf.zeros([2, 4]))
  >>> outputs[:, 0, 0].numpy().tolist(), float(last[0, 0])
  ([1.0, 2.0, 3.0], 3.0)
  """
  num_steps = tf.shape(tf.nest.flatten(inputs)[0])[0]
  flat_inputs = tf.nest.flatten(inputs)
  # TFLite slices and gathers tensors of at most 5 dimensions: a ConvLSTM3D's
  # `[T, B, D, H, W, C]` frames are read, and its outputs kept, as rows.
  deep = [(x.shape.rank or 0) > 5 for x in flat_inputs]
  rows = [tf.reshape(x, [num_steps, -1]) if d else x
          for x, d in zip(flat_inputs, deep)]
  # Read as Keras's loop reads them, from TensorArrays: ONNX converters
  # recognize a fused LSTM or GRU only in such a loop.
  arrays = [tf.TensorArray(r.dtype, size=num_steps,
                           element_shape=r.shape[1:]).unstack(r)
            for r in rows]
  flat_outputs = (zero_output.shape.rank or 0) > 4
  written = tf.TensorArray(
      zero_output.dtype, size=num_steps,
      element_shape=([zero_output.shape.num_elements()] if flat_outputs
                     else zero_output.shape))

  def read(array, x, is_deep, t):
    if not is_deep:
      return array.read(t)
    frame = tf.reshape(array.read(t), tf.shape(x)[1:])
    frame.set_shape(x.shape[1:])
    return frame

  def body(t, output, states_t, written):
    inputs_t = tf.nest.pack_sequence_as(inputs, [
        read(a, x, d, t) for a, x, d in zip(arrays, flat_inputs, deep)])
    new_output, new_states = step(inputs_t, states_t)
    new_states = tf.nest.pack_sequence_as(states_t,
                                          tf.nest.flatten(new_states))
    if mask is not None:
      keep = mask[t]
      fallback = tf.zeros_like(new_output) if zero_output_for_mask else output
      new_output = masks.select(keep, new_output, fallback)
      new_states = masks.select_structure(keep, new_states, states_t)
    row = tf.reshape(new_output, [-1]) if flat_outputs else new_output
    return t + 1, new_output, new_states, written.write(t, row)

  _, last, final, written = tf.while_loop(
      lambda t, *_: t < num_steps, body,
      [tf.constant(0), zero_output, states, written])
  outputs = written.stack()
  if flat_outputs:
    outputs = tf.reshape(outputs, tf.concat(
        [[num_steps], tf.shape(zero_output)], axis=0))
  return outputs, final, last


def gru_step(cell) -> Callable[[tf.Tensor, List[tf.Tensor]],
                                Tuple[tf.Tensor, List[tf.Tensor]]]:
  """A plain `keras.layers.GRUCell`'s step (`reset_after=True`, tanh and
  sigmoid), at inference, as tf_keras's GRU wrote it.

  Keras's math; the ops are those ONNX converters fuse into one `GRU` op
  (`linear_before_reset`): both matmuls with a `BiasAdd` of their own bias
  row, read outside the loop. Keras 3's own step adds the biases otherwise,
  so its GRU exports as a loop.

  Args:
    cell: The built cell.

  Returns:
    `(x_t [B, D], [h [B, H]]) -> (h, [h])`.

  Example:

  >>> import keras, numpy as np
  >>> cell = keras.layers.GRUCell(4)
  >>> cell.build((None, 3))
  >>> x, h = tf.ones([2, 3]), tf.ones([2, 4]) * 0.5
  >>> ours, _ = gru_step(cell)(x, [h])
  >>> bool(np.allclose(ours, cell(x, [h])[0], atol=1e-6))
  True
  """
  dtype = cell.compute_dtype
  kernel = tf.cast(cell.kernel, dtype)
  recurrent_kernel = tf.cast(cell.recurrent_kernel, dtype)
  bias = (tf.cast(cell.bias, dtype) if cell.use_bias
          else tf.zeros([2, 3 * cell.units], dtype))
  input_bias, recurrent_bias = tf.unstack(bias)

  def step(x_t, states):
    h = states[0]
    x_z, x_r, x_h = tf.split(
        tf.nn.bias_add(tf.matmul(x_t, kernel), input_bias), 3, axis=1)
    h_z, h_r, h_h = tf.split(
        tf.nn.bias_add(tf.matmul(h, recurrent_kernel), recurrent_bias), 3,
        axis=1)
    z = tf.sigmoid(x_z + h_z)
    r = tf.sigmoid(x_r + h_r)
    candidate = tf.tanh(x_h + r * h_h)
    h = z * h + (1 - z) * candidate
    return h, [h]

  return step


def run(cell, sequences, time_major, initial_state, mask,
        fused: Optional[str], go_backwards: bool,
        zero_output_for_mask: bool):
  """A cell over a sequence on the convertible loops.

  Args:
    cell: The Keras cell.
    sequences: The batch-major inputs, as Keras passed them to the layer.
    time_major: The same inputs time-major `[T, B, ...]`, already reversed
      if going backwards.
    initial_state: The list of initial states.
    mask: None or the `[T, B]` bool mask, time-major like `time_major`.
    fused: The fused op a converter may make of the unmasked cell:
      "lstm", a plain LSTMCell (tanh/sigmoid; dropout is off at inference),
      which runs `lstm_function`, or such a cell with a `projection`
      weight, which does so while `convert` runs (float32 only); "gru", a
      plain GRUCell with `reset_after`, which runs `gru_step`; or None.
    go_backwards: Whether to read the inputs from their end.
    zero_output_for_mask: Whether a masked step emits zeros.

  Returns:
    `(last_output, outputs [B, T, ...], states)` as Keras's inner loop
    returns them.
  """
  initial_state = list(initial_state)
  if mask is not None:
    fused = None  # Neither fused op takes a mask.
  projection = getattr(cell, "projection", None)
  if projection is not None and not (_projections is not None and
                                     cell.compute_dtype == "float32"):
    fused = None  # Outside `convert`: the fused op would not project.
  if fused == "lstm":
    dtype = cell.compute_dtype
    bias = cell.bias if cell.use_bias else tf.zeros([4 * cell.units], dtype)
    projection_value = None
    if projection is not None:
      traced = Projection(*(_value(w) for w in (
          projection, cell.kernel, cell.recurrent_kernel)))
      _projections.append(traced)
      projection_value = traced.projection
    last, outputs, h, c, _ = lstm_function(go_backwards,
                                           projection_value)(
        *[tf.cast(t, dtype) for t in (
            sequences, initial_state[0], initial_state[1], cell.kernel,
            cell.recurrent_kernel, bias)])
    return last, outputs, [h, c]
  if fused == "gru":
    step = gru_step(cell)
  else:
    kwargs = {"training": False} if getattr(
        cell, "_call_has_training_arg", False) else {}

    def step(inputs_t, states):
      return cell(inputs_t, states, **kwargs)

  first = tf.nest.flatten(sequences)[0]
  batch = first.shape[0]
  output_size = getattr(cell, "output_size", None)
  if isinstance(output_size, int) and output_size > 0:
    zero_output = tf.zeros(
        [batch if batch is not None else tf.shape(first)[0], output_size],
        cell.compute_dtype)
  else:
    zero_output = tf.zeros_like(tf.nest.flatten(initial_state)[0])
  outputs, states, last = run_cell(step, time_major, initial_state,
                                   zero_output, mask,
                                   zero_output_for_mask)
  if fused == "gru":
    # The last output is the final h, read there for the reason
    # `lstm_function` reads it so.
    last = states[0]
  perm = [1, 0] + list(range(2, outputs.shape.rank))
  return last, tf.transpose(outputs, perm), list(states)
