"""TensorFlow's whole-sequence LSTM kernels, for small LSTMs without XLA.

At small hidden sizes a training step of the chunked loops (`sequence.py`)
is bound by the TF executor's per-op cost: a step is a few dozen ops of a
few microseconds of work each. TensorFlow ships a CPU kernel pair that runs
a whole sequence in one op each way: `BlockLSTMV2` (forward; keeps i, c, f,
o, the cell input, tanh(c) and h per step, 7 x `[B, H]`) and
`BlockLSTMGradV2` (backward, weight gradients summed per step). Its gate
layout is Keras's `[i, f, c, o]`, so Keras's weights feed it as they are:
`w = concat([kernel, recurrent_kernel])`, `b = bias`.

Measured (benchmarks/SHAPES.md, a training step against `keras.layers.LSTM`
without XLA, 2-core EPYC, fresh processes): 1.36x Keras at B=32 H=32, where
the chunked loops reached 0.74-0.87x; 0.69x at B=256 H=32 (loops 0.52x);
equal to the loops at B=32 H=64. Its backward sums `[x, h]^T dz` per step,
which the chunked loops batch per chunk: at B=32 H=256 a first prototype of
it reached 0.82x where the loops reach 1.8x. So `sequence.run`
uses it only where `applies`: an LSTM without masks, dropout, zoneout or
projection, float32, not recomputing (it keeps 7 rows a step), no XLA
(no kernel there), and at most `MAX_UNITS` units.
"""

from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_recurrent.chunked import cell as cell_lib
from tf_recurrent.op import first_order

Tensor = tf.Tensor

# The largest H run on the kernel pair (benchmarks/SHAPES.md).
MAX_UNITS = 64
_WEIGHTS = ("bias", "kernel", "recurrent_kernel")


def applies(kind: str, x: Tensor, weights: Dict[str, Tensor],
            recompute: bool, mode: str, mask: Optional[Tensor],
            dropout, zoneout) -> bool:
  """Whether `sequence.run`'s call runs on the kernel pair (see above)."""
  if (kind != "lstm" or recompute or mode == "xla" or mask is not None or
      dropout or zoneout is not None or
      sorted(weights) != list(_WEIGHTS)):
    return False
  if x.dtype != tf.float32 or any(w.dtype != tf.float32
                                  for w in weights.values()):
    return False
  units = weights["recurrent_kernel"].shape[0]
  return units is not None and units <= MAX_UNITS and x.shape.rank == 3


def run(x: Tensor, state0: Sequence[Tensor],
        weights: Dict[str, Tensor]) -> Tuple[Tensor, List[Tensor]]:
  """An LSTM over time-major `x` `[T, B, D]` (T >= 1) from `state0` `[h, c]`.

  Returns `(outputs [T, B, H], [h, c] after the last step)`, as
  `sequence.run("lstm", ...)`, with the kernel pair's gradient.

  Example:

  >>> w = {"kernel": tf.ones([3, 8]), "recurrent_kernel": tf.ones([2, 8]),
  ...      "bias": tf.zeros([8])}
  >>> outputs, (h, c) = run(tf.ones([5, 4, 3]),
  ...                       [tf.zeros([4, 2]), tf.zeros([4, 2])], w)
  >>> outputs.shape
  TensorShape([5, 4, 2])
  """

  @tf.custom_gradient
  def lstm(x, h0, c0, kernel, recurrent_kernel, bias):
    inputs = {"seq_len_max": tf.cast(tf.shape(x)[0], tf.int64), "x": x,
              "cs_prev": c0, "h_prev": h0,
              "w": tf.concat([kernel, recurrent_kernel], axis=0), "b": bias}
    no_peephole = tf.zeros(tf.shape(bias)[-1:] // 4, x.dtype)
    peepholes = {"wci": no_peephole, "wcf": no_peephole, "wco": no_peephole,
                 "use_peephole": False}
    i, cs, f, o, ci, co, h = tf.raw_ops.BlockLSTMV2(
        cell_clip=0.0, **inputs, **peepholes)
    # What the gradient kernel reads of the forward kernel, behind an
    # identity TensorFlow does not differentiate past (see first_order).
    saved = first_order.saved_for_backward([i, cs, f, o, ci, co, h])

    def grad(d_outputs, dh_final, dc_final):
      def backward(inputs, saved, d_outputs, dh_final, dc_final):
        i, cs, f, o, ci, co, h = saved

        def at_last_step(d):
          """`[T, B, H]`: zeros, and `d` (None: zeros) at the last step."""
          if d is None:
            return tf.zeros_like(h)
          return tf.concat([tf.zeros_like(h[:-1]), d[None]], axis=0)

        h_grad = at_last_step(dh_final)
        if d_outputs is not None:
          h_grad += d_outputs
        dx, dc0, dh0, dw, _, _, _, db = tf.raw_ops.BlockLSTMGradV2(
            i=i, cs=cs, f=f, o=o, ci=ci, co=co, h=h,
            cs_grad=at_last_step(dc_final), h_grad=h_grad, **inputs,
            **peepholes)
        inputs_width = tf.shape(kernel)[0]
        return (dx, dh0, dc0, dw[:inputs_width], dw[inputs_width:], db)

      # BlockLSTMGradV2 has no gradient: a second order fails when run.
      return first_order.first_order_only(
          backward, [inputs, saved, d_outputs, dh_final, dc_final],
          watch=[x, h0, c0, kernel, recurrent_kernel, bias, d_outputs,
                 dh_final, dc_final],
          what=cell_lib.SECOND_ORDER_WHAT,
          remedy=cell_lib.SECOND_ORDER_REMEDY)

    return (h, h[-1], cs[-1]), grad

  h0, c0 = state0
  outputs, h, c = lstm(x, h0, c0, *(weights[k] for k in
                                    ("kernel", "recurrent_kernel", "bias")))
  return outputs, [h, c]
