"""The LSTM and GRU layers' own training loop: chunked, weight gradients batched.

`tf_recurrent.recurrent` sums a step's theta gradient inside the reverse
loop, so its backward step runs two sequential GEMMs (`dz @ U^T` and
`h^T @ dz`), and its per-step rows hold the projected inputs and their
gradient over the whole sequence. For the built-in LSTM and GRU the layers
run this loop pair instead:

* Time is cut into chunks of `CHUNK` steps. Per chunk the forward pass
  projects the chunk's inputs with one GEMM over `CHUNK * B` rows, then runs
  the chunk's steps; the only sequential GEMM of a step is `h @ U`.
* The backward pass walks the chunks last to first. Per step it runs one
  GEMM, `dz @ U^T` (U^T transposed once, before the loop), and writes dz into
  a chunk-sized buffer; after the chunk's steps the weight gradients
  (`h_prev^T dz`, `x^T dz`, the bias sums) and the input gradient
  (`dz @ W^T`) are single GEMMs over the chunk. No `[T, B, 4H]` projection
  or dz lives across the sequence.
* What is kept per step (a `_Cell`'s `kept`): by default the gate
  activations, 4H wide (an LSTM's c is rebuilt per chunk from the chunk's
  entry c and the gates, elementwise, and h_prev as `o * tanh(c)`; a GRU's
  h_prev is read from the outputs). With `recompute=True` nothing but the
  outputs: the backward pass rebuilds a chunk's gates with two GEMMs over
  the chunk (its projected inputs and `h_prev @ U`), not step by step.
* Masks (Keras's semantics, any `[T, B]` pattern): a masked step computes
  its state as usual, then carries the old one (`_carry_where_masked`); its
  outputs row is the carried h. Backward, a masked step's dz row is zero
  and the state gradient passes straight through, so the chunk's weight
  and input gradients need no change (zero rows add nothing). The cells
  see the mask in one place: an LSTM's c rebuild carries c through masked
  steps (f = 1, i * g = 0), and its h_prev is read from the outputs, since
  a carried h is not `o * tanh(c)`. Nothing more is kept per step.
* The kept rows are written per chunk as one `[CHUNK, B, width]` block of a
  dense buffer, in place (`accumulators.InPlaceBlocks`): a few large
  writes, and a tensor the gradient function may capture (SavedModel cannot
  save one capturing a TensorList).

The last chunk may be partial: it still reads `CHUNK` input rows (clamped to
the last one), runs only the steps up to T, and its unwritten rows are zeros,
so they add nothing to the weight gradients.

Mixed precision: the weights may be float32 while inputs and states are
bfloat16 or float16; the step math runs in the inputs' dtype and the weight
gradients are summed over the chunks in the weights' own dtype.
"""

import functools
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_recurrent import accumulators
from tf_recurrent import masks
from tf_recurrent import tracing

Tensor = tf.Tensor

# Steps per chunk: large enough for the chunk's GEMMs to run at full speed,
# small enough that the chunk's buffers stay a small part of the memory.
CHUNK = 50
# Chunks the TF executor may run at once. Its default (10) lets the chunks'
# projections and backward preparations run ahead of the sequential steps,
# each holding chunk-sized buffers: at T=1250 that was 1.9x the state per
# step in memory. One chunk ahead keeps the overlap of a GEMM with the steps.
_CHUNKS_IN_FLIGHT = 2


def _rows(block: Tensor) -> Tensor:
  """A `[K, B, w]` block as `[K * B, w]` rows of one GEMM."""
  return tf.reshape(block, [-1, tf.shape(block)[-1]])


def _blocks(rows: Tensor, like: Tensor) -> Tensor:
  """`[K * B, w]` rows back into a block shaped like `like` but `w` wide."""
  shape = tf.concat([tf.shape(like)[:-1], tf.shape(rows)[-1:]], 0)
  return tf.reshape(rows, shape)


def _shift_in(first: Tensor, block: Tensor) -> Tensor:
  """`[first, block[0], ..., block[K-2]]`: the rows entering each step."""
  return tf.concat([first[None], block[:-1]], axis=0)


class _Cell:
  """What the chunked loops ask of a cell's math (`_Lstm`, `_Gru`).

  Attributes:
    gates: Width of the projection in units of H.
    row_widths: What a step writes, in units of H: h (the outputs) always,
      the gates unless recomputing.
  """

  gates: int
  kept_with_gates: Tuple[str, ...]

  def __init__(self, recompute: bool):
    self.recompute = recompute
    self.row_widths = {"h": 1} if recompute else {"h": 1, "gates": 4}

  def kept(self, masked: bool) -> Tuple[str, ...]:
    """What the backward pass reads per step: "gates" (a step's activations,
    4H wide) and/or "h" (read back from the outputs; with a mask always,
    since a masked step carries h instead of computing it)."""
    if self.recompute:
      return ("h",)
    return tuple(sorted(set(self.kept_with_gates) | ({"h"} if masked else
                                                       set())))

  def project(self, w, x_rows):
    return tf.matmul(x_rows, w["kernel"]) + w["bias"]


class _Lstm(_Cell):
  """LSTM math (Keras gate order `[i, f, c, o]`) for the chunked loops.

  Weights: kernel `[D, 4H]`, recurrent_kernel `[H, 4H]`, bias `[4H]`.
  State: `(h, c)`. c is never kept: a chunk's c is rebuilt from its entry c
  and the gates (elementwise), and, unmasked, h from o and c.
  """

  gates = 4
  kept_with_gates = ("gates",)

  def step(self, w, state, projected):
    h, c = state
    z = projected + tf.matmul(h, w["recurrent_kernel"])
    zi, zf, zg, zo = tf.split(z, 4, axis=-1)
    i, f, o = tf.sigmoid(zi), tf.sigmoid(zf), tf.sigmoid(zo)
    g = tf.tanh(zg)
    c1 = f * c + i * g
    h1 = o * tf.tanh(c1)
    rows = {"h": h1}
    if not self.recompute:
      rows["gates"] = tf.concat([i, f, g, o], axis=-1)
    return (h1, c1), rows

  def _activate(self, z):
    zi, zf, zg, zo = tf.split(z, 4, axis=-1)
    return tf.concat([tf.sigmoid(zi), tf.sigmoid(zf), tf.tanh(zg),
                      tf.sigmoid(zo)], axis=-1)

  def prepare(self, w, kept, entry, x_block, mask_block):
    """What the chunk's backward steps and weight GEMMs read, `[K, B, .]`.

    mask_block: The chunk's `[K, B]` mask, or None.
    """
    h_entry, c_entry = entry
    h_prev = _shift_in(h_entry, kept["h"]) if "h" in kept else None
    if self.recompute:
      z = (self.project(w, _rows(x_block)) +
           tf.matmul(_rows(h_prev), w["recurrent_kernel"]))
      gates = _blocks(self._activate(z), h_prev)
    else:
      gates = kept["gates"]
    c = self._cell_states(c_entry, gates, mask_block)
    if h_prev is None:
      h_prev = _shift_in(h_entry, tf.split(gates, 4, axis=-1)[3] * tf.tanh(c))
    return {"gates": gates, "c": c, "c_prev": _shift_in(c_entry, c),
            "h_prev": h_prev}

  def _cell_states(self, c_entry, gates, mask_block):
    """The chunk's c rows, `c_t = f_t * c_{t-1} + i_t * g_t`, from its entry.

    At a masked step c is carried (f = 1, i * g = 0: exactly c_{t-1}).
    Elementwise only (no GEMM): cheaper to redo per chunk than to keep H
    floats per step.
    """
    i, f, g, _ = tf.split(gates, 4, axis=-1)
    forget, update = f, i * g
    if mask_block is not None:
      forget = masks.select(mask_block, forget, tf.ones_like(forget))
      update = masks.zero_where_off(mask_block, update)
    return tf.scan(lambda c, fu: fu[0] * c + fu[1], (forget, update),
                   initializer=c_entry)

  def grad_step(self, w, prep, j, dstate):
    """(d state entering step j, the step's dz row)."""
    dh, dc = dstate
    i, f, g, o = tf.split(tf.gather(prep["gates"], j), 4, axis=-1)
    tanh_c = tf.tanh(tf.gather(prep["c"], j))
    dc = dc + dh * o * (1.0 - tf.square(tanh_c))
    dz = tf.concat([
        dc * g * i * (1.0 - i),
        dc * tf.gather(prep["c_prev"], j) * f * (1.0 - f),
        dc * i * (1.0 - tf.square(g)),
        dh * tanh_c * o * (1.0 - o),
    ], axis=-1)
    return (tf.matmul(dz, w["recurrent_kernel_t"]), dc * f), dz

  def weight_grads(self, w, prep, dz_block, x_block):
    """(gradients of the weights from one chunk, the chunk's input rows' d)."""
    dz = _rows(dz_block)
    grads = {
        "kernel": tf.matmul(_rows(x_block), dz, transpose_a=True),
        "recurrent_kernel": tf.matmul(_rows(prep["h_prev"]), dz,
                                      transpose_a=True),
        "bias": tf.reduce_sum(dz, axis=0),
    }
    return grads, tf.matmul(dz, w["kernel_t"])


class _Gru(_Cell):
  """GRU math (Keras `reset_after=True`, gates `[z, r, h]`) for the loops.

  Weights: kernel `[D, 3H]`, recurrent_kernel `[H, 3H]`, bias `[3H]` (the
  input bias), recurrent_bias `[3H]`. State: `(h,)`. Kept gates are
  `[z, r, h~, U_h h + b_h]`.
  """

  gates = 3
  kept_with_gates = ("gates", "h")

  def _gates(self, w, projected, h):
    recurrent = tf.matmul(h, w["recurrent_kernel"]) + w["recurrent_bias"]
    xz, xr, xh = tf.split(projected, 3, axis=-1)
    rz, rr, rh = tf.split(recurrent, 3, axis=-1)
    z = tf.sigmoid(xz + rz)
    r = tf.sigmoid(xr + rr)
    hh = tf.tanh(xh + r * rh)
    return z, r, hh, rh

  def step(self, w, state, projected):
    (h,) = state
    z, r, hh, rh = self._gates(w, projected, h)
    h1 = z * h + (1.0 - z) * hh
    rows = {"h": h1}
    if not self.recompute:
      rows["gates"] = tf.concat([z, r, hh, rh], axis=-1)
    return (h1,), rows

  def prepare(self, w, kept, entry, x_block, mask_block):
    del mask_block  # h_prev is read from the outputs, carried when masked.
    h_prev = _shift_in(entry[0], kept["h"])
    if self.recompute:
      gates = self._gates(w, self.project(w, _rows(x_block)), _rows(h_prev))
      gates = _blocks(tf.concat(gates, axis=-1), h_prev)
    else:
      gates = kept["gates"]
    return {"gates": gates, "h_prev": h_prev}

  def grad_step(self, w, prep, j, dstate):
    (dh,) = dstate
    z, r, hh, rh = tf.split(tf.gather(prep["gates"], j), 4, axis=-1)
    h_prev = tf.gather(prep["h_prev"], j)
    dhh = dh * (1.0 - z) * (1.0 - tf.square(hh))
    dz = dh * (h_prev - hh) * z * (1.0 - z)
    dr = dhh * rh * r * (1.0 - r)
    drecurrent = tf.concat([dz, dr, dhh * r], axis=-1)
    dh_prev = dh * z + tf.matmul(drecurrent, w["recurrent_kernel_t"])
    return (dh_prev,), tf.concat([dz, dr, dhh], axis=-1)

  def weight_grads(self, w, prep, dprojected_block, x_block):
    dprojected = _rows(dprojected_block)
    units = tf.shape(dprojected)[-1] // 3
    r = _rows(tf.split(prep["gates"], 4, axis=-1)[1])
    drecurrent = tf.concat([dprojected[:, :2 * units],
                            dprojected[:, 2 * units:] * r], axis=-1)
    grads = {
        "kernel": tf.matmul(_rows(x_block), dprojected, transpose_a=True),
        "bias": tf.reduce_sum(dprojected, axis=0),
        "recurrent_kernel": tf.matmul(_rows(prep["h_prev"]), drecurrent,
                                      transpose_a=True),
        "recurrent_bias": tf.reduce_sum(drecurrent, axis=0),
    }
    return grads, tf.matmul(dprojected, w["kernel_t"])


_CELLS = {"lstm": _Lstm, "gru": _Gru}


class _Chunks:
  """The chunk grid of one call and the accumulators laid out on it.

  Chunk c covers steps `[c*K, min(c*K + K, T))`, K = min(chunk, T).
  """

  def __init__(self, x: Tensor, units, use_xla: bool, chunk: int):
    self.total = tf.shape(x, out_type=tf.int32)[0]
    static_total = x.shape[0]
    if static_total is not None:
      self.size = max(1, min(chunk, static_total))
      self.count = -(-static_total // self.size)
    else:
      self.size = tf.maximum(tf.minimum(chunk, self.total), 1)
      self.count = (self.total + self.size - 1) // self.size
    self._x = x
    self._units = units
    self._use_xla = use_xla

  def steps(self, c):
    """(first step of chunk c, its number of steps)."""
    start = c * self.size
    return start, tf.minimum(self.size, self.total - start)

  def inputs(self, start):
    """The chunk's `[K, B, D]` input rows (past T: the last row again)."""
    return self.chunk_of(self._x, start)

  def chunk_of(self, rows, start):
    """The chunk's K rows of a `[T, ...]` tensor (past T: the last again)."""
    return tf.gather(rows, tf.minimum(start + tf.range(self.size),
                                      self.total - 1))

  def _template(self, leading, width):
    """Zeros `leading + [B, width * H]` (width None: the input's D)."""
    x = self._x
    last = (tf.shape(x)[2:] if width is None else
            [width * tf.shape(self._units)[0]])
    static_last = (x.shape[2:] if width is None else
                   [None if self._units.shape[0] is None
                    else width * self._units.shape[0]])
    template = tf.zeros(tf.concat([leading, tf.shape(x)[1:2], last], 0),
                        x.dtype)
    static_leading = [d if isinstance(d, int) else None for d in leading]
    template.set_shape(tf.TensorShape(static_leading).concatenate(
        x.shape[1:2]).concatenate(static_last))
    return template

  def step_rows(self, width):
    """K rows `[B, width * H]`: one step's rows of the chunk."""
    return accumulators.RowAccumulator(self._template([], width), self.size,
                                       self._use_xla)

  def chunk_blocks(self, width):
    """One `[K, B, width * H]` block per chunk (width None: `[K, B, D]`)."""
    return accumulators.InPlaceBlocks(self._template([self.size], width),
                                      self.count, self._use_xla)

  def join(self, acc, handle):
    """The `[T, ...]` rows of an accumulator holding one block per chunk."""
    blocks = acc.stack(handle)
    rows = tf.reshape(blocks, tf.concat([[-1], tf.shape(blocks)[2:]], 0))
    return rows[:self.total]


def _compute_weights(weights: Dict[str, Tensor], dtype) -> Dict[str, Tensor]:
  """The weights in the compute dtype, plus the transposes the GEMMs read."""
  w = {k: tf.cast(v, dtype) for k, v in weights.items()}
  # Transposed once: a transposing matmul inside the loop costs several
  # times the plain one on this CPU (benchmarks/PROFILE.md).
  w["recurrent_kernel_t"] = tf.transpose(w["recurrent_kernel"])
  w["kernel_t"] = tf.transpose(w["kernel"])
  return w


def _forward(cell, use_xla, x, state0, weights, chunk, mask=None):
  """Runs the chunks forward (mask: `[T, B]` bool or None).

  Returns:
    `(outputs [T, B, H], final state, kept, entries)`: kept holds, for each
    name of `cell.kept` but "h", its `[chunks, K, B, width]` blocks; entries,
    per state leaf, the `[chunks, B, H]` states entering the chunks. All are
    dense tensors: the gradient function captures them, and SavedModel
    cannot save a gradient function capturing a TensorList (a variant).
  """
  grid = _Chunks(x, weights["recurrent_kernel"], use_xla, chunk)
  w = _compute_weights(weights, x.dtype)
  widths = cell.row_widths
  names = sorted(widths)
  blocks = {n: grid.chunk_blocks(widths[n]) for n in names}
  rows = {n: grid.step_rows(widths[n]) for n in names}
  entries = [accumulators.InPlaceBlocks(s, grid.count, use_xla)
             for s in state0]

  def chunk(c, state, block_handles, entry_handles):
    start, steps = grid.steps(c)
    entry_handles = [a.write(e, c, s)
                     for a, e, s in zip(entries, entry_handles, state)]
    x_block = grid.inputs(start)
    projected = _blocks(cell.project(w, _rows(x_block)), x_block)
    mask_block = None if mask is None else grid.chunk_of(mask, start)

    def step(j, state, handles):
      new, out = cell.step(w, state, tf.gather(projected, j))
      if mask_block is not None:
        new = _carry_where_masked(tf.gather(mask_block, j), new, state)
        out = {**out, "h": new[0]}
      return j + 1, new, [rows[n].write(h, j, out[n])
                          for n, h in zip(names, handles)]

    _, state, handles = tf.while_loop(
        lambda j, *_: j < steps, step,
        (0, state, [rows[n].empty() for n in names]))
    block_handles = [blocks[n].write(b, c, rows[n].stack(h))
                     for n, b, h in zip(names, block_handles, handles)]
    return c + 1, state, block_handles, entry_handles

  _, final, block_handles, entry_handles = tf.while_loop(
      lambda c, *_: c < grid.count, chunk,
      (0, tuple(state0), [blocks[n].empty() for n in names],
       [e.empty() for e in entries]),
      parallel_iterations=_CHUNKS_IN_FLIGHT)
  handles = dict(zip(names, block_handles))
  outputs = grid.join(blocks["h"], handles["h"])
  # h is read back from the outputs: a kept copy would hold it twice.
  kept = [blocks[n].stack(handles[n]) for n in cell.kept(mask is not None)
          if n != "h"]
  return (outputs, list(final), kept,
          [a.stack(e) for a, e in zip(entries, entry_handles)])


def _backward(cell, use_xla, x, weights, outputs, kept, entries, d_outputs,
              d_final, chunk, mask=None):
  """Runs the chunks in reverse; returns `(dx, d state0, d weights)`."""
  grid = _Chunks(x, weights["recurrent_kernel"], use_xla, chunk)
  w = _compute_weights(weights, x.dtype)
  kept_by_name = cell.kept(mask is not None)
  kept_names = [n for n in kept_by_name if n != "h"]
  dz_rows = grid.step_rows(cell.gates)
  dx_blocks = grid.chunk_blocks(None)
  grad_names = sorted(weights)

  def chunk(c, dstate, grads, dx_handle):
    start, steps = grid.steps(c)
    x_block = grid.inputs(start)
    # Indexing the leading axis: the TF executor aliases a dense tensor's
    # block instead of copying it.
    chunk_kept = {n: blocks[c] for n, blocks in zip(kept_names, kept)}
    if "h" in kept_by_name:
      chunk_kept["h"] = grid.chunk_of(outputs, start)
    mask_block = None if mask is None else grid.chunk_of(mask, start)
    prep = cell.prepare(w, chunk_kept, [e[c] for e in entries], x_block,
                        mask_block)

    def step(j, dstate, handle):
      dh = dstate[0] + tf.gather(d_outputs, start + j)
      d_leaving = (dh,) + tuple(dstate[1:])
      d_entering, dz = cell.grad_step(w, prep, j, d_leaving)
      if mask_block is not None:
        running = tf.gather(mask_block, j)
        # A masked step carried its state: its gradient passes through.
        d_entering = _carry_where_masked(running, d_entering, d_leaving)
        dz = masks.zero_where_off(running, dz)
      return j - 1, d_entering, dz_rows.write(handle, j, dz)

    _, dstate, handle = tf.while_loop(
        lambda j, *_: j >= 0, step, (steps - 1, dstate, dz_rows.empty()))
    chunk_grads, dx_rows = cell.weight_grads(w, prep, dz_rows.stack(handle),
                                             x_block)
    grads = [g + tf.cast(chunk_grads[k], g.dtype)
             for k, g in zip(grad_names, grads)]
    dx_handle = dx_blocks.write(dx_handle, c, _blocks(dx_rows, x_block))
    return c - 1, dstate, grads, dx_handle

  _, dstate0, grads, dx_handle = tf.while_loop(
      lambda c, *_: c >= 0, chunk,
      (grid.count - 1, tuple(d_final),
       [tf.zeros_like(weights[k]) for k in grad_names], dx_blocks.empty()),
      parallel_iterations=_CHUNKS_IN_FLIGHT)
  return (grid.join(dx_blocks, dx_handle), list(dstate0),
          dict(zip(grad_names, grads)))


def _carry_where_masked(running: Tensor, computed, carried):
  """Per example, the step's `computed` state leaves (or their gradients)
  where `running` (`[B]` bool), else the `carried` ones: Keras's masked
  step, forward and backward."""
  return tuple(masks.select_structure(running, tuple(computed),
                                      tuple(carried)))


# Per argument of `_forward` and `_backward`, the leading dimensions an eager
# call leaves unknown in its trace: every shape but its last dimension (time,
# batch, chunks), except the weights' (H must stay static) and the Python
# chunk length; a `[T, B]` mask entirely.
_FORWARD_UNKNOWN = (-1, -1, 0, 0, 2)  # x, state0, weights, chunk, mask
_BACKWARD_UNKNOWN = (-1, 0, -1, -1, -1, -1, -1, 0, 2)  # x, weights, outputs,
# kept, entries, d_outputs, d_final, chunk, mask


@functools.lru_cache(maxsize=None)
def _eager_functions(kind: str, recompute: bool):
  """The loops as tf.functions, for calls made eagerly: one trace for every
  length and batch size."""
  cell = _CELLS[kind](recompute)
  return tuple(
      functools.partial(tracing.RelaxedFunction(
          functools.partial(fn, cell, False), autograph=False),
                        unknown=unknown)
      for fn, unknown in ((_forward, _FORWARD_UNKNOWN),
                          (_backward, _BACKWARD_UNKNOWN)))


def run(kind: str, x: Tensor, state0: Sequence[Tensor],
        weights: Dict[str, Tensor], recompute: bool = False,
        mask: Optional[Tensor] = None) -> Tuple[Tensor, List[Tensor]]:
  """Runs a built-in LSTM or GRU over time-major inputs, with its gradient.

  Args:
    kind: "lstm" or "gru".
    x: `[T, B, D]` inputs in the compute dtype, T >= 1.
    state0: The initial state, `[h, c]` (LSTM) or `[h]` (GRU), `[B, H]`, in
      the compute dtype.
    weights: `kernel`, `recurrent_kernel`, `bias` (and a GRU's
      `recurrent_bias`), in their variable dtype.
    recompute: Keep only the states per step and rebuild each chunk's gates
      in the backward pass.
    mask: Optional `[T, B]` bool (time-major). Where False, the step carries
      the state (h and c) through unchanged and its inputs get no
      gradient, Keras's mask semantics; its outputs row is the carried h
      (the layers turn that into Keras's emitted output).

  Returns:
    `(outputs [T, B, H], final state list)`.

  Example:

  >>> w = {"kernel": tf.ones([3, 8]), "recurrent_kernel": tf.ones([2, 8]),
  ...      "bias": tf.zeros([8])}
  >>> outputs, (h, c) = run("lstm", tf.ones([5, 4, 3]),
  ...                       [tf.zeros([4, 2]), tf.zeros([4, 2])], w)
  >>> outputs.shape
  TensorShape([5, 4, 2])
  """
  # Read variables here, outside the custom gradient: their gradient then
  # reaches them through the read.
  weights = {k: tf.convert_to_tensor(v) for k, v in weights.items()}
  if mask is not None:
    mask = tf.cast(mask, tf.bool)
  names = sorted(weights)
  n_state = len(state0)
  chunk = CHUNK
  if tf.executing_eagerly():
    forward_fn, backward_fn = _eager_functions(kind, recompute)
  else:
    cell = _CELLS[kind](recompute)
    use_xla = accumulators.in_xla_context()
    forward_fn = functools.partial(_forward, cell, use_xla)
    backward_fn = functools.partial(_backward, cell, use_xla)

  @tf.custom_gradient
  def loop(x, *args):
    state = list(args[:n_state])
    w = dict(zip(names, args[n_state:]))
    # The chunk length is read once per call and given to both passes
    # (a Python value: part of the eager functions' trace key).
    # Cut from any tape: the gradient is grad_fn's, and a tape watching the
    # eager path's tf.function call would build that function's own
    # (unneeded, and for in-place writes undefined) gradient.
    cut = functools.partial(tf.nest.map_structure, tf.stop_gradient)
    outputs, final, kept, entries = forward_fn(cut(x), cut(state), cut(w),
                                               chunk, mask)

    def grad_fn(d_outputs, *d_final):
      d_outputs = (tf.zeros_like(outputs) if d_outputs is None
                   else tf.cast(d_outputs, x.dtype))
      d_final = [tf.zeros_like(s) if d is None else tf.cast(d, s.dtype)
                 for s, d in zip(final, d_final)]
      dx, dstate0, dw = backward_fn(x, w, outputs, kept, entries, d_outputs,
                                    d_final, chunk, mask)
      return [dx] + dstate0 + [dw[k] for k in names]

    return [outputs] + final, grad_fn

  result = loop(x, *state0, *[weights[k] for k in names])
  return result[0], list(result[1:])
