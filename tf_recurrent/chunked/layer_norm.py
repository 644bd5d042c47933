"""Layer-normalized cells' math for the chunked loops of `sequence`.

Kinds "layer_norm_lstm" and "layer_norm_simple_rnn" (TF Addons'
`LayerNormLSTMCell` and `LayerNormSimpleRNNCell`, Ba et al. 2016). A layer
norm is `LN(t) = n * gamma (+ beta)` with `n = (t - mean) * rstd`,
`rstd = 1 / sqrt(var + epsilon)`, mean and (biased) variance over the last
axis, per row.

Layer-norm LSTM, Keras gate blocks `[i, f, c, o]`:

    z = LN_x(x W) + LN_h(h U) + b          (over all four gates, 4H)
    c = LN_c(f * c_prev + i * tanh(z_c))   (over H; the carried c)
    h = o * tanh(c)

Weights: kernel, recurrent_kernel, bias, and per norm gamma and beta:
`kernel_gamma/beta`, `recurrent_gamma/beta` `[4H]`, `state_gamma/beta`
`[H]`. Kept per step (unless recomputing): c, H floats. The backward pass
rebuilds a chunk's gates from its inputs and outputs with two GEMMs over
the chunk (`x W`, `h_prev U`) and batched norms; a step then runs the
elementwise gradient and one GEMM, `d(h U) U^T`.

Layer-norm SimpleRNN: `h = tanh(LN(x W + h U) + b)`, a norm with a scale
(`gamma` `[H]`) and no shift. Kept: nothing but the outputs.

A step's gradient row carries, besides the pre-norm gradient the chunk's
weight GEMMs read, what the norms' gamma and beta gradients sum over the
chunk: for the LSTM `[dz (4H) | dc (H)]`, for the SimpleRNN
`[d(x W + h U) (H) | d(LN + b) (H)]`.
"""

from typing import Optional, Tuple

import tensorflow as tf

from tf_recurrent.chunked import cell as cell_lib
from tf_recurrent.op import masks

Tensor = tf.Tensor


# Norms of 16-bit floats are computed in float32, as Keras's
# LayerNormalization does under a mixed-precision policy; the backward pass
# keeps their n and rstd in float32 (bfloat16's rounding of n, amplified by
# the norm's gradient, cost 3x Keras's error against float32).
_HALF = (tf.bfloat16, tf.float16)


def _wide(t: Tensor) -> Tensor:
  """`t` in float32 if it is a 16-bit float, else as it is."""
  return tf.cast(t, tf.float32) if t.dtype in _HALF else t


def _normalize(t: Tensor, epsilon: float) -> Tuple[Tensor, Tensor]:
  """`(n, rstd)` of a layer norm over `t`'s last axis, in float32 for a
  16-bit `t` (rstd keeps the axis, 1)."""
  mean, variance = tf.nn.moments(_wide(t), axes=[-1], keepdims=True)
  rstd = tf.math.rsqrt(variance + epsilon)
  return (_wide(t) - mean) * rstd, rstd


def _scaled(n: Tensor, gamma: Tensor, beta: Optional[Tensor],
            dtype) -> Tensor:
  """`n * gamma + beta` computed in n's dtype (float32 for 16-bit inputs,
  as Keras's LayerNormalization: a bfloat16 product cost 3x Keras's error
  against float32), in `dtype`."""
  out = n * tf.cast(gamma, n.dtype)
  if beta is not None:
    out += tf.cast(beta, n.dtype)
  return tf.cast(out, dtype)


def _normalize_grad(n: Tensor, rstd: Tensor, dn: Tensor) -> Tensor:
  """The gradient of `t` given that of `n` (`dn`, after the scale gamma),
  in dn's dtype."""
  wide = tf.cast(dn, n.dtype)
  mean_dn = tf.reduce_mean(wide, axis=-1, keepdims=True)
  mean_dn_n = tf.reduce_mean(wide * n, axis=-1, keepdims=True)
  return tf.cast(rstd * (wide - mean_dn - n * mean_dn_n), dn.dtype)


def _scale_grad(d: Tensor, n: Tensor) -> Tensor:
  """A norm's gamma gradient over a block, `sum(d * n)`, in n's dtype."""
  return cell_lib.column_sums(tf.cast(d, n.dtype) * n)


class LayerNormLstm(cell_lib.Cell):
  """The layer-norm LSTM (see the module docstring). State `(h, c)`."""

  gates = 4
  grad_gates = 5  # [dz | dc], see the module docstring.
  state_rows = ("h", "c")
  kept_with_gates = ("c",)

  def project(self, w, x_block):
    xw = w["input"](x_block)
    n, _ = _normalize(xw, self.epsilon)
    return (_scaled(n, w["kernel_gamma"], w["kernel_beta"], xw.dtype) +
            w["bias"])

  def _gates(self, z):
    """`(i, f, g, o)` of pre-activations `[..., 4H]`."""
    zi, zf, zg, zo = tf.split(z, 4, axis=-1)
    return tf.sigmoid(zi), tf.sigmoid(zf), tf.tanh(zg), tf.sigmoid(zo)

  def _recurrent(self, w, h):
    """`(LN_h(h U), its n, its rstd)` (n and rstd as `_normalize`'s)."""
    n, rstd = _normalize(w["recurrent"](h), self.epsilon)
    return (_scaled(n, w["recurrent_gamma"], w["recurrent_beta"], h.dtype),
            n, rstd)

  def _cell_state(self, w, i, f, g, c_prev):
    """`(c, its n, its rstd)`: the normalized new c."""
    n, rstd = _normalize(f * c_prev + i * g, self.epsilon)
    return (_scaled(n, w["state_gamma"], w["state_beta"], c_prev.dtype), n,
            rstd)

  def step(self, w, state, projected):
    h, c = state
    i, f, g, o = self._gates(projected + self._recurrent(w, h)[0])
    c1, _, _ = self._cell_state(w, i, f, g, c)
    h1 = o * tf.tanh(c1)
    rows = {"h": h1}
    if "c" in self.kept():
      rows["c"] = c1
    return (h1, c1), rows

  def prepare(self, w, kept, entry, x_block, mask_block):
    h_entry, c_entry = entry
    h_prev = cell_lib.shift_in(h_entry, kept["h"])
    x_n, x_rstd = _normalize(w["input"](x_block), self.epsilon)
    recurrent, r_n, r_rstd = self._recurrent(w, h_prev)
    z = (_scaled(x_n, w["kernel_gamma"], w["kernel_beta"], h_prev.dtype) +
         w["bias"] + recurrent)
    i, f, g, o = self._gates(z)
    if self.recompute:
      # c along the chunk, elementwise (its norm is per row); a masked
      # step carries c.
      def rebuild(c_prev, inputs):
        c = self._cell_state(w, *inputs[:3], c_prev)[0]
        return c if mask_block is None else masks.select(inputs[3], c, c_prev)
      c = tf.scan(rebuild, (i, f, g) + (() if mask_block is None
                                        else (mask_block,)),
                  initializer=c_entry)
    else:
      c = kept["c"]
    c_prev = cell_lib.shift_in(c_entry, c)
    # At a masked step this is the c it would have computed; its gradient
    # row is zeroed and its state gradient passed through by the loop.
    _, c_n, c_rstd = self._cell_state(w, i, f, g, c_prev)
    return {"i": i, "f": f, "g": g, "o": o, "c": c, "c_prev": c_prev,
            "c_n": c_n, "c_rstd": c_rstd, "x_n": x_n, "x_rstd": x_rstd,
            "r_n": r_n, "r_rstd": r_rstd, "h_prev": h_prev}

  def grad_step(self, w, prep, j, dstate):
    dh, dc = dstate
    i, f, g, o = prep["i"][j], prep["f"][j], prep["g"][j], prep["o"][j]
    tanh_c = tf.tanh(prep["c"][j])
    dzo = tf.raw_ops.SigmoidGrad(y=o, dy=dh * tanh_c)
    dc = dc + tf.raw_ops.TanhGrad(y=tanh_c, dy=dh * o)
    dc_sum = _normalize_grad(prep["c_n"][j], prep["c_rstd"][j],
                             dc * w["state_gamma"])
    dz = tf.concat([tf.raw_ops.SigmoidGrad(y=i, dy=dc_sum * g),
                    tf.raw_ops.SigmoidGrad(y=f, dy=dc_sum * prep["c_prev"][j]),
                    tf.raw_ops.TanhGrad(y=g, dy=dc_sum * i), dzo], axis=-1)
    dr = _normalize_grad(prep["r_n"][j], prep["r_rstd"][j],
                         dz * w["recurrent_gamma"])
    return ((w["recurrent"].input_grad(dr), dc_sum * f),
            tf.concat([dz, dc], axis=-1))

  def weight_grads(self, w, prep, grad_block, x_block):
    dz, dc = cell_lib.split_last(grad_block, [4, 1])
    dr = _normalize_grad(prep["r_n"], prep["r_rstd"],
                         dz * w["recurrent_gamma"])
    dxw = _normalize_grad(prep["x_n"], prep["x_rstd"], dz * w["kernel_gamma"])
    sums = cell_lib.column_sums
    grads = {"kernel": w["input"].kernel_grad(x_block, dxw),
             "recurrent_kernel": w["recurrent"].kernel_grad(prep["h_prev"],
                                                            dr),
             "bias": sums(dz),
             "kernel_gamma": _scale_grad(dz, prep["x_n"]),
             "kernel_beta": sums(dz),
             "recurrent_gamma": _scale_grad(dz, prep["r_n"]),
             "recurrent_beta": sums(dz),
             "state_gamma": _scale_grad(dc, prep["c_n"]),
             "state_beta": sums(dc)}
    return grads, w["input"].input_grad(dxw)


class LayerNormSimpleRnn(cell_lib.Cell):
  """The layer-norm SimpleRNN (see the module docstring). State `(h,)`."""

  gates = 1
  grad_gates = 2  # [d(x W + h U) | d(LN + b)].

  def project(self, w, x_block):
    return w["input"](x_block)

  def step(self, w, state, projected):
    net = projected + w["recurrent"](state[0])
    n, _ = _normalize(net, self.epsilon)
    h1 = tf.tanh(_scaled(n, w["gamma"], None, net.dtype) + w["bias"])
    return (h1,), {"h": h1}

  def prepare(self, w, kept, entry, x_block, mask_block):
    del mask_block  # A masked step's gradient row is zero.
    h_prev = cell_lib.shift_in(entry[0], kept["h"])
    n, rstd = _normalize(w["input"](x_block) + w["recurrent"](h_prev),
                         self.epsilon)
    return {"h": kept["h"], "h_prev": h_prev, "n": n, "rstd": rstd}

  def grad_step(self, w, prep, j, dstate):
    da = tf.raw_ops.TanhGrad(y=prep["h"][j], dy=dstate[0])
    dnet = _normalize_grad(prep["n"][j], prep["rstd"][j], da * w["gamma"])
    return (w["recurrent"].input_grad(dnet),), tf.concat([dnet, da], axis=-1)

  def weight_grads(self, w, prep, grad_block, x_block):
    dnet, da = cell_lib.split_last(grad_block, [1, 1])
    grads, dx = super().weight_grads(w, prep, dnet, x_block)
    grads["bias"] = cell_lib.column_sums(da)
    grads["gamma"] = _scale_grad(da, prep["n"])
    return grads, dx

