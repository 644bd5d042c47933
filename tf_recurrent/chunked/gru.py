"""The GRU's math for the chunked loops, both of Keras's `reset_after`.

`Gru` is `reset_after=True` (the reset gate applied after the recurrent
matmul: one sequential GEMM a step each way); `GruResetBefore` is
`reset_after=False` (two).
"""

import tensorflow as tf

from tf_recurrent.chunked import cell as cell_lib
from tf_recurrent.op import cells


class Gru(cell_lib.Cell):
  """GRU math (Keras `reset_after=True`, gates `[z, r, h]`) for the loops.

  Zoneout needs nothing of it: the gradient reads h entering a step (the
  outputs, zoned out) and the kept or recomputed gates.

  Weights: kernel `[D, 3H]`, recurrent_kernel `[H, 3H]`, bias `[3H]` (the
  input bias), recurrent_bias `[3H]`. State: `(h,)`. Kept per step (unless
  recomputing): `[z, r, h~, U_h h + b_h]`, gate-major `[4, B, H]`.
  """

  gates = 3
  gate_rows = 4
  kept_with_gates = ("gates",)
  takes_zoneout = True

  def _gates(self, w, projected, h):
    recurrent = w["recurrent"](h) + w["recurrent_bias"]
    xz, xr, xh = tf.split(projected, 3, axis=-1)
    rz, rr, rh = tf.split(recurrent, 3, axis=-1)
    z = tf.sigmoid(xz + rz)
    r = tf.sigmoid(xr + rr)
    hh = tf.tanh(xh + r * rh)
    return z, r, hh, rh

  def step(self, w, state, projected):
    (h,) = state
    gates = self._gates(w, projected, h)  # z, r, h~ (, more kept).
    z, hh = gates[0], gates[2]
    h1 = z * h + (1.0 - z) * hh
    rows = {"h": h1}
    if not self.recompute:
      rows["gates"] = tf.stack(gates)
    return (h1,), rows

  def prepare(self, w, kept, entry, x_block, mask_block, zone_block=None):
    # h_prev is read from the outputs, carried when masked, zoned out.
    del mask_block, zone_block
    h_prev = cell_lib.shift_in(entry[0], kept["h"])
    if self.recompute:
      gates = tf.stack(self._gates(w, self.project(w, x_block), h_prev),
                       axis=1)
    else:
      gates = kept["gates"]
    return {"gates": gates, "h_prev": h_prev}

  def grad_step(self, w, prep, j, dstate):
    (dh,) = dstate
    gates = prep["gates"][j]  # Aliased slices, as in `Lstm.grad_step`.
    z, r, hh, rh = gates[0], gates[1], gates[2], gates[3]
    dz, dr, dhh = cells.gru_gate_grads(z, r, hh, rh, prep["h_prev"][j], dh)
    drecurrent = tf.concat([dz, dr, dhh * r], axis=-1)
    dh_prev = dh * z + w["recurrent"].input_grad(drecurrent)
    return (dh_prev,), tf.concat([dz, dr, dhh], axis=-1)

  def weight_grads(self, w, prep, dprojected_block, x_block):
    zr, dhh = cell_lib.split_last(dprojected_block, [2, 1])
    drecurrent = tf.concat([zr, dhh * prep["gates"][:, 1]], axis=-1)
    grads, dx = super().weight_grads(w, prep, dprojected_block, x_block)
    grads["recurrent_kernel"] = w["recurrent"].kernel_grad(prep["h_prev"],
                                                           drecurrent)
    grads["recurrent_bias"] = cell_lib.column_sums(drecurrent)
    return grads, dx


class GruResetBefore(Gru):
  """GRU math with Keras's `reset_after=False` (the reset gate applied to h
  before the matmul: `h~ = tanh(x W_h + (r * h) U_h + b_h)`).

  Weights: kernel `[D, 3H]`, recurrent_kernel `[H, 3H]`, bias `[3H]`. Two
  sequential GEMMs per step each way: `h U_zr`, then `(r * h) U_h`. Kept
  per step (unless recomputing): `[z, r, h~]`, gate-major `[3, B, H]`.
  """

  gate_rows = 3

  def weights(self, w, dropout):
    w = cell_lib.Cell.weights(self, w, dropout)
    zr, h = cell_lib.split_last(w["recurrent_kernel"], [2, 1])
    masks_ = dropout.get("recurrent")
    w["recurrent_zr"] = cell_lib.Linear(zr, 2, cell_lib.block_masks(masks_, [0, 1]))
    w["recurrent_h"] = cell_lib.Linear(h, 1, cell_lib.block_masks(masks_, [2]))
    return w

  def _gates(self, w, projected, h):
    xz, xr, xh = tf.split(projected, 3, axis=-1)
    rz, rr = tf.split(w["recurrent_zr"](h), 2, axis=-1)
    z = tf.sigmoid(xz + rz)
    r = tf.sigmoid(xr + rr)
    return z, r, tf.tanh(xh + w["recurrent_h"](r * h))

  def grad_step(self, w, prep, j, dstate):
    (dh,) = dstate
    gates = prep["gates"][j]
    z, r, hh = gates[0], gates[1], gates[2]
    h_prev = prep["h_prev"][j]
    dhh = tf.raw_ops.TanhGrad(y=hh, dy=dh * (1.0 - z))
    dz = tf.raw_ops.SigmoidGrad(y=z, dy=dh * (h_prev - hh))
    d_reset_h = w["recurrent_h"].input_grad(dhh)  # d (r * h_prev)
    dr = tf.raw_ops.SigmoidGrad(y=r, dy=d_reset_h * h_prev)
    dh_prev = (dh * z + d_reset_h * r +
               w["recurrent_zr"].input_grad(tf.concat([dz, dr], axis=-1)))
    return (dh_prev,), tf.concat([dz, dr, dhh], axis=-1)

  def weight_grads(self, w, prep, dprojected_block, x_block):
    dzr, dhh = cell_lib.split_last(dprojected_block, [2, 1])
    # The input kernel's and bias's as any cell's (not `Gru`'s, whose
    # recurrent kernel reads h itself and has a bias of its own).
    grads, dx = cell_lib.Cell.weight_grads(self, w, prep, dprojected_block, x_block)
    h_prev = prep["h_prev"]
    grads["recurrent_kernel"] = tf.concat([
        w["recurrent_zr"].kernel_grad(h_prev, dzr),
        w["recurrent_h"].kernel_grad(prep["gates"][:, 1] * h_prev, dhh)],
        axis=-1)
    return grads, dx
