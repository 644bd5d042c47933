"""TFLite conversion of models whose layers run tf_recurrent's loops.

A Keras layer's inference call (nothing differentiates it, traced into a
graph) runs the loops of `tf_recurrent.engine.inference`, which TFLite's
converter lowers to builtin ops: a plain LSTM to one fused
`UNIDIRECTIONAL_SEQUENCE_LSTM` op, every other cell to a builtin `WHILE`
loop. `convert` runs a converter and gives the fused ops of projected LSTMs
their projection weights; `op_names` and `without_cell_clip` read and fix
a flatbuffer.
"""

from typing import List, Optional

import numpy as np
import tensorflow as tf

from tf_recurrent.engine import inference


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

  Example (a Keras model's, as in docs/export.md's "Deploy to TFLite":
  `convert(tf.lite.TFLiteConverter.from_keras_model(model))`; any
  converter works, this one runs on every TensorFlow the package supports):

  >>> f = tf.function(lambda x: tf.tanh(x),
  ...                 input_signature=[tf.TensorSpec([2], tf.float32)])
  >>> op_names(convert(tf.lite.TFLiteConverter.from_concrete_functions(
  ...     [f.get_concrete_function()])))
  ['TANH']
  """
  with inference.tracing_projections(
      not converter.optimizations) as traced:
    model_content = converter.convert()
  return _with_projections(model_content, traced) if traced else model_content


# TFLite's LSTM inputs (lite/kernels/lstm_shared.h).
_INPUT_TO_INPUT_WEIGHTS = 1
_RECURRENT_TO_INPUT_WEIGHTS = 5
_PROJECTION_WEIGHTS = 16
_OUTPUT_STATE = 18
_CELL_STATE = 19


def _with_projections(model_content: bytes,
                      projections: List[inference.Projection]) -> bytes:
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

  def traced_from(subgraph, op) -> Optional[inference.Projection]:
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

