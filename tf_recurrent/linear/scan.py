"""`linear_scan`: h_t = a_t * h_{t-1} + b_t with its own gradient.

The forward pass runs the recurrence chunk by chunk (`chunks.Grid`,
`chunks.state_steps`): sequential across chunks and within them, in
linear space. The issue's prototypes measured why: on CPU, parallel scans
(odd-even associative, Hillis-Steele, `keras.ops.associative_scan`) were
no faster than the sequential loop; the log-space form
(`cumulative_logsumexp`) was 1,000x less accurate in float32 and 40x
slower under XLA; the cumulative-product form overflows into NaN.

The gradient is the reverse scan of the adjoint (`chunks.adjoint_steps`):
g_t = dL/dh_t + a_{t+1} g_{t+1}, da_t = g_t h_{t-1}, db_t = g_t,
dL/dh_0 = a_1 g_1 (1-indexed steps). It keeps nothing but h (and a, b,
h_0, which the caller holds): autodiff of the loop would keep every
step's intermediate values, and under XLA compiles in time growing faster
than T.
"""

import functools
from typing import Any, Optional, Tuple, Union

import numpy as np
import tensorflow as tf

from tf_recurrent.linear import chunks
from tf_recurrent.op import first_order
from tf_recurrent.op import structs

SECOND_ORDER_WHAT = "tf_recurrent.linear_scan"
SECOND_ORDER_REMEDY = ("For a second order, write the recurrence as a "
                       "Python loop or tf.scan: autodiff's gradient.")



# Plain Python control flow on Python values: nothing for AutoGraph to
# convert (a caller's `tf.function` would otherwise convert every function
# this calls, seconds per trace).
@tf.autograph.experimental.do_not_convert
def linear_scan(a: Any, b: Any, initial_state: Any = None, *,
                time_major: bool = False, reverse: bool = False,
                sequence_length: Optional[Any] = None,
                chunk_size: Union[str, int] = "auto") -> Tuple[Any, Any]:
  """Runs `h_t = a_t * h_{t-1} + b_t` over time; returns (every h, the last).

  Elementwise and linear in h, so the only sequential work is one
  multiply-add per element and step. The gradient is hand-written (the
  reverse scan of the adjoint) and keeps only the returned h, in eager
  mode, `tf.function`, XLA (`jit_compile=True`) and TF1 graphs.

  Args:
    a: The decays: a tensor `[B, T, ...]` (`[T, B, ...]` with
      `time_major=True`), or a nested structure of them. float16, bfloat16,
      float32 or float64; half precision runs the recurrence in float32 and
      returns its inputs' dtype.
    b: The inputs added each step: the structure of `a`, each leaf of its
      leaf's shape and dtype.
    initial_state: h_0: the structure of `a`, each leaf `[B, ...]`, or None
      for zeros.
    time_major: Whether time is the leading axis of a and b.
    reverse: Run from the last step to the first: h_t = a_t h_{t+1} + b_t,
      h_T = h_0; the last h is then h at step 0.
    sequence_length: Optional `[B]` integers: example i runs steps
      `t < sequence_length[i]` only (with `reverse`, from step
      `sequence_length[i] - 1` down). Past them h is carried through
      unchanged: its rows at the other steps hold the state carried into
      them, and the last h is the state after its last step run.
    chunk_size: Steps per chunk of the loop ("auto": 64). Any positive int
      gives the same numbers.

  Returns:
    `(h, last)`: h the structure of `a`, each leaf h_t at every step in
    a's layout; last the structure of `initial_state`, the state after the
    last step run.

  Raises:
    TypeError, ValueError: For mismatched structures, shapes or dtypes,
      naming the leaf at fault, or a bad `chunk_size`/`sequence_length`.

  Example:

  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> a = tf.fill([1, 4, 1], 0.5)             # [B, T, H]
  >>> b = tf.ones([1, 4, 1])
  >>> h, last = tf_recurrent.linear_scan(a, b)
  >>> h[0, :, 0].numpy().tolist()
  [1.0, 1.5, 1.75, 1.875]
  >>> float(last[0, 0])
  1.875

  Structures, lengths and gradients:

  >>> a = {"x": tf.fill([2, 3, 2], 0.5), "y": tf.fill([2, 3], 0.9)}
  >>> b = {"x": tf.ones([2, 3, 2]), "y": tf.ones([2, 3])}
  >>> with tf.GradientTape() as tape:
  ...   tape.watch(b)
  ...   h, last = tf_recurrent.linear_scan(a, b, sequence_length=[3, 1])
  ...   loss = tf.reduce_sum(last["x"])
  >>> last["x"].numpy().tolist()
  [[1.75, 1.75], [1.0, 1.0]]
  >>> tape.gradient(loss, b)["x"][:, :, 0].numpy().tolist()
  [[0.25, 0.5, 1.0], [1.0, 0.0, 0.0]]
  """
  chunk = chunks.check_chunk_size(chunk_size)
  for name, value in (("time_major", time_major), ("reverse", reverse)):
    if not isinstance(value, bool):
      raise TypeError(f"{name} must be a bool; got {value!r}.")
  a, b, h0 = _checked(a, b, initial_state, time_major)
  flat_a, flat_b = tf.nest.flatten(a), tf.nest.flatten(b)
  lengths = None
  if sequence_length is not None:
    lengths = _checked_lengths(sequence_length, flat_a, time_major)
  if not flat_a:
    return a, h0
  config = _Config(time_major, reverse, chunk, len(flat_a), lengths is not None)
  flat = _scan(config, flat_a, flat_b, tf.nest.flatten(h0), lengths)
  count = len(flat_a)
  return (tf.nest.pack_sequence_as(a, flat[:count]),
          tf.nest.pack_sequence_as(h0, flat[count:]))


def _checked(a, b, initial_state, time_major):
  """a, b and h_0 as tensors, after checking that their leaves match."""
  structs.check_same_structure(a, b, "a", "b")
  a = structs.to_tensors(a, "a")
  b = structs.to_tensors(b, "b")
  if initial_state is not None:
    structs.check_same_structure(a, initial_state, "a", "initial_state")
    initial_state = structs.to_tensors(initial_state, "initial_state")
  time_axis = 0 if time_major else 1
  layout = "[T, B, ...]" if time_major else "[B, T, ...]"
  paths = list(zip(structs.leaf_paths(a, "a"), structs.leaf_paths(b, "b")))
  leading = None  # (batch, T) seen so far, and the leaf they came from.
  flat_h0 = []
  flat_init = (tf.nest.flatten(initial_state) if initial_state is not None
               else [None] * len(paths))
  init_paths = (structs.leaf_paths(initial_state, "initial_state")
                if initial_state is not None else [None] * len(paths))
  for (path_a, path_b), x, y, h0, path_h0 in zip(
      paths, tf.nest.flatten(a), tf.nest.flatten(b), flat_init, init_paths):
    if x.dtype not in chunks.FLOATS:
      raise TypeError(
          f"{path_a} must be float16, bfloat16, float32 or float64; got "
          f"{structs.describe(x)}.")
    if y.dtype != x.dtype:
      raise TypeError(f"{path_b} must have the dtype of {path_a}: "
                      f"{structs.describe(y)} vs {structs.describe(x)}.")
    if x.shape.rank is None or x.shape.rank < 2:
      raise ValueError(f"{path_a} must have shape {layout} with known rank; "
                       f"got {structs.describe(x)}.")
    if not x.shape.is_compatible_with(y.shape):
      raise ValueError(f"{path_b} must have the shape of {path_a}: "
                       f"{structs.describe(y)} vs {structs.describe(x)}.")
    shape = x.shape.merge_with(y.shape)
    dims = (shape[1 - time_axis], shape[time_axis])
    if leading is None:
      leading = (dims, path_a)
    else:
      for i, what in enumerate(("batch size", "number of steps")):
        if None not in (dims[i], leading[0][i]) and dims[i] != leading[0][i]:
          raise ValueError(
              f"{path_a} has {what} {dims[i]} but {leading[1]} has "
              f"{leading[0][i]}: every leaf of a and b must share B and T.")
    state_shape = shape[:time_axis].concatenate(shape[time_axis + 1:])
    if h0 is None:
      flat_h0.append(tf.zeros(
          tf.concat([tf.shape(x)[:time_axis], tf.shape(x)[time_axis + 1:]],
                    0), x.dtype))
      flat_h0[-1].set_shape(state_shape)
      continue
    if h0.dtype != x.dtype:
      raise TypeError(f"{path_h0} must have the dtype of {path_a}: "
                      f"{structs.describe(h0)} vs {structs.describe(x)}.")
    if not state_shape.is_compatible_with(h0.shape):
      raise ValueError(
          f"{path_h0} must have shape {state_shape} ({path_a}'s without its "
          f"time axis); got {structs.describe(h0)}.")
    flat_h0.append(h0)
  return a, b, tf.nest.pack_sequence_as(a, flat_h0)


def _checked_lengths(sequence_length, flat_a, time_major):
  lengths = tf.convert_to_tensor(sequence_length)
  if not lengths.dtype.is_integer or lengths.shape.rank != 1:
    raise ValueError(
        "sequence_length must be a [batch] vector of integers; got "
        f"{structs.describe(lengths)}.")
  if not flat_a:
    return lengths
  batch_axis, time_axis = (1, 0) if time_major else (0, 1)
  batch, total = flat_a[0].shape[batch_axis], flat_a[0].shape[time_axis]
  if None not in (batch, lengths.shape[0]) and batch != lengths.shape[0]:
    raise ValueError(f"sequence_length has {lengths.shape[0]} entries but a "
                     f"has batch size {batch}.")
  values = tf.get_static_value(lengths)
  if values is not None and values.size:
    if np.min(values) < 0 or (total is not None and np.max(values) > total):
      raise ValueError(f"sequence_length must be in [0, T={total}]; got "
                       f"{values.tolist()}.")
  return tf.cast(lengths, tf.int32)


class _Config(tuple):
  """The static arguments of one scan (a key of the eager functions)."""

  def __new__(cls, time_major, reverse, chunk, count, has_lengths):
    return super().__new__(cls, (time_major, reverse, chunk, count,
                                 has_lengths))

  time_major = property(lambda self: self[0])
  reverse = property(lambda self: self[1])
  chunk = property(lambda self: self[2])
  count = property(lambda self: self[3])
  has_lengths = property(lambda self: self[4])


def _scan(config, flat_a, flat_b, flat_h0, lengths):
  """The flat scan with its gradient: returns every h, then the last h."""
  count = config.count
  extra = [lengths] if lengths is not None else []

  @tf.custom_gradient
  def scan(*args):
    a, b, h0 = args[:count], args[count:2 * count], args[2 * count:3 * count]
    lengths = args[3 * count] if config.has_lengths else None
    # Cut from any tape: the gradient is grad's, and a tape watching the
    # eager path's tf.function call would build that function's own
    # (unneeded, and for in-place writes undefined) gradient.
    h, last = _run(_forward, config, *_cut((a, b, h0)), lengths)
    # What the backward pass reads, behind an identity TensorFlow does not
    # differentiate past (a second order fails loudly, `first_order`).
    saved_h = first_order.saved_for_backward(h)

    def grad(*d):
      dh, dlast = list(d[:count]), list(d[count:])
      da, db, dh0 = first_order.first_order_only(
          lambda *args: _run(_backward, config, *args, lengths),
          [a, h0, saved_h, dh, dlast], watch=[a, b, h0, dh, dlast],
          what=SECOND_ORDER_WHAT, remedy=SECOND_ORDER_REMEDY)
      return list(da) + list(db) + list(dh0) + [None] * len(extra)

    return list(h) + list(last), grad

  return scan(*flat_a, *flat_b, *flat_h0, *extra)


def _cut(structure):
  return tf.nest.map_structure(tf.stop_gradient, structure)


def _run(fn, config, *args):
  """`fn(config, *args)`; called eagerly, as a traced function (a
  `tf.while_loop` would run as a Python loop)."""
  if tf.executing_eagerly():
    return _traced(fn, config)(*args)
  return fn(config, *args)


@functools.lru_cache(maxsize=None)
def _traced(fn, config):
  return tf.function(functools.partial(fn, config), autograph=False,
                     reduce_retracing=True)


def _valid(grid, lengths, start):
  return None if lengths is None else grid.valid_from_lengths(lengths, start)


def _forward(config, a, b, h0, lengths):
  """Every h (in a's layout and dtype) and the last h."""
  grid = chunks.Grid(a[0], config.chunk, config.time_major, config.reverse)
  work = chunks.accumulation_dtype(a[0].dtype)
  outputs = [grid.blocks(x, x.dtype) for x in a]

  def chunk(start, steps, h, handles):
    valid = _valid(grid, lengths, start)
    rows = [chunks.identity_where_masked(
        valid, tf.cast(grid.rows(x, start), work),
        tf.cast(grid.rows(y, start), work)) for x, y in zip(a, b)]
    block, h = chunks.state_steps([r[0] for r in rows], [r[1] for r in rows],
                                  h, steps, config.reverse)
    return h, [out.write(handle, start, tf.cast(rows_h, x.dtype))
               for out, handle, rows_h, x in zip(outputs, handles, block, a)]

  h, handles = grid.loop(chunk, ([tf.cast(x, work) for x in h0],
                                 [out.empty() for out in outputs]))
  return ([out.join(handle) for out, handle in zip(outputs, handles)],
          [tf.cast(x, y.dtype) for x, y in zip(h, h0)])


def _backward(config, a, h0, h, dh, dlast, lengths):
  """(da, db, dh0) from the gradients of every h and of the last h."""
  grid = chunks.Grid(a[0], config.chunk, config.time_major,
                     not config.reverse)
  work = chunks.accumulation_dtype(a[0].dtype)
  da_out = [grid.blocks(x, x.dtype) for x in a]
  db_out = [grid.blocks(x, x.dtype) for x in a]

  def chunk(start, steps, u, da_handles, db_handles):
    valid = _valid(grid, lengths, start)
    a_rows = [chunks.identity_where_masked(
        valid, tf.cast(grid.rows(x, start), work), tf.zeros([], work))[0]
              for x in a]
    dh_rows = [tf.zeros_like(r) if d is None else
               tf.cast(grid.rows(d, start), work)
               for r, d in zip(a_rows, dh)]
    g, u = chunks.adjoint_steps(a_rows, dh_rows, u, steps,
                                not config.reverse)
    g = [chunks.zero_where_masked(valid, gi) for gi in g]
    da = [gi * tf.cast(grid.previous_rows(hi, h0i, start,
                                                       config.reverse), work)
          for gi, hi, h0i in zip(g, h, h0)]
    return (u,
            [o.write(hd, start, tf.cast(x, y.dtype))
             for o, hd, x, y in zip(da_out, da_handles, da, a)],
            [o.write(hd, start, tf.cast(x, y.dtype))
             for o, hd, x, y in zip(db_out, db_handles, g, a)])

  u0 = [tf.zeros_like(x, work) if d is None else tf.cast(d, work)
        for x, d in zip(h0, dlast)]
  u, da_handles, db_handles = grid.loop(
      chunk, (u0, [o.empty() for o in da_out], [o.empty() for o in db_out]))
  return ([o.join(hd) for o, hd in zip(da_out, da_handles)],
          [o.join(hd) for o, hd in zip(db_out, db_handles)],
          [tf.cast(x, y.dtype) for x, y in zip(u, h0)])
