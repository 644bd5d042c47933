"""`gated_scan`: a linear recurrence whose a_t, b_t a gate function builds
from the inputs, trained as one chunked custom gradient.

minGRU, minLSTM and Griffin's RG-LRU compute a_t and b_t from x_t alone
(gate projections and activations), then run h_t = a_t h_{t-1} + b_t.
Autodiff of that pipeline keeps every gate of every step (the issue's
prototype: 12-14 states per step). Here the whole of it is one
`tf.custom_gradient`:

* forward, chunk by chunk: the chunk's `[K, B, D]` inputs go through
  `gate_fn` at once (one GEMM over K * B rows), then the chunk's steps run
  (`chunks.state_steps`). Kept: h only (the outputs; h at a chunk's
  boundary is the state entering the next chunk).
* backward, chunks last to first: the chunk's a, b are rebuilt from its
  inputs under a tape, the adjoint runs over its steps
  (`chunks.adjoint_steps`), and the tape turns da = g h_{t-1}, db = g into
  the chunk's input gradient and its share of the weight gradients (one
  batched backward pass of `gate_fn` per chunk).

The prototype measured this at 2.6x `tf_recurrent.LSTM`'s training step
and about 3 states per step.

A gate function is `gate_fn(x, *weights) -> (a, b)`: x `[..., D]`, a and
b `[..., H]`, any leading axes (a chunk's `[K, B]`, a step's `[B]`), made
of differentiable TensorFlow ops, elementwise in the leading axes. The
layers' one-step call runs the same function on one step, so a model
trained over whole sequences decodes step by step with the same numbers.
"""

import functools
from typing import Callable, Optional, Sequence, Tuple, Union

import tensorflow as tf

from tf_recurrent.linear import chunks
from tf_recurrent.op import first_order
from tf_recurrent.op import structs

GateFunction = Callable[..., Tuple[tf.Tensor, tf.Tensor]]

SECOND_ORDER_WHAT = "The linear recurrent layers' loop (gated_scan)"
SECOND_ORDER_REMEDY = ("For a second order, run the layer's cell step by "
                       "step in a Python loop: autodiff's gradient.")


@tf.autograph.experimental.do_not_convert
def gated_scan(gate_fn: GateFunction, x: tf.Tensor,
               weights: Sequence[tf.Tensor], initial_state: tf.Tensor, *,
               mask: Optional[tf.Tensor] = None, reverse: bool = False,
               chunk_size: Union[str, int] = "auto"
               ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Runs h_t = a_t * h_{t-1} + b_t with `(a_t, b_t) = gate_fn(x_t, *weights)`.

  Args:
    gate_fn: `gate_fn(x, *weights) -> (a, b)` (see the module's doc). It
      must be a function of its arguments only (a module-level function):
      eager calls cache their traced loops by it.
    x: `[B, T, D]` inputs (batch-major), float16, bfloat16, float32 or
      float64. Half precision runs the recurrence in float32.
    weights: The tensors `gate_fn` reads (read variables before the call:
      their gradients reach them through the read).
    initial_state: h_0, `[B, H]`, of x's dtype.
    mask: Optional `[B, T]` bools; a masked step carries h unchanged (and
      gets no gradient through a, b).
    reverse: Run from the last step to the first (h_t = a_t h_{t+1} + b_t).
    chunk_size: Steps per chunk ("auto": 64); any gives the same numbers.

  Returns:
    `(h, last)`: h `[B, T, H]` every state in x's dtype (a masked step's
    row holds the state carried through it), last `[B, H]` the state after
    the last step run.

  Example:

  >>> import tensorflow as tf
  >>> def decay_gates(x, w):      # a = sigmoid(x w), b = 1 - a
  ...   a = tf.sigmoid(tf.tensordot(x, w, 1))
  ...   return a, 1.0 - a
  >>> x, w = tf.ones([2, 5, 3]), tf.zeros([3, 4])
  >>> h, last = gated_scan(decay_gates, x, [w], tf.zeros([2, 4]))
  >>> h.shape, float(last[0, 0])
  (TensorShape([2, 5, 4]), 0.96875)
  """
  chunk = chunks.check_chunk_size(chunk_size)
  x = tf.convert_to_tensor(x)
  if x.shape.rank != 3 or x.dtype not in chunks.FLOATS:
    raise ValueError("gated_scan: x must be a float [batch, time, features] "
                     f"tensor; got {structs.describe(x)}.")
  weights = [tf.convert_to_tensor(w) for w in weights]
  h0 = tf.convert_to_tensor(initial_state)
  if h0.dtype != x.dtype or h0.shape.rank != 2:
    raise ValueError(f"gated_scan: initial_state must be [batch, units] of "
                     f"x's dtype {x.dtype.name}; got {structs.describe(h0)}.")
  if mask is not None:
    mask = tf.cast(mask, tf.bool)
    if not mask.shape.is_compatible_with(x.shape[:2]):
      raise ValueError(f"gated_scan: mask must be [batch, time] = "
                       f"{x.shape[:2]}; got {structs.describe(mask)}.")
  config = (gate_fn, reverse, chunk, len(weights), mask is not None)
  return _scan(config, x, h0, weights, mask)


def _scan(config, x, h0, weights, mask):
  count = config[3]
  extra = [mask] if mask is not None else []

  @tf.custom_gradient
  def scan(x, h0, *args):
    weights, mask = list(args[:count]), (args[count] if config[4] else None)
    # Cut from any tape (the eager path's tf.function call would build its
    # own, undefined, gradient); what the backward pass reads sits behind
    # an identity TensorFlow does not differentiate past (`first_order`).
    cut = functools.partial(tf.nest.map_structure, tf.stop_gradient)
    h, last = _run(_forward, config, *cut((x, h0, weights)), mask)
    saved_h = first_order.saved_for_backward(h)

    def grad(dh, dlast):
      dx, dh0, dw = first_order.first_order_only(
          lambda *args: _run(_backward, config, *args, mask),
          [x, h0, weights, saved_h, dh, dlast],
          watch=[x, h0, weights, dh, dlast], what=SECOND_ORDER_WHAT,
          remedy=SECOND_ORDER_REMEDY)
      return [dx, dh0] + list(dw) + [None] * len(extra)

    return [h, last], grad

  h, last = scan(x, h0, *weights, *extra)
  return h, last


def _run(fn, config, *args):
  if tf.executing_eagerly():
    return _traced(fn, config)(*args)
  return fn(config, *args)


@functools.lru_cache(maxsize=64)
def _traced(fn, config):
  return tf.function(functools.partial(fn, config), autograph=False,
                     reduce_retracing=True)


def _gates(gate_fn, x_rows, weights, valid, work):
  a, b = gate_fn(x_rows, *weights)
  return chunks.identity_where_masked(valid, tf.cast(a, work),
                                      tf.cast(b, work))


def _forward(config, x, h0, weights, mask):
  gate_fn, reverse, chunk = config[:3]
  grid = chunks.Grid(x, chunk, time_major=False, descending=reverse)
  work = chunks.accumulation_dtype(x.dtype)
  like = tf.zeros(tf.concat([tf.shape(x)[:2], tf.shape(h0)[1:]], 0), x.dtype)
  like.set_shape(x.shape[:2].concatenate(h0.shape[1:]))
  outputs = grid.blocks(like, x.dtype)

  def chunk_body(start, steps, h, handle):
    valid = None if mask is None else grid.valid_from_mask(mask, start)
    a, b = _gates(gate_fn, grid.rows(x, start), weights, valid, work)
    block, h = chunks.state_steps([a], [b], h, steps, reverse)
    return h, outputs.write(handle, start, tf.cast(block[0], x.dtype))

  h, handle = grid.loop(chunk_body, ([tf.cast(h0, work)], outputs.empty()))
  return outputs.join(handle), tf.cast(h[0], h0.dtype)


def _backward(config, x, h0, weights, h, dh, dlast, mask):
  gate_fn, reverse, chunk = config[:3]
  grid = chunks.Grid(x, chunk, time_major=False, descending=not reverse)
  work = chunks.accumulation_dtype(x.dtype)
  dx_out = grid.blocks(x, x.dtype)

  def chunk_body(start, steps, u, dw, handle):
    valid = None if mask is None else grid.valid_from_mask(mask, start)
    x_rows = grid.rows(x, start)
    with tf.GradientTape() as tape:
      tape.watch([x_rows] + weights)
      a, b = gate_fn(x_rows, *weights)
      a, b = tf.cast(a, work), tf.cast(b, work)
    a_steps = chunks.identity_where_masked(valid, a, b)[0]
    dh_rows = (tf.zeros_like(a) if dh is None else
               tf.cast(grid.rows(dh, start), work))
    g, u = chunks.adjoint_steps([a_steps], [dh_rows], u, steps,
                                not reverse)
    g = chunks.zero_where_masked(valid, g[0])
    da = g * tf.cast(grid.previous_rows(h, h0, start, reverse), work)
    dx_rows, *dw_rows = tape.gradient(
        [a, b], [x_rows] + weights, output_gradients=[da, g],
        unconnected_gradients=tf.UnconnectedGradients.ZERO)
    dw = [total + tf.cast(tf.convert_to_tensor(d), total.dtype)
          for total, d in zip(dw, dw_rows)]
    return u, dw, dx_out.write(handle, start, tf.cast(dx_rows, x.dtype))

  u0 = [tf.zeros_like(h0, work) if dlast is None else tf.cast(dlast, work)]
  dw0 = [tf.zeros_like(w, chunks.accumulation_dtype(w.dtype))
         for w in weights]
  u, dw, handle = grid.loop(chunk_body, (u0, dw0, dx_out.empty()))
  return (dx_out.join(handle), tf.cast(u[0], h0.dtype),
          [tf.cast(d, w.dtype) for d, w in zip(dw, weights)])
