"""The chunk grid and the sequential step loops of linear recurrences.

`h_t = a_t * h_{t-1} + b_t` runs chunk by chunk: a `tf.while_loop` over
chunks of at most `chunk` steps, and in each chunk a `tf.while_loop` over
its steps. A chunk gathers its `[K, B, ...]` rows of a, b (or of whatever
the caller builds them from) from the call's layout once, so that a step
reads an aliased leading-axis slice, and writes its K outputs as one block
of a dense buffer (`Blocks`: a tensor a gradient function may capture,
written in place; under XLA the result itself, in the call's layout). No
time-major copy of a whole input lives across the call.

The gradient is the same loop run the other way over the adjoint
(`adjoint_steps`): g_t = dL/dh_t + a_{t+1} g_{t+1}, carried between steps
and chunks as u = a_t g_t, so that a chunk reads only its own rows of a.

Masked steps (a `[K, B]` bool block per chunk) are identity steps: a = 1,
b = 0 (`identity_where_masked`), so h is carried through them unchanged
and the adjoint passes straight through; the callers zero the masked rows
of da and db.

Half-precision inputs accumulate in float32 (`accumulation_dtype`): the
chunk's rows are cast once per chunk, the carried state is float32, and
the outputs are written back in the inputs' dtype.
"""

import abc
from typing import Callable, List, Optional, Sequence, Tuple, Union

import tensorflow as tf
# XLA's dynamic-update-slice: a block written in place at any offset of
# any axis (TensorFlow's own in-place writes are along the leading axis).
from tensorflow.compiler.tf2xla.python import xla  # pylint: disable=g-direct-tensorflow-import

from tf_recurrent.op import accumulators

Tensor = tf.Tensor

# Steps per chunk when chunk_size="auto": the prototype ran its
# chunked minGRU at 64 steps. A chunk's buffers are K rows; its batched
# work (gathers, a layer's gate GEMMs) runs over K * B rows at once.
AUTO_CHUNK = 64
_HALF = (tf.float16, tf.bfloat16)
FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def accumulation_dtype(dtype: tf.DType) -> tf.DType:
  """The dtype the recurrence runs in: float32 for float16/bfloat16 inputs."""
  return tf.float32 if dtype in _HALF else dtype


def check_chunk_size(chunk_size: Union[str, int]) -> int:
  """The chunk length for `chunk_size` ("auto" or a positive int)."""
  if isinstance(chunk_size, str) and chunk_size == "auto":
    return AUTO_CHUNK
  if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
    raise TypeError(
        f'chunk_size must be "auto" or a positive int; got {chunk_size!r}.')
  if chunk_size < 1:
    raise ValueError(
        f'chunk_size must be "auto" or a positive int; got {chunk_size}.')
  return chunk_size


def _ceil_div(x, y):
  return -(-x // y) if isinstance(x, int) else (x + y - 1) // y


class Grid:
  """The chunks of one call, visited forwards or backwards in time.

  Chunk c covers steps `[c*K, min(c*K + K, T))`, K the shortest length
  that covers T with as few chunks as `chunk` steps each allow (T=130 and
  chunk 64: three chunks of 44). Tensors in the call's layout are `[T, B,
  ...]` (time_major) or `[B, T, ...]`; a chunk's rows are time-major.

  Args:
    like: A tensor in the call's layout (its time axis sets T).
    chunk: The longest chunk.
    time_major: The call's layout.
    descending: Visit the chunks (and the steps in them) from the last.
  """

  def __init__(self, like: Tensor, chunk: int, time_major: bool,
               descending: bool):
    self.time_axis = 0 if time_major else 1
    self.time_major = time_major
    self.descending = descending
    static_total = like.shape[self.time_axis]
    self.total = (static_total if static_total is not None else
                  tf.shape(like, out_type=tf.int32)[self.time_axis])
    self.count = _ceil_div(self.total, chunk)
    if isinstance(self.count, int):
      self.size = max(1, _ceil_div(self.total, max(self.count, 1)))
    else:
      self.size = tf.maximum(
          1, _ceil_div(self.total, tf.maximum(self.count, 1)))
    self.use_xla = accumulators.in_xla_context()

  def loop(self, body: Callable, loop_vars: Sequence) -> List:
    """Runs `body(start, steps, *loop_vars) -> loop_vars` once per chunk in
    the visiting order; one chunk known while tracing runs without a loop."""
    if isinstance(self.count, int) and self.count <= 1:
      if self.count == 0:
        return list(loop_vars)
      return list(body(0, self.total, *loop_vars))

    def chunk(c, *loop_vars):
      index = self.count - 1 - c if self.descending else c
      start = index * self.size
      steps = tf.minimum(self.size, self.total - start)
      return (c + 1, *body(start, steps, *loop_vars))

    return list(tf.while_loop(lambda c, *_: c < self.count, chunk,
                              (0, *loop_vars),
                              parallel_iterations=2)[1:])

  def _indices(self, start, offset=0):
    return start + offset + tf.range(self.size)

  def rows(self, tensor: Tensor, start) -> Tensor:
    """The chunk's `[K, B, ...]` rows of a tensor in the call's layout
    (past T: the last row again)."""
    index = tf.minimum(self._indices(start), self.total - 1)
    rows = tf.gather(tensor, index, axis=self.time_axis)
    return rows if self.time_major else _swap_leading(rows)

  def previous_rows(self, h: Tensor, h0: Tensor, start,
                    reverse: bool) -> Tensor:
    """Row k: the state step start + k of a scan read, h at the step
    before it (`h0` for the first step); `reverse`: the scan's direction."""
    index = self._indices(start, offset=1 if reverse else -1)
    inside = tf.logical_and(index >= 0, index < self.total)
    rows = tf.gather(h, tf.clip_by_value(index, 0, self.total - 1),
                     axis=self.time_axis)
    rows = rows if self.time_major else _swap_leading(rows)
    return tf.where(_expand_to(inside, rows.shape.rank), rows,
                    tf.cast(h0, rows.dtype)[None])

  def valid_from_lengths(self, lengths: Tensor, start) -> Tensor:
    """`[K, B]` bools: which examples run each step of the chunk."""
    return self._indices(start)[:, None] < lengths[None, :]

  def valid_from_mask(self, mask: Tensor, start) -> Tensor:
    """The chunk's `[K, B]` rows of a `[B, T]` (or time-major `[T, B]`)
    mask."""
    index = tf.minimum(self._indices(start), self.total - 1)
    rows = tf.gather(mask, index, axis=self.time_axis)
    return rows if self.time_major else tf.transpose(rows)

  def blocks(self, like: Tensor, dtype: tf.DType) -> "Blocks":
    """A buffer of one `[K, B, ...]` block per chunk, shaped from a tensor
    `like` in the call's layout."""
    return (_LayoutBlocks if self.use_xla else _TimeMajorBlocks)(
        self, like, dtype)


class Blocks(abc.ABC):
  """One `[K, B, ...]` block per chunk, written in place, read back as the
  `[T, ...]` rows in the call's layout (`join`).

  Two buffers, one per executor. Under XLA (`_LayoutBlocks`) the buffer is
  the result itself, in the call's layout: each block is written where its
  rows go (a dynamic-update-slice, in place). Time-major blocks joined by a
  transpose held a batch-major result twice (the blocks and the transpose),
  and XLA laid the transpose out time-major and copied it once more into
  the batch-major layout the backward loop read. The TF executor writes in
  place only along the leading axis (`InplaceUpdate`): time-major blocks
  there (`_TimeMajorBlocks`), transposed once at the join.
  """

  def __init__(self, grid: Grid, like: Tensor):
    self._grid = grid
    self._static_shape = like.shape

  @abc.abstractmethod
  def empty(self) -> Tensor:
    """The buffer before any block is written (a loop variable)."""

  @abc.abstractmethod
  def write(self, handle: Tensor, start, block: Tensor) -> Tensor:
    """The buffer `handle` with `block` written at steps `start...`."""

  @abc.abstractmethod
  def join(self, handle: Tensor) -> Tensor:
    """The `[T, ...]` rows in the call's layout."""


class _TimeMajorBlocks(Blocks):
  """The TF executor's buffer: time-major blocks, transposed at the join."""

  def __init__(self, grid: Grid, like: Tensor, dtype: tf.DType):
    super().__init__(grid, like)
    time_major_shape = _swap_shape(like) if not grid.time_major else (
        tf.shape(like))
    static = like.shape if grid.time_major else _swap_static(like.shape)
    row_shape = tf.concat([[grid.size], time_major_shape[1:]], 0)
    template = tf.zeros(row_shape, dtype)
    template.set_shape(tf.TensorShape(
        [grid.size if isinstance(grid.size, int) else None]).concatenate(
            static[1:]))
    self._acc = accumulators.InPlaceBlocks(template, grid.count,
                                           use_xla=False)

  def empty(self) -> Tensor:
    return self._acc.empty()

  def write(self, handle: Tensor, start, block: Tensor) -> Tensor:
    return self._acc.write(handle, start // self._grid.size, block)

  def join(self, handle: Tensor) -> Tensor:
    blocks = self._acc.stack(handle)
    rows = tf.reshape(blocks, tf.concat([[-1], tf.shape(blocks)[2:]], 0))
    rows = rows[:self._grid.total]
    rows = rows if self._grid.time_major else _swap_leading(rows)
    rows.set_shape(self._static_shape)
    return rows


class _LayoutBlocks(Blocks):
  """XLA's buffer: the `[T, ...]` result in the call's layout."""

  def __init__(self, grid: Grid, like: Tensor, dtype: tf.DType):
    super().__init__(grid, like)
    self._shape, self._dtype = tf.shape(like), dtype

  def empty(self) -> Tensor:
    return tf.zeros(self._shape, self._dtype)

  def write(self, handle: Tensor, start, block: Tensor) -> Tensor:
    """A last chunk shorter than K would run past T, where XLA moves the
    whole slice back inside: it is written at T - K instead, its rows moved
    to the end and the rows before them kept."""
    grid, axis = self._grid, self._grid.time_axis
    rows = block if grid.time_major else _swap_leading(block)
    rank = rows.shape.rank
    size, total = grid.size, grid.total
    at = tf.minimum(start, total - size)
    if not (isinstance(size, int) and isinstance(total, int) and
            total % size == 0):
      shift = start - at
      row = tf.reshape(tf.range(size), [-1 if i == axis else 1
                                        for i in range(rank)])
      moved = tf.gather(rows, tf.maximum(tf.range(size) - shift, 0),
                        axis=axis)
      kept = tf.slice(handle, _origin(at, axis, rank), tf.shape(rows))
      rows = tf.where(row >= shift, moved, kept)
    return xla.dynamic_update_slice(handle, rows, _origin(at, axis, rank))

  def join(self, handle: Tensor) -> Tensor:
    handle.set_shape(self._static_shape)
    return handle


def _origin(at, axis: int, rank: int) -> Tensor:
  """The start of a slice at row `at` of axis `axis` (0 elsewhere)."""
  at = tf.cast(at, tf.int32)
  return tf.stack([at if i == axis else tf.constant(0)
                   for i in range(rank)])


def _swap_leading(x: Tensor) -> Tensor:
  rank = x.shape.rank
  return tf.transpose(x, [1, 0] + list(range(2, rank)))


def _swap_shape(x: Tensor) -> Tensor:
  shape = tf.shape(x)
  return tf.concat([shape[1:2], shape[:1], shape[2:]], 0)


def _swap_static(shape: tf.TensorShape) -> tf.TensorShape:
  dims = shape.as_list()
  return tf.TensorShape([dims[1], dims[0]] + dims[2:])


def _expand_to(mask: Tensor, rank: int) -> Tensor:
  return tf.reshape(mask, tf.concat(
      [tf.shape(mask), tf.ones([rank - mask.shape.rank], tf.int32)], 0))


def identity_where_masked(valid: Optional[Tensor], a: Tensor,
                          b: Tensor) -> Tuple[Tensor, Tensor]:
  """(a, b) with the rows of masked steps made identity steps (1, 0)."""
  if valid is None:
    return a, b
  valid = _expand_to(valid, a.shape.rank)
  return (tf.where(valid, a, tf.ones_like(a)),
          tf.where(valid, b, tf.zeros_like(b)))


def zero_where_masked(valid: Optional[Tensor], x: Tensor) -> Tensor:
  if valid is None:
    return x
  return tf.where(_expand_to(valid, x.shape.rank), x, tf.zeros_like(x))


def _steps(step: Callable, a: List[Tensor], b: List[Tensor],
           carry: List[Tensor], steps, descending: bool):
  """Runs `step(a_k, b_k, carry) -> (carry, out)` over rows k of a chunk
  (`[K, B, ...]` blocks), in order or from row `steps - 1` down; returns
  (the `[K, ...]` outputs, zeros in rows not run; the carry)."""
  use_xla = accumulators.in_xla_context()
  outs = [accumulators.RowAccumulator.like_rows_of(x, use_xla) for x in a]

  def body(i, carry, handles):
    k = steps - 1 - i if descending else i
    new, out = zip(*[step(ai[k], bi[k], ci)
                     for ai, bi, ci in zip(a, b, carry)])
    return (i + 1, list(new),
            [acc.write(h, k, o) for acc, h, o in zip(outs, handles, out)])

  _, carry, handles = tf.while_loop(
      lambda i, *_: i < steps, body,
      (0, list(carry), [acc.empty() for acc in outs]))
  return [acc.stack(h) for acc, h in zip(outs, handles)], carry


def state_steps(a: List[Tensor], b: List[Tensor], h: List[Tensor], steps,
                descending: bool):
  """h = a_k * h + b_k over a chunk's rows; returns (every h, the last)."""
  def step(a_k, b_k, h):
    h = a_k * h + b_k
    return h, h
  return _steps(step, a, b, h, steps, descending)


def adjoint_steps(a: List[Tensor], dh: List[Tensor], u: List[Tensor], steps,
                  descending: bool):
  """The adjoint over a chunk's rows, visited in `descending` order:
  g_k = dh_k + u, then u = a_k g_k. Returns (every g, the last u)."""
  def step(a_k, dh_k, u):
    g = dh_k + u
    return a_k * g, g
  return _steps(step, a, dh, u, steps, descending)
