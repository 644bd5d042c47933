"""The Keras layers' inference path: graphs TFLite converts with builtin ops.

The training loop (`tf_recurrent.recurrent`, `tf_recurrent.sequence`) keeps
per-step rows in TensorLists with an unknown element shape and carries a
custom gradient; TFLite's converter cannot lower either to builtin ops. A
layer call that needs no gradient takes this path instead:

* a plain LSTM (tanh/sigmoid `LSTMCell`, no mask; dropout is off at inference)
  calls `lstm_function(...)`, a `tf.function` with the attributes and the
  argument/result layout of tf_keras's `standard_lstm`. TFLite's converter
  (`prepare_composite_functions_tf.cc`, `lstm_utils.cc`) replaces such a
  function by one fused `UNIDIRECTIONAL_SEQUENCE_LSTM` op when the batch
  size is static and only its first two results (last output, outputs) are
  read; otherwise it converts the function's body, a builtin `WHILE` loop.
  While `convert` runs, a float32 projected LSTM does too, and `convert`
  then writes its projection into the fused op (the contract has no
  argument for it);
* any other cell (GRU, SimpleRNN, ConvLSTM, a user's cell, a masked LSTM)
  runs `run_cell`, a `tf.while_loop` writing rows into a `tf.TensorArray`
  whose element shape is static: a builtin `WHILE` loop after conversion.

The layers take this path when `training` is falsy, no `tf.GradientTape` is
recording, the call is being traced into a graph (eager calls, which nothing
converts, keep the op's cached loop) and the batch size is static (TFLite
lowers a TensorArray only with a static element shape). Both loops compute
what the training loop computes (to float rounding); gradients through them
are plain autodiff, should a caller differentiate an inference graph.

Example (the README's "Deploy to TFLite" converts a whole model):

>>> lstm = lstm_function(go_backwards=False).get_concrete_function(
...     *[tf.TensorSpec(shape) for shape in
...       ([1, 6, 3], [1, 4], [1, 4], [3, 16], [4, 16], [16])])
>>> lstm.function_def.attr["api_implements"].s.decode()[:5]
'lstm_'
"""

from typing import Any, Callable, List, NamedTuple, Optional, Tuple
import uuid

import numpy as np
import tensorflow as tf

from tf_recurrent import masks

try:  # TF >= 2.13; the one place the active tapes are visible from Python.
  from tensorflow.python.eager import record as _record
except ImportError:  # pragma: no cover - depends on the TF build.
  from tensorflow.python.eager import tape as _record

# The converter's contract (tf_keras's gru_lstm_utils.py): `api_implements`
# starting with "lstm_" marks a Keras LSTM; `time_major` and `go_backwards`
# tell it how to read the input.
_API_PREFIX = "lstm_"
_RUNTIME_CPU = 1.0  # tf_keras's fifth result: 1 = the CPU implementation.


class _Projection(NamedTuple):
  """A projected LSTM's weights as `convert` traced them (float32)."""
  projection: np.ndarray  # [H, P]
  kernel: np.ndarray  # [D, 4H], Keras's gates [i, f, c, o]
  recurrent_kernel: np.ndarray  # [P, 4H]


# While `convert` runs: the projected LSTMs its trace made fused functions
# of, in trace order; otherwise None (and projected LSTMs trace loops).
_projections: Optional[List[_Projection]] = None


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
    Python value and no tape records), it is traced into a graph, and the
    inputs' batch size is static.

  Example:

  >>> takes_inference_path(False, tf.zeros([1, 5, 3]))  # eager
  False
  """
  if tf.executing_eagerly() or not no_tape_records(training):
    return False
  return all(t.shape.rank is not None and t.shape.rank >= 2 and
             t.shape[0] is not None for t in tf.nest.flatten(sequences))


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
    # The input projection for every step at once, then one GEMM a step.
    projected = tf.einsum("btd,dg->btg", inputs, kernel) + bias

    def step(z, states):
      h, c = states
      z = z + tf.matmul(h, recurrent_kernel)
      i, f, g, o = tf.split(z, 4, axis=-1)
      c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
      h = tf.sigmoid(o) * tf.tanh(c)
      if projection is not None:
        h = tf.matmul(h, tf.constant(projection, h.dtype))
      return h, [h, c]

    outputs, (h, c), last = run_cell(
        step, tf.transpose(projected, [1, 0, 2]), [init_h, init_c],
        tf.zeros_like(init_h))
    return (last, tf.transpose(outputs, [1, 0, 2]), h, c,
            tf.constant(_RUNTIME_CPU))

  return tf.function(standard_lstm, autograph=False,
                     experimental_attributes=attributes)


def run_cell(step: Callable[[Any, Any], Tuple[tf.Tensor, Any]],
             inputs: Any, states: Any, zero_output: tf.Tensor,
             mask: Optional[tf.Tensor] = None,
             zero_output_for_mask: bool = False
             ) -> Tuple[tf.Tensor, Any, tf.Tensor]:
  """Runs `step` over time in a loop TFLite lowers to builtin ops.

  Args:
    step: `(inputs_t, states) -> (output, new_states)`, a Keras cell call;
      new_states may be nested otherwise than states, with the same leaves.
    inputs: Time-major `[T, B, ...]` inputs (a tensor or a structure).
    states: The initial states, a structure of `[B, ...]` tensors.
    zero_output: Zeros shaped like one step's output; its shape must be
      static (the TensorArray's element shape).
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
  # TFLite slices and gathers tensors of at most 5 dimensions: a ConvLSTM3D's
  # `[T, B, D, H, W, C]` frames are read, and its outputs kept, as rows.
  deep = [(x.shape.rank or 0) > 5 for x in tf.nest.flatten(inputs)]
  rows = tf.nest.pack_sequence_as(inputs, [
      tf.reshape(x, [num_steps, -1]) if d else x
      for x, d in zip(tf.nest.flatten(inputs), deep)])
  flat_outputs = (zero_output.shape.rank or 0) > 4
  written = tf.TensorArray(
      zero_output.dtype, size=num_steps,
      element_shape=([zero_output.shape.num_elements()] if flat_outputs
                     else zero_output.shape))

  def read(row, x, t):
    if row is x:
      return x[t]
    frame = tf.reshape(row[t], tf.shape(x)[1:])
    frame.set_shape(x.shape[1:])
    return frame

  def body(t, output, states_t, written):
    inputs_t = tf.nest.map_structure(lambda row, x: read(row, x, t), rows,
                                     inputs)
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


def op_names(model_content: bytes) -> List[str]:
  """The operators of every subgraph of a TFLite model, one name each.

  Loop bodies (the subgraphs of `WHILE`) count too. Select TF ops show as
  their custom code ("FlexXxx"), so `any(n.startswith("Flex") for n in
  op_names(m))` tells whether a model needs the Flex delegate, and
  `op_names(m).count("UNIDIRECTIONAL_SEQUENCE_LSTM")` how many LSTM layers
  became the fused op.

  Args:
    model_content: The flatbuffer `TFLiteConverter.convert()` returned.

  Returns:
    Sorted operator names ("WHILE", "UNIDIRECTIONAL_SEQUENCE_LSTM", ...),
    one per operator.

  Example:

  >>> f = tf.function(lambda x: tf.tanh(tf.tanh(x)),
  ...                 input_signature=[tf.TensorSpec([2], tf.float32)])
  >>> op_names(tf.lite.TFLiteConverter.from_concrete_functions(
  ...     [f.get_concrete_function()]).convert())
  ['TANH', 'TANH']
  """
  from tensorflow.lite.python import schema_py_generated as schema  # pylint: disable=g-import-not-at-top
  model = schema.ModelT.InitFromPackedBuf(bytearray(model_content), 0)
  by_code = {v: k for k, v in vars(schema.BuiltinOperator).items()
             if not k.startswith("_")}
  names = []
  for code in model.operatorCodes:
    name = by_code.get(max(code.builtinCode, code.deprecatedBuiltinCode))
    if name == "CUSTOM":
      custom = code.customCode
      name = custom.decode() if isinstance(custom, bytes) else str(custom)
    names.append(name)
  return sorted(names[op.opcodeIndex] for subgraph in model.subgraphs
                for op in (subgraph.operators or []))


def _fused_lstm_codes(model) -> set:
  """The operator-code indices of UNIDIRECTIONAL_SEQUENCE_LSTM in a model
  (`flatbuffer_utils`' object form)."""
  from tensorflow.lite.python import schema_py_generated as schema  # pylint: disable=g-import-not-at-top
  return {i for i, code in enumerate(model.operatorCodes)
          if max(code.builtinCode, code.deprecatedBuiltinCode) ==
          schema.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM}


def without_cell_clip(model_content: bytes) -> bytes:
  """The model with its fused float LSTMs' cell-state clipping turned off.

  The converter fuses a Keras LSTM with `cell_clip=10` (as tf_keras's did),
  so the fused op clamps the cell state to [-10, 10] every step, which the
  Keras layer does not: once some |c| exceeds 10 (a character LM's counting
  units pass 60 within a hundred bytes) the outputs drift from Keras's. A
  `cell_clip` of 0 means no clipping to the kernel; the op is otherwise the
  same, so the model then computes what the Keras model does. Fused LSTMs
  with integer activations (full int8, whose int16 cell state has its own
  range) are left as they are.

  Args:
    model_content: A flatbuffer `TFLiteConverter.convert()` returned.

  Returns:
    The same model, every float UNIDIRECTIONAL_SEQUENCE_LSTM with
    `cell_clip=0`.
  """
  from tensorflow.lite.python import schema_py_generated as schema  # pylint: disable=g-import-not-at-top
  from tensorflow.lite.tools import flatbuffer_utils  # pylint: disable=g-import-not-at-top
  model = flatbuffer_utils.read_model_from_bytearray(bytearray(model_content))
  fused = _fused_lstm_codes(model)
  for subgraph in model.subgraphs:
    for op in subgraph.operators or []:
      if (op.opcodeIndex in fused and
          subgraph.tensors[op.inputs[0]].type == schema.TensorType.FLOAT32):
        op.builtinOptions.cellClip = 0.0
  return flatbuffer_utils.convert_object_to_bytearray(model)


def convert(converter: tf.lite.TFLiteConverter) -> bytes:
  """`converter.convert()`, with `ProjectedLSTM` layers fused too.

  A plain LSTM becomes TFLite's fused `UNIDIRECTIONAL_SEQUENCE_LSTM` with
  any converter (`lstm_function`). The fused op also has projection inputs
  (h = (o * tanh(c)) @ W_proj, TF1's `num_proj`), but the converter's
  Keras contract cannot pass them, so a plain `converter.convert()` turns
  a `ProjectedLSTM` into a `WHILE` loop of builtin ops. Here each float32
  projected LSTM (unmasked, default activations, as for the plain LSTM) is
  traced as the converter's LSTM function with a P-wide recurrent kernel,
  and its projection is then written into the fused op it became (found by
  its kernels' values; a fused op left without a projection that could be
  a projected LSTM's is an error, never a silent wrong model). Everything else converts as with
  `converter.convert()`. With `converter.optimizations` set (quantization)
  projected LSTMs stay loops: the quantized fused op would need a quantized
  projection. Not thread-safe: one `convert` at a time.

  Args:
    converter: A `tf.lite.TFLiteConverter` made by `from_keras_model`
      (models exported before the call were traced without the fused
      function and keep their loops).

  Returns:
    The flatbuffer.

  Raises:
    ValueError: When a fused op the converter made from a projected LSTM
      cannot be matched to its projection.

  Example (a Keras model's, as in the README's "Deploy to TFLite":
  `convert(tf.lite.TFLiteConverter.from_keras_model(model))`; any
  converter works, this one runs on every TensorFlow the package supports):

  >>> f = tf.function(lambda x: tf.tanh(x),
  ...                 input_signature=[tf.TensorSpec([2], tf.float32)])
  >>> op_names(convert(tf.lite.TFLiteConverter.from_concrete_functions(
  ...     [f.get_concrete_function()])))
  ['TANH']
  """
  global _projections
  if _projections is not None:
    raise RuntimeError("tf_recurrent.tflite.convert is already running; "
                       "convert one model at a time.")
  traced = [] if not converter.optimizations else None
  _projections = traced
  try:
    model_content = converter.convert()
  finally:
    _projections = None
  return _with_projections(model_content, traced) if traced else model_content


# TFLite's LSTM inputs (lite/kernels/lstm_shared.h).
_INPUT_TO_INPUT_WEIGHTS = 1
_RECURRENT_TO_INPUT_WEIGHTS = 5
_PROJECTION_WEIGHTS = 16
_OUTPUT_STATE = 18
_CELL_STATE = 19


def _with_projections(model_content: bytes,
                      projections: List[_Projection]) -> bytes:
  """The model with each fused LSTM traced from `projections` given its
  projection weights (TFLite's `[P, H]`)."""
  from tensorflow.lite.python import schema_py_generated as schema  # pylint: disable=g-import-not-at-top
  from tensorflow.lite.tools import flatbuffer_utils  # pylint: disable=g-import-not-at-top
  model = flatbuffer_utils.read_model_from_bytearray(bytearray(model_content))
  fused = _fused_lstm_codes(model)

  def constant(subgraph, index) -> Optional[np.ndarray]:
    tensor = subgraph.tensors[index] if index >= 0 else None
    if tensor is None or tensor.type != schema.TensorType.FLOAT32:
      return None
    data = model.buffers[tensor.buffer].data
    if data is None or len(data) == 0:
      return None
    return np.frombuffer(np.asarray(data, np.uint8).tobytes(),
                         np.float32).reshape(tensor.shape)

  def traced_from(subgraph, op) -> Optional[_Projection]:
    """The projected LSTM whose input gate's kernels the op holds."""
    w_x = constant(subgraph, op.inputs[_INPUT_TO_INPUT_WEIGHTS])
    w_h = constant(subgraph, op.inputs[_RECURRENT_TO_INPUT_WEIGHTS])
    for traced in projections:
      units = traced.projection.shape[0]
      if (w_x is not None and w_h is not None and
          np.array_equal(w_x, traced.kernel[:, :units].T) and
          np.array_equal(w_h, traced.recurrent_kernel[:, :units].T)):
        return traced
    return None

  unprojected = []  # (h, c) widths of the fused ops left as they are.
  matched = []
  for subgraph in model.subgraphs:
    for op in subgraph.operators or []:
      if op.opcodeIndex not in fused or len(op.inputs) <= _CELL_STATE:
        continue
      traced = traced_from(subgraph, op)
      if traced is None:
        if op.inputs[_PROJECTION_WEIGHTS] < 0:
          unprojected.append(tuple(
              subgraph.tensors[op.inputs[k]].shape[-1]
              for k in (_OUTPUT_STATE, _CELL_STATE)))
        continue
      matched.append(traced)
      weights = np.ascontiguousarray(traced.projection.T)
      buffer = schema.BufferT()
      buffer.data = np.frombuffer(weights.tobytes(), np.uint8)
      model.buffers.append(buffer)
      tensor = schema.TensorT()
      tensor.shape = list(weights.shape)
      tensor.type = schema.TensorType.FLOAT32
      tensor.buffer = len(model.buffers) - 1
      tensor.name = b"projection_weights"
      subgraph.tensors.append(tensor)
      op.inputs[_PROJECTION_WEIGHTS] = len(subgraph.tensors) - 1
  # A fused op left without a projection must be a plain LSTM's: h as wide
  # as c, and (should a traced projected LSTM have found no op, as when
  # the converter ran its function's body instead) not of that LSTM's
  # widths, which could be it unmatched.
  def key(t):  # A model traced twice records each layer twice.
    return tuple(a.tobytes() for a in t)
  found = {key(t) for t in matched}
  unmatched = {t.projection.shape[::-1] for t in projections
               if key(t) not in found}
  for h, c in unprojected:
    if h != c or (h, c) in unmatched:
      raise ValueError(
          f"A fused LSTM has h {h} and c {c} wide and no projection, and "
          "no projected LSTM traced was matched to it by its kernels. "
          "Convert with converter.convert() (a loop) instead.")
  return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def inner_loop(layer, sequences, time_major, initial_state, mask,
               fused_lstm: bool):
  """`keras.layers.RNN.inner_loop` on the convertible loops.

  Args:
    layer: The `keras.layers.RNN` (a tf_recurrent layer) being called.
    sequences: Its batch-major inputs, as Keras passed them.
    time_major: The same inputs time-major `[T, B, ...]`, already reversed
      if the layer goes backwards.
    initial_state: Its list of initial states.
    mask: None or the `[T, B]` bool mask, time-major like `time_major`.
    fused_lstm: Whether the cell is a plain LSTMCell (tanh/sigmoid; dropout
      is off at inference), which runs `lstm_function` when unmasked, or
      such a cell with a `projection` weight, which does so while `convert`
      runs (float32 only).

  Returns:
    `(last_output, outputs [B, T, ...], states)` as Keras's inner loop
    returns them.
  """
  cell = layer.cell
  initial_state = list(initial_state)
  projection = getattr(cell, "projection", None)
  if projection is not None and not (_projections is not None and
                                     cell.compute_dtype == "float32"):
    fused_lstm = False  # Outside `convert`: the fused op would not project.
  if fused_lstm and mask is None:
    dtype = cell.compute_dtype
    bias = cell.bias if cell.use_bias else tf.zeros([4 * cell.units], dtype)
    projection_value = None
    if projection is not None:
      traced = _Projection(*(_value(w) for w in (
          projection, cell.kernel, cell.recurrent_kernel)))
      _projections.append(traced)
      projection_value = traced.projection
    last, outputs, h, c, _ = lstm_function(layer.go_backwards,
                                           projection_value)(
        *[tf.cast(t, dtype) for t in (
            sequences, initial_state[0], initial_state[1], cell.kernel,
            cell.recurrent_kernel, bias)])
    return last, outputs, [h, c]
  kwargs = {"training": False} if getattr(cell, "_call_has_training_arg",
                                          False) else {}

  def step(inputs_t, states):
    return cell(inputs_t, states, **kwargs)

  batch = tf.nest.flatten(sequences)[0].shape[0]
  output_size = getattr(cell, "output_size", None)
  if isinstance(output_size, int) and output_size > 0:
    zero_output = tf.zeros([batch, output_size], cell.compute_dtype)
  else:
    zero_output = tf.zeros_like(tf.nest.flatten(initial_state)[0])
  outputs, states, last = run_cell(step, time_major, initial_state,
                                   zero_output, mask,
                                   layer.zero_output_for_mask)
  perm = [1, 0] + list(range(2, outputs.shape.rank))
  return last, tf.transpose(outputs, perm), list(states)
