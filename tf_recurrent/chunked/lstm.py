"""The LSTM's math for the chunked loops: plain, projected, with peepholes.

`Lstm` runs Keras's `LSTMCell` (and, with a `projection` weight, PyTorch's
`proj_size` / TF1's `num_proj` LSTM); `PeepholeLstm` adds diagonal
peephole weights. Inside the loops the gate blocks are in TensorFlow's
fused-kernel order, so that the backward step is one `LSTMBlockCellGrad`
op in the TF executor.
"""

import tensorflow as tf

from tf_recurrent.chunked import cell as cell_lib
from tf_recurrent.op import cells
from tf_recurrent.op import masks

Tensor = tf.Tensor


# Keras's LSTM gate blocks [i, f, c, o] in the order of TensorFlow's fused
# LSTM kernels, [i, c, f, o] (a swap of the middle two: its own inverse).
_ICFO = (0, 2, 1, 3)


def _reorder_gates(t: Tensor, order, count: int, axis: int = -1) -> Tensor:
  """`t`'s `axis`, `count` gate blocks long, with its blocks in `order`."""
  blocks = tf.split(t, count, axis=axis)
  return tf.concat([blocks[k] for k in order], axis=axis)


# The dtypes `LSTMBlockCellGrad` has CPU kernels for.
_FUSED_GRAD_DTYPES = (tf.float32, tf.float16)


def _no_peephole(like: Tensor) -> Tensor:
  """The fused gradient's peephole weights, unused (`use_peephole=False`)."""
  return tf.zeros(tf.shape(like)[-1:], like.dtype)


class Lstm(cell_lib.Cell):
  """LSTM math for the chunked loops.

  Weights (Keras's layout, gate blocks `[i, f, c, o]`): kernel `[D, 4H]`,
  recurrent_kernel `[H, 4H]`, bias `[4H]`. Inside the loops the blocks are
  in the order `[i, c, f, o]` of TensorFlow's fused LSTM kernels, so that
  the backward step's elementwise work is one `LSTMBlockCellGrad` op in the
  TF executor (`_FUSED_GRAD_DTYPES`; XLA has no kernel for it and fuses the
  plain math itself). State: `(h, c)`.

  Kept per step (unless recomputing): the gate activations `[4, B, H]`
  (gate-major, so that a step reads each gate as an aliased slice, not a
  copy) and, in the TF executor, c. Under XLA a chunk's c is rebuilt from
  the gates instead (one fused elementwise pass, where the executor's scan
  cost 26-96 us a step at B=256): 0.5x the state less memory per step.
  The outputs give h entering a step.

  With a `projection` weight `[H, P]` (PyTorch's `nn.LSTM(proj_size=P)`,
  TF1's `LSTMCell(num_proj=P)`), `h = (o * tanh(c)) @ projection` is P
  wide and the recurrent kernel is `[P, 4H]`. Backward, a step's
  `d(o * tanh(c))` is `dh @ projection^T` (a second sequential GEMM), and
  its gradient row carries dh `[B, P]` after dz for the projection's
  gradient, one GEMM per chunk.
  """

  gates = 4
  gate_rows = 4
  state_rows = ("h", "c")
  takes_zoneout = True

  def kept(self):
    if self.recompute:
      return ()
    return ("gates",) if self.use_xla else ("c", "gates")

  @property
  def projected(self) -> bool:
    return "projection" in self.weight_names

  def grad_columns(self, widths):
    return 4 * widths["cell"] + (widths["h"] if self.projected else 0)

  def weights(self, w, dropout):
    w = {k: (_reorder_gates(v, _ICFO, 4) if k in _LSTM_WEIGHTS else v)
         for k, v in w.items()}
    dropout = {k: cell_lib.block_masks(m, _ICFO) for k, m in dropout.items()}
    w = super().weights(w, dropout)
    if self.projected:
      w["projection_t"] = tf.transpose(w["projection"])
      # The fused gradient's w only gives it shapes: `[H, 4H]`.
      units = tf.shape(w["projection"])[0]
      w["fused_shape"] = tf.zeros([units, 4 * units], w["projection"].dtype)
    else:
      w["fused_shape"] = w["recurrent_kernel"]
    return w

  def _output(self, w, m):
    """h from `m = o * tanh(c)` (`[..., B, H]`): m, or m projected."""
    return cell_lib.matmul_rows(m, w["projection"]) if self.projected else m

  def external_grads(self, grads):
    return {k: (_reorder_gates(v, _ICFO, 4) if k in _LSTM_WEIGHTS else v)
            for k, v in grads.items()}

  def _activate(self, z):
    """Gate activations `(i, g, f, o)` of pre-activations `[..., 4H]`."""
    zi, zg, zf, zo = tf.split(z, 4, axis=-1)
    return tf.sigmoid(zi), tf.tanh(zg), tf.sigmoid(zf), tf.sigmoid(zo)

  def step(self, w, state, projected):
    h, c = state
    i, g, f, o = self._activate(projected + w["recurrent"](h))
    c1, m1 = cells.lstm_state(i, f, g, o, c)
    h1 = self._output(w, m1)
    return (h1, c1), self._rows(h1, c1, (i, g, f, o))

  def _rows(self, h1, c1, gates):
    """A step's rows: h, and what `kept()` names."""
    rows = {"h": h1, "c": c1, "gates": None}
    kept = self.kept()
    if "gates" in kept:
      rows["gates"] = tf.stack(gates)
    return {k: v for k, v in rows.items() if k == "h" or k in kept}

  def prepare(self, w, kept, entry, x_block, mask_block, zone_block=None):
    """What the chunk's backward steps and weight GEMMs read, `[K, ...]`.

    kept: The chunk's kept blocks and "h", the outputs of its steps.
    mask_block: The chunk's `[K, B]` mask, or None.
    zone_block: The chunk's zoneout masks ("c": `[K, B, H]`), or None.
    """
    h_entry, c_entry = entry
    h_prev = cell_lib.shift_in(h_entry, kept["h"])
    if self.recompute:
      z = self.project(w, x_block) + w["recurrent"](h_prev)
      gates = tf.stack(self._activate(z), axis=1)
      c = self._cell_states(c_entry, gates, mask_block, zone_block)
    else:
      gates = kept["gates"]
      c = (kept["c"] if "c" in kept else
           self._cell_states(c_entry, gates, mask_block, zone_block))
    c_prev = cell_lib.shift_in(c_entry, c)
    if zone_block is not None:
      # The carried c is zoned out; the step's gradient reads the c it
      # computed, `f * c_prev + i * g`.
      c = gates[:, 2] * c_prev + gates[:, 0] * gates[:, 1]
    return {"gates": gates, "c": c, "c_prev": c_prev, "h_prev": h_prev}

  def _cell_states(self, c_entry, gates, mask_block, zone_block=None):
    """The chunk's c rows, `c_t = f_t * c_{t-1} + i_t * g_t`, from its entry.

    At a masked step c is carried (f = 1, i * g = 0: exactly c_{t-1}); with
    zoneout `c_t = k * c_{t-1} + (1 - k) * (f * c_{t-1} + i * g)` (f
    becomes `k + (1 - k) f`, i * g `(1 - k) i g`). Elementwise only (no
    GEMM): with `recompute=True` cheaper to redo per chunk than to keep H
    floats per step.
    """
    forget, update = gates[:, 2], gates[:, 0] * gates[:, 1]
    if zone_block is not None:
      keep = zone_block["c"]
      forget, update = keep + (1.0 - keep) * forget, (1.0 - keep) * update
    if mask_block is not None:
      forget = masks.select(mask_block, forget, tf.ones_like(forget))
      update = masks.zero_where_off(mask_block, update)
    return tf.scan(lambda c, fu: fu[0] * c + fu[1], (forget, update),
                   initializer=c_entry)

  def grad_step(self, w, prep, j, dstate):
    """(d state entering step j, the step's dz row)."""
    dh, dc = dstate
    # The gradient of m = o * tanh(c), which h is (or projects).
    dm = tf.matmul(dh, w["projection_t"]) if self.projected else dh
    # Leading-axis slices: the TF executor aliases them, where a gather
    # copies (at B=256 a copy per read was a large part of the step).
    gates = prep["gates"][j]
    i, g, f, o = gates[0], gates[1], gates[2], gates[3]
    c, c_prev = prep["c"][j], prep["c_prev"][j]
    tanh_c = tf.tanh(c)
    if not self.use_xla and dh.dtype in _FUSED_GRAD_DTYPES:
      # One fused kernel for the ~20 elementwise ops below (the same math,
      # in the same gate order); x, h_prev, w and b only give it shapes.
      dc_prev, dz, _, _, _ = tf.raw_ops.LSTMBlockCellGrad(
          x=dm[:, :0], cs_prev=c_prev, h_prev=dm, w=w["fused_shape"],
          wci=_no_peephole(dm), wcf=_no_peephole(dm), wco=_no_peephole(dm),
          b=w["bias"], i=i, cs=c, f=f, o=o, ci=g, co=tanh_c, cs_grad=dc,
          h_grad=dm, use_peephole=False)
    else:
      (dzi, dzf, dzg, dzo), dc = cells.lstm_gate_grads(i, f, g, o, c_prev,
                                                       tanh_c, dm, dc)
      dz = tf.concat([dzi, dzg, dzf, dzo], axis=-1)
      dc_prev = dc * f
    row = tf.concat([dz, dh], axis=-1) if self.projected else dz
    return (w["recurrent"].input_grad(dz), dc_prev), row

  def weight_grads(self, w, prep, dz_block, x_block):
    if not self.projected:
      return super().weight_grads(w, prep, dz_block, x_block)
    width = tf.shape(w["projection"])[0]
    dz_block, dh_block = tf.split(dz_block, [4 * width, -1], axis=-1)
    grads, dx = super().weight_grads(w, prep, dz_block, x_block)
    m = prep["gates"][:, 3] * tf.tanh(prep["c"])
    grads["projection"] = tf.matmul(cell_lib.rows(m), cell_lib.rows(dh_block),
                                    transpose_a=True)
    return grads, dx


_LSTM_WEIGHTS = ("kernel", "recurrent_kernel", "bias")


class PeepholeLstm(Lstm):
  """Peephole LSTM math (Gers & Schmidhuber 2000) for the chunked loops.

  As `Lstm`, plus diagonal peephole weights `peephole` `[3, H]` (rows
  p_i, p_f, p_o): `i = sigmoid(z_i + p_i * c_prev)`,
  `f = sigmoid(z_f + p_f * c_prev)`, `c = f * c_prev + i * g`,
  `o = sigmoid(z_o + p_o * c)` (the new c). Kept per step: as `Lstm`; with
  `recompute=True` a chunk's gates are rebuilt along its c recurrence (o
  reads the new c). In the TF executor the backward step is `Lstm`'s fused
  `LSTMBlockCellGrad` plus the peephole terms (see `grad_step`). The
  peephole weights' gradients are summed per chunk from the dz block and
  the chunk's c rows, like the bias's.
  """

  takes_zoneout = False

  def _peephole_step(self, p, z, c_prev):
    """`(i, g, f, o, c)` of one step from its pre-activations `[..., 4H]`
    (without the peephole terms) and the c entering it."""
    zi, zg, zf, zo = tf.split(z, 4, axis=-1)
    i = tf.sigmoid(zi + p[0] * c_prev)
    f = tf.sigmoid(zf + p[1] * c_prev)
    g = tf.tanh(zg)
    c = f * c_prev + i * g
    return i, g, f, tf.sigmoid(zo + p[2] * c), c

  def step(self, w, state, projected):
    h, c = state
    i, g, f, o, c1 = self._peephole_step(
        w["peephole"], projected + w["recurrent"](h), c)
    h1 = o * tf.tanh(c1)
    return (h1, c1), self._rows(h1, c1, (i, g, f, o))

  def prepare(self, w, kept, entry, x_block, mask_block):
    if not self.recompute:
      return super().prepare(w, kept, entry, x_block, mask_block)
    h_entry, c_entry = entry
    h_prev = cell_lib.shift_in(h_entry, kept["h"])
    z = self.project(w, x_block) + w["recurrent"](h_prev)
    # The gates read c (i, f the entering one, o the new one): rebuilt
    # along the c recurrence, elementwise; a masked step carries c.
    def rebuild(carry, inputs):
      c_prev = carry[0]
      i, g, f, o, c = self._peephole_step(w["peephole"], inputs[0], c_prev)
      if mask_block is not None:
        c = masks.select(inputs[1], c, c_prev)
      return c, tf.stack([i, g, f, o])

    c, gates = tf.scan(
        rebuild, (z,) if mask_block is None else (z, mask_block),
        initializer=(c_entry, tf.stack([c_entry] * 4)))
    return {"gates": gates, "c": c, "c_prev": cell_lib.shift_in(c_entry, c),
            "h_prev": h_prev}

  def grad_step(self, w, prep, j, dstate):
    dh, dc = dstate
    gates = prep["gates"][j]
    i, g, f, o = gates[0], gates[1], gates[2], gates[3]
    c, c_prev = prep["c"][j], prep["c_prev"][j]
    p = w["peephole"]
    tanh_c = tf.tanh(c)
    if not self.use_xla and dh.dtype in _FUSED_GRAD_DTYPES:
      # The fused kernel without its peephole paths, which are added here:
      # with `use_peephole=True` it returns wrong di/df/dci and cs_prev_grad
      # inside a graph, right eagerly. Its CPU kernel forwards the wci/wcf/
      # wco input buffers into their gradients and zeroes those before
      # reading the weights (lstm_ops.cc), so where a graph lets it forward
      # them it reads zeros. The o peephole enters as part of c's gradient.
      dzo = tf.raw_ops.SigmoidGrad(y=o, dy=dh * tanh_c)
      dc_prev, dz, _, _, _ = tf.raw_ops.LSTMBlockCellGrad(
          x=dh[:, :0], cs_prev=c_prev, h_prev=dh, w=w["recurrent_kernel"],
          wci=_no_peephole(dh), wcf=_no_peephole(dh), wco=_no_peephole(dh),
          b=w["bias"], i=i, cs=c, f=f, o=o, ci=g, co=tanh_c,
          cs_grad=dc + dzo * p[2], h_grad=dh, use_peephole=False)
      dzi, _, dzf, _ = tf.split(dz, 4, axis=-1)
      dc_prev = dc_prev + dzi * p[0] + dzf * p[1]
    else:
      dzo = tf.raw_ops.SigmoidGrad(y=o, dy=dh * tanh_c)
      dc = dc + tf.raw_ops.TanhGrad(y=tanh_c, dy=dh * o) + dzo * p[2]
      dzi = tf.raw_ops.SigmoidGrad(y=i, dy=dc * g)
      dzf = tf.raw_ops.SigmoidGrad(y=f, dy=dc * c_prev)
      dzg = tf.raw_ops.TanhGrad(y=g, dy=dc * i)
      dz = tf.concat([dzi, dzg, dzf, dzo], axis=-1)
      dc_prev = dc * f + dzi * p[0] + dzf * p[1]
    return (w["recurrent"].input_grad(dz), dc_prev), dz

  def weight_grads(self, w, prep, dz_block, x_block):
    grads, dx = super().weight_grads(w, prep, dz_block, x_block)
    dzi, _, dzf, dzo = tf.split(dz_block, 4, axis=-1)
    c_prev = prep["c_prev"]
    grads["peephole"] = tf.stack([cell_lib.column_sums(dzi * c_prev),
                                  cell_lib.column_sums(dzf * c_prev),
                                  cell_lib.column_sums(dzo * prep["c"])])
    return grads, dx
