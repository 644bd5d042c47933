"""Per-step row writes into a [T, ...] accumulator at O(1) cost in every mode.

The forward loop writes one state row per step and the backward loop one
input-gradient row per step. Which primitive writes a row in place depends on
who runs the loop:

* Under XLA (`jit_compile=True`, TPU): `tf.tensor_scatter_nd_update` on a
  preallocated buffer lowers to a dynamic-update-slice that XLA performs in
  place.
* In the TF executor the same op copies the whole buffer on every step (a
  training step becomes quadratic in T). A TensorList written once per index
  forwards its buffer instead, and unwritten rows stack as zeros.

`tf.raw_ops.InplaceUpdate`, which the tf.contrib op used, aliases the
caller's tensor, so it is used only by `InPlaceBlocks`, on buffers it
allocates itself inside a graph.

XLA on CPU computes bfloat16 and float16 scatters in float32, converting the
whole buffer on every write (a bfloat16 LSTM became quadratic in T: 1.1 ms a
step at T=100, 4.0 ms at T=800 for a [32, 512] row). Those buffers hold the
rows' bits as uint16 instead, which XLA writes in place (10-17 us a step).
"""

import tensorflow as tf

try:  # The one place XLA's tracing context is visible from Python.
  from tensorflow.python.ops import control_flow_util as _control_flow_util
except ImportError:  # pragma: no cover - depends on the TF build.
  _control_flow_util = None


def in_xla_context() -> bool:
  """True while tracing a function that XLA will compile (jit_compile=True)."""
  if _control_flow_util is None:  # pragma: no cover
    return False
  graph = tf.compat.v1.get_default_graph()
  return bool(_control_flow_util.GraphOrParentsInXlaContext(graph))


class RowAccumulator:
  """Writes rows `acc[t] = row` into a `[num_rows] + row.shape` tensor.

  The accumulator itself is a plain tensor (a buffer under XLA, a TensorList
  handle otherwise), so it can be a `tf.while_loop` variable.

  Example:

  >>> template = tf.zeros([2])
  >>> acc = RowAccumulator(template, num_rows=3, use_xla=False)
  >>> handle = acc.write(acc.empty(), 1, tf.ones([2]))
  >>> acc.stack(handle).numpy().tolist()
  [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
  """

  def __init__(self, template: tf.Tensor, num_rows, use_xla: bool):
    """Creates the accumulator description.

    Args:
      template: A tensor shaped and typed like one row.
      num_rows: Scalar int (tensor or Python), the number of rows.
      use_xla: Whether the loop is compiled by XLA.
    """
    self._init(tf.shape(template), template.shape, template.dtype, num_rows,
               use_xla)

  @classmethod
  def like_rows_of(cls, tensor: tf.Tensor, use_xla: bool) -> "RowAccumulator":
    """An accumulator shaped like `tensor` itself (rows of `tensor[0]`)."""
    acc = cls.__new__(cls)
    shape = tf.shape(tensor)
    acc._init(shape[1:], tensor.shape[1:], tensor.dtype, shape[0], use_xla)
    return acc

  def _init(self, row_shape, static_row_shape, dtype, num_rows, use_xla):
    self._dtype = dtype
    # What the XLA buffer holds: 16-bit floats as their bits (see above).
    self._storage = (tf.uint16 if use_xla and dtype in (tf.bfloat16,
                                                        tf.float16)
                     else dtype)
    self._row_shape = row_shape
    self._static_shape = tf.TensorShape(
        [tf.get_static_value(num_rows)]).concatenate(static_row_shape)
    self._num_rows = num_rows
    self._use_xla = use_xla

  def empty(self) -> tf.Tensor:
    """A fresh accumulator whose rows are all zeros."""
    if self._use_xla:
      shape = tf.concat([[self._num_rows], self._row_shape], axis=0)
      return tf.zeros(shape, self._storage)
    return tf.raw_ops.TensorListReserve(
        element_shape=self._row_shape,
        num_elements=self._num_rows,
        element_dtype=self._dtype)

  def write(self, handle: tf.Tensor, index, row: tf.Tensor) -> tf.Tensor:
    """Returns the accumulator with row `index` set to `row`."""
    if self._use_xla:
      if self._storage != self._dtype:
        row = tf.bitcast(row, self._storage)
      return tf.tensor_scatter_nd_update(
          handle, tf.reshape(tf.cast(index, tf.int32), [1, 1]),
          tf.expand_dims(row, 0))
    return tf.raw_ops.TensorListSetItem(
        input_handle=handle, index=index, item=row)

  def stack(self, handle: tf.Tensor) -> tf.Tensor:
    """The dense `[num_rows, ...]` tensor; rows never written are zeros."""
    if self._use_xla:
      dense = handle
      if self._storage != self._dtype:
        dense = tf.bitcast(dense, self._dtype)
    else:
      dense = tf.raw_ops.TensorListStack(
          input_handle=handle,
          element_shape=self._row_shape,
          element_dtype=self._dtype,
          num_elements=-1)
    dense.set_shape(self._static_shape)
    return dense


def read_row(tensor: tf.Tensor, index) -> tf.Tensor:
  """`tensor[index]` along the leading axis, without copying it.

  A leading-axis slice: the TF executor aliases the row in the tensor's
  buffer, where `tf.gather` copies it (at B=256 a copy per read was a large
  part of a step, benchmarks/SHAPES.md); XLA reads both as a dynamic slice.
  """
  return tensor[index]


class InPlaceBlocks(RowAccumulator):
  """A RowAccumulator whose handle is a dense tensor in every mode.

  For a few large rows (one block of steps each) that a gradient function
  captures: SavedModel cannot save a gradient function that captures a
  TensorList (a variant), and stacking one at the end of a loop holds it
  twice for a moment. In the TF executor the buffer is allocated by
  `tf.raw_ops.Empty` (never constant-folded or shared) and each row is
  written into it in place with `tf.raw_ops.InplaceUpdate`, as Lingvo's
  recurrent does; under XLA it is RowAccumulator's buffer. Graph mode only
  (the caller traces a function when called eagerly).

  Example:

  >>> @tf.function
  ... def fill():
  ...   acc = InPlaceBlocks(tf.zeros([2]), num_rows=3, use_xla=False)
  ...   return acc.stack(acc.write(acc.empty(), 1, tf.ones([2])))
  >>> fill()[1].numpy().tolist()
  [1.0, 1.0]
  """

  def empty(self) -> tf.Tensor:
    if self._use_xla:
      return super().empty()
    shape = tf.concat([[self._num_rows], self._row_shape], axis=0)
    return tf.raw_ops.Empty(shape=shape, dtype=self._dtype, init=True)

  def write(self, handle: tf.Tensor, index, row: tf.Tensor) -> tf.Tensor:
    if self._use_xla:
      return super().write(handle, index, row)
    return tf.raw_ops.InplaceUpdate(
        x=handle, i=tf.reshape(tf.cast(index, tf.int32), [1]),
        v=tf.expand_dims(row, 0))

  def stack(self, handle: tf.Tensor) -> tf.Tensor:
    if self._use_xla:
      return super().stack(handle)
    dense = tf.identity(handle)
    dense.set_shape(self._static_shape)
    return dense
