"""The built-in layers' own training loop: chunked, weight gradients batched.

`tf_recurrent.recurrent` sums a step's theta gradient inside the reverse
loop, so its backward step runs two sequential GEMMs (`dz @ U^T` and
`h^T @ dz`), and its per-step rows hold the projected inputs and their
gradient over the whole sequence. For Keras's LSTM, GRU (both `reset_after`
settings), SimpleRNN, layer-norm and ConvLSTM cells the engine runs this
loop pair instead. The loop pair knows a cell only through the `cell.Cell`
interface; each cell's math is a module of its own (`lstm`, `gru`,
`simple_rnn`, `layer_norm`, `convolutional`, named by kind in `kinds`),
their shared equations in `tf_recurrent.cells`:

* Time is cut into chunks of at most `CHUNK` steps, of equal length K
  (`_Chunks`). Per chunk the forward pass projects the chunk's inputs with
  one GEMM over `K * B` rows, then runs
  the chunk's steps; the only sequential GEMM of a step is `h @ U` (a
  `reset_after=False` GRU has a second, `(r * h) @ U_h`).
* The backward pass walks the chunks last to first. Per step it runs one
  GEMM, `dz @ U^T` (U^T transposed once, before the loop), and writes dz into
  a chunk-sized buffer; after the chunk's steps the weight gradients
  (`h_prev^T dz`, `x^T dz`, the bias sums) and the input gradient
  (`dz @ W^T`) are single GEMMs over the chunk. No `[T, B, 4H]` projection
  or dz lives across the sequence.
* What is kept per step (a `Cell`'s `kept`) besides the outputs (h, which
  the backward pass reads back): an LSTM's gate activations and c, a GRU's
  gates, a SimpleRNN nothing. Gates are kept gate-major, `[gates, B, H]`,
  so that a step reads each as an aliased slice of the buffer, not a copy.
  With `recompute=True` nothing but the outputs: the backward pass rebuilds
  a chunk's gates with two GEMMs over the chunk (its projected inputs and
  `h_prev @ U`), not step by step. A call no tape records (inference)
  keeps nothing either (the layers pass `recompute=True`).
* In the TF executor the LSTM's backward step is one fused
  `LSTMBlockCellGrad` kernel (gate order `[i, c, f, o]` inside the loops),
  where its ~20 elementwise ops each made a pass over `[B, H]` rows.
* Masks (Keras's semantics, any `[T, B]` pattern): a masked step computes
  its state as usual, then carries the old one (`_carry_where_masked`); its
  rows are the carried state. Backward, a masked step's dz row is zero and
  the state gradient passes straight through, so the chunk's weight and
  input gradients need no change (zero rows add nothing).
* Dropout (Keras's masks): each gate's block of a kernel reads its own
  masked copy of x or h (`implementation=1`, which recurrent dropout
  implies from Keras 3.6), or all read one masked copy (earlier Keras), the
  same mask every step (`cell.Linear`).
* Under XLA a step reads its rows (forward: its projected inputs;
  backward: its rows of the chunk's preparation and of the outputs'
  gradient) as loop variables the step before sliced (`_next_row`): XLA's
  CPU backend runs a fusion that slices a block at the loop index several
  times slower than one reading a plain buffer.
* The kept rows are written per step straight into one dense buffer for
  the whole call, in place (`accumulators.InPlaceBlocks`): no per-chunk
  stacking, and a tensor the gradient function may capture (SavedModel
  cannot save one capturing a TensorList).
* Layout: the layers give their batch-major `[B, T, ...]` inputs as they
  are (`run(time_major=False)`): a chunk gathers its `[K, B, ...]` rows of
  the inputs, of the outputs and of the outputs' gradient along axis 1, and
  the outputs are transposed to `[B, T, ...]` once, at the end. No
  time-major copy of any of them lives across the call, beside the
  batch-major tensors the layer returns and receives (at ConvLSTM2D's
  shapes the three copies were 1.25x the state a frame).

The last chunk may be partial: it still reads K input rows (clamped to
the last one), runs only the steps up to T, and its unwritten dz rows are
zeros, so they add nothing to the weight gradients.

Mixed precision: the weights may be float32 while inputs and states are
bfloat16 or float16; the step math runs in the inputs' dtype and the weight
gradients are summed over the chunks in the weights' own dtype.
"""

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_recurrent.chunked import cell as cell_lib
from tf_recurrent.chunked import fused_lstm
from tf_recurrent.chunked import kinds
from tf_recurrent.op import accumulators
from tf_recurrent.op import first_order
from tf_recurrent.op import masks
from tf_recurrent.op import structs
from tf_recurrent.op import tracing

Tensor = tf.Tensor

# Steps per chunk: large enough for the chunk's GEMMs to run at full speed,
# small enough that the chunk's buffers stay a small part of the memory.
CHUNK = 50
# Chunks the TF executor may run at once. Its default (10) lets the chunks'
# projections and backward preparations run ahead of the sequential steps,
# each holding chunk-sized buffers: at T=1250 that was 1.9x the state per
# step in memory. One chunk ahead keeps the overlap of a GEMM with the steps.
_CHUNKS_IN_FLIGHT = 2


# Static shapes are used where known: fewer ops to trace (a model's first
# call traces the loops twice, Keras's train function once to initialize).


class _Chunks:
  """The chunk grid of one call and the accumulators laid out on it.

  Chunk c covers steps `[c*K, min(c*K + K, T))`: as few chunks as `chunk`
  steps each allow, K the shortest length that covers T with them (T=120
  and chunk 50: three chunks of 40, not 50 + 50 + 20). A partial last chunk
  still runs its batched GEMMs (or a ConvLSTM's convolutions) over K rows:
  balanced chunks waste at most `count - 1` of them, not up to `chunk - 1`.

  The call's inputs, outputs and their gradients are time-major `[T, B,
  ...]`, or with `time_major=False` batch-major `[B, T, ...]` (a Keras
  layer's own layout: no `[T, B, ...]` copy of them is made, which the
  gradient function would keep beside the layer's). Either way the steps
  read and write `[K, B, ...]` rows of one chunk (`steps_of`), and
  everything else is laid out time-major.
  """

  def __init__(self, x: Tensor, use_xla: bool, chunk: int,
               time_major: bool = True):
    self.time_major = time_major
    time_axis = 0 if time_major else 1
    self.total = tf.shape(x, out_type=tf.int32)[time_axis]
    static_total = x.shape[time_axis]
    if static_total is not None:
      self.count = max(1, -(-static_total // chunk))
      self.size = max(1, -(-static_total // self.count))
    else:
      self.count = tf.maximum((self.total + chunk - 1) // chunk, 1)
      self.size = tf.maximum((self.total + self.count - 1) // self.count, 1)
    self._x = x
    self._use_xla = use_xla

  def loop(self, cond, chunk, loop_vars):
    """`tf.while_loop(cond, chunk, loop_vars)` over the chunks; one chunk
    known while tracing (T <= `CHUNK`, static) runs without the loop: one
    while loop less to trace, build and run each way."""
    if isinstance(self.count, int) and self.count == 1:  # T static, short.
      return chunk(*loop_vars)
    return tf.while_loop(cond, chunk, loop_vars,
                         parallel_iterations=_CHUNKS_IN_FLIGHT)

  def steps(self, c):
    """(first step of chunk c, its number of steps)."""
    start = c * self.size
    return start, tf.minimum(self.size, self.total - start)

  def inputs(self, start):
    """The chunk's `[K, B, D]` input rows (past T: the last row again)."""
    return self.steps_of(self._x, start)

  def _rows_at(self, start):
    return tf.minimum(start + tf.range(self.size), self.total - 1)

  def chunk_of(self, rows, start):
    """The chunk's K rows of a `[T, ...]` tensor (past T: the last again)."""
    return tf.gather(rows, self._rows_at(start))

  def steps_of(self, t, start):
    """The chunk's `[K, B, ...]` rows of a tensor in the call's layout (the
    inputs, the outputs or their gradient; past T: the last again)."""
    if self.time_major:
      return self.chunk_of(t, start)
    return structs.swap_batch_and_time(
        tf.gather(t, self._rows_at(start), axis=1), "a chunk")

  def in_layout(self, rows):
    """`[T, B, ...]` rows in the call's layout."""
    return rows if self.time_major else structs.swap_batch_and_time(
        rows, "the rows")

  def _template(self, leading, columns, gate_rows=None):
    """Zeros `leading + [B, columns]` (columns None: the input's D), or with
    `gate_rows` n, `leading + [n, B, columns]` (gate-major). Columns: a
    Python int where static, else a scalar tensor (`cell_lib.Cell.widths`); a tuple
    for a convolutional kind's rows, `[B, ..., F]`."""
    x = self._x
    batch_axis = int(self.time_major)
    if columns is None:
      last, static_last = tf.shape(x)[2:], x.shape[2:]
    elif isinstance(columns, tuple):  # A convolutional kind's `[..., F]`.
      last, static_last = list(columns), list(columns)
    else:
      last = [columns]
      static_last = [columns if isinstance(columns, int) else None]
    if gate_rows is not None:
      leading = list(leading) + [gate_rows]
    static_leading = [d if isinstance(d, int) else None for d in leading]
    static = tf.TensorShape(static_leading).concatenate(
        x.shape[batch_axis:batch_axis + 1]).concatenate(static_last)
    if static.is_fully_defined():
      return tf.zeros(static, x.dtype)
    template = tf.zeros(tf.concat(
        [leading, tf.shape(x)[batch_axis:batch_axis + 1], last], 0), x.dtype)
    template.set_shape(static)
    return template

  def step_rows(self, columns, gate_rows=None, every_chunk=False):
    """Rows `[B, columns]` (or `[gate_rows, B, columns]`), one per step: K of
    them (one chunk's), or with every_chunk one per step of the grid,
    `[chunks * K, ...]`, written straight where they stay (no per-chunk
    stacking and copying)."""
    return accumulators.InPlaceBlocks(
        self._template([], columns, gate_rows),
        self.count * self.size if every_chunk else self.size, self._use_xla)

  def by_chunk(self, rows):
    """`[chunks * K, ...]` rows as `[chunks, K, ...]` blocks."""
    return tf.reshape(rows, tf.concat([[self.count, self.size],
                                       tf.shape(rows)[1:]], 0))

  def chunk_blocks(self, columns, gate_rows=None):
    """One `[K, B, columns]` block per chunk (columns None: `[K, B, D]`;
    gate_rows n: `[K, n, B, columns]`)."""
    return accumulators.InPlaceBlocks(
        self._template([self.size], columns, gate_rows), self.count,
        self._use_xla)

  def join(self, acc, handle):
    """The rows of an accumulator holding one `[K, B, ...]` block per
    chunk, in the call's layout."""
    blocks = acc.stack(handle)
    rows = tf.reshape(blocks, tf.concat([[-1], tf.shape(blocks)[2:]], 0))
    return self.in_layout(rows[:self.total])


def _next_row(block: Tensor, j) -> Tensor:
  """`block[j]` (clamped to its rows), for a loop under XLA to carry into
  step j.

  XLA fuses a row sliced at a loop index into each of its consumers, and
  its CPU backend runs such a fusion several times slower than one reading
  a plain buffer (the LSTM's gate fusion at `[32, 1024]`: ~390 against
  ~270 us a step with the matmul). Sliced a step ahead, the row is a loop
  variable: copied once into the loop's buffer, read plainly after.
  """
  return block[tf.clip_by_value(j, 0, tf.shape(block)[0] - 1)]


# The outputs' gradient among a backward step's carried rows.
_D_OUTPUTS = "d_outputs"


class _Row:
  """A row a loop under XLA carries into step j, read as `block[j]`."""

  def __init__(self, row: Tensor, j: Tensor):
    self._row, self._j = row, j

  def __getitem__(self, index):
    # A cell's grad_step reads its own step's rows only; any other index
    # would need the block, which the loop does not carry.
    if index is not self._j:
      raise ValueError("grad_step may read only prep[name][j], its own "
                       f"step's row; it read [{index!r}].")
    return self._row


def _compute_weights(cell: cell_lib.Cell, weights: Dict[str, Tensor], dtype,
                     dropout: Optional[Dict[str, Tensor]]):
  """The cell's weights (`cell_lib.Cell.weights`) in the compute dtype."""
  return cell.weights({k: tf.cast(v, dtype) for k, v in weights.items()},
                      {k: tf.cast(m, dtype) for k, m in (dropout or {}).items()})


def _forward(spec, recompute, use_xla, x, state0, weights, chunk, mask=None,
             dropout=None, zoneout=None, time_major=True):
  """Runs the chunks forward (mask: `[T, B]` bool or None; dropout,
  zoneout and time_major: see `run`).

  Returns:
    `(outputs [T, B, H] (time_major) or [B, T, H], final state, kept,
    entries)`: kept holds, for each
    name of `cell.kept()`, its `[chunks, K, ...]` blocks; entries,
    per state leaf, the `[chunks, B, H]` states entering the chunks. All are
    dense tensors: the gradient function captures them, and SavedModel
    cannot save a gradient function capturing a TensorList (a variant).
  """
  cell = kinds.make(spec, recompute, use_xla, weights)
  grid = _Chunks(x, use_xla, chunk, time_major)
  w = _compute_weights(cell, weights, x.dtype, dropout)
  shapes = cell.row_shapes(cell.widths(weights["recurrent_kernel"]))
  names = sorted(shapes)
  rows = {n: grid.step_rows(*shapes[n], every_chunk=True) for n in names}
  entries = [accumulators.InPlaceBlocks(s, grid.count, use_xla)
             for s in state0]

  def chunk(c, state, handles, entry_handles):
    start, steps = grid.steps(c)
    entry_handles = [a.write(e, c, s)
                     for a, e, s in zip(entries, entry_handles, state)]
    x_block = grid.inputs(start)
    projected = cell.project(w, x_block)
    mask_block = None if mask is None else grid.chunk_of(mask, start)
    zone_block = _zone_block(grid, zoneout, start, x.dtype)

    def step(j, state, handles, *row):
      # Leading-axis slices: the TF executor aliases them (a gather copies).
      # Under XLA the step's projected row was sliced the step before (see
      # `_next_row`).
      new, out = cell.step(w, state, row[0] if row else projected[j])
      if zone_block is not None:
        new = _zoned_out(cell, zone_block, j, state, new)
        out = {**out, **dict(zip(cell.state_rows, new))}
      if mask_block is not None:
        new = _carry_where_masked(mask_block[j], new, state)
        out = {**out, **dict(zip(cell.state_rows, new))}
      next_row = (_next_row(projected, j + 1),) if row else ()
      return (j + 1, new, [rows[n].write(h, start + j, out[n])
                           for n, h in zip(names, handles)], *next_row)

    first = (projected[0],) if use_xla else ()
    _, state, handles, *_ = tf.while_loop(lambda j, *_: j < steps, step,
                                          (0, state, handles, *first))
    return c + 1, state, handles, entry_handles

  _, final, handles, entry_handles = grid.loop(
      lambda c, *_: c < grid.count, chunk,
      (0, tuple(state0), [rows[n].empty() for n in names],
       [e.empty() for e in entries]))
  written = {n: rows[n].stack(h) for n, h in zip(names, handles)}
  outputs = grid.in_layout(written["h"][:grid.total])
  # h is read back from the outputs: a kept copy would hold it twice.
  kept = [grid.by_chunk(written[n]) for n in cell.kept()]
  return (outputs, list(final), kept,
          [a.stack(e) for a, e in zip(entries, entry_handles)])


def _backward(spec, recompute, use_xla, x, weights, outputs, kept, entries,
              d_outputs, d_final, chunk, mask=None, dropout=None,
              zoneout=None, time_major=True):
  """Runs the chunks in reverse; returns `(dx, d state0, d weights)`.

  d_outputs is the outputs' gradient (`[T, B, H]`, or `[B, T, H]` unless
  time_major), or None where nothing read them (a model of the last output
  only): then no step adds one.
  """
  cell = kinds.make(spec, recompute, use_xla, weights)
  grid = _Chunks(x, use_xla, chunk, time_major)
  w = _compute_weights(cell, weights, x.dtype, dropout)
  kept_names = cell.kept()
  dz_rows = grid.step_rows(
      cell.grad_columns(cell.widths(weights["recurrent_kernel"])))
  dx_blocks = grid.chunk_blocks(None)
  grad_names = sorted(weights)

  def chunk(c, dstate, grads, dx_handle):
    start, steps = grid.steps(c)
    x_block = grid.inputs(start)
    # Indexing the leading axis: the TF executor aliases a dense tensor's
    # block instead of copying it.
    chunk_kept = {n: blocks[c] for n, blocks in zip(kept_names, kept)}
    chunk_kept["h"] = grid.steps_of(outputs, start)
    mask_block = None if mask is None else grid.chunk_of(mask, start)
    zone_block = _zone_block(grid, zoneout, start, x.dtype)
    prep = cell.prepare(w, chunk_kept, [e[c] for e in entries], x_block,
                        mask_block, **({} if zone_block is None
                                       else {"zone_block": zone_block}))

    # Step j's row of d_outputs: time-major, row d_start + j of the whole
    # (aliased by the TF executor); batch-major, row j of the chunk's rows.
    d_block, d_start = ((d_outputs, start) if grid.time_major or
                        d_outputs is None else
                        (grid.steps_of(d_outputs, start), 0))
    # Under XLA a step reads its rows of prep and of d_outputs as loop
    # variables, sliced by the step after it (see `_next_row`).
    blocks = dict(prep)
    if d_block is not None:
      blocks[_D_OUTPUTS] = d_block
    names = sorted(blocks) if use_xla else []
    offsets = {n: d_start if n == _D_OUTPUTS else 0 for n in names}

    def step(j, dstate, handle, *carried):
      if carried:
        step_prep = {n: _Row(r, j) for n, r in zip(names, carried)}
        d_output = step_prep.pop(_D_OUTPUTS, None)
        d_output = None if d_output is None else d_output[j]
      else:
        step_prep = prep
        d_output = None if d_block is None else d_block[d_start + j]
      dh = dstate[0] if d_output is None else dstate[0] + d_output
      d_leaving = (dh,) + tuple(dstate[1:])
      if zone_block is None:
        d_entering, dz = cell.grad_step(w, step_prep, j, d_leaving)
      else:
        # The step's computed state reaches the zoned one through 1 - k,
        # the entering state through k.
        kept_ = [zone_block[leaf][j] for leaf in cell.state_rows]
        d_entering, dz = cell.grad_step(
            w, step_prep, j,
            tuple((1.0 - k) * d for k, d in zip(kept_, d_leaving)))
        d_entering = tuple(e + k * d for e, k, d in
                           zip(d_entering, kept_, d_leaving))
      if mask_block is not None:
        running = mask_block[j]
        # A masked step carried its state: its gradient passes through.
        d_entering = _carry_where_masked(running, d_entering, d_leaving)
        dz = masks.zero_where_off(running, dz)
      return (j - 1, d_entering, dz_rows.write(handle, j, dz),
              *(_next_row(blocks[n], offsets[n] + j - 1) for n in names))

    _, dstate, handle, *_ = tf.while_loop(
        lambda j, *_: j >= 0, step,
        (steps - 1, dstate, dz_rows.empty(),
         *(_next_row(blocks[n], offsets[n] + steps - 1) for n in names)))
    chunk_grads, dx_block = cell.weight_grads(w, prep, dz_rows.stack(handle),
                                              x_block)
    grads = [g + tf.cast(chunk_grads[k], g.dtype)
             for k, g in zip(grad_names, grads)]
    dx_handle = dx_blocks.write(dx_handle, c, dx_block)
    return c - 1, dstate, grads, dx_handle

  _, dstate0, grads, dx_handle = grid.loop(
      lambda c, *_: c >= 0, chunk,
      (grid.count - 1, tuple(d_final),
       [tf.zeros_like(weights[k]) for k in grad_names], dx_blocks.empty()))
  return (grid.join(dx_blocks, dx_handle), list(dstate0),
          cell.external_grads(dict(zip(grad_names, grads))))


def _filled_with_zeros(gradient) -> bool:
  """Whether `gradient` is zeros TensorFlow made for an output nothing read:
  a graph's `ZerosLike` (`tf.gradients`), or a tape's zeros, a `Fill` of 0
  (a constant under 1000 elements). Eager zeros are values, and are added
  as any gradient."""
  op = getattr(gradient, "op", None)
  if op is None or tf.executing_eagerly() or isinstance(
      gradient, tf.IndexedSlices):
    return False
  if op.type == "ZerosLike":
    return True
  if op.type in ("Fill", "Const"):
    value = tf.get_static_value(op.inputs[1] if op.type == "Fill"
                                else gradient)
    return value is not None and not value.any()
  return False


def _zone_block(grid: "_Chunks", zoneout, start, dtype):
  """The chunk's zoneout masks by state leaf, `[K, B, ...]` in `dtype`, or
  None."""
  if zoneout is None:
    return None
  return {leaf: tf.cast(grid.chunk_of(m, start), dtype)
          for leaf, m in zoneout.items()}


def _zoned_out(cell: cell_lib.Cell, zone_block, j, state, computed):
  """Zoneout of step j: per unit the entering value where the mask is 1
  (its expectation `k * entering + (1 - k) * computed` for a mask k)."""
  return tuple(zone_block[leaf][j] * s + (1.0 - zone_block[leaf][j]) * n
               for leaf, s, n in zip(cell.state_rows, state, computed))


def _carry_where_masked(running: Tensor, computed, carried):
  """Per example, the step's `computed` state leaves (or their gradients)
  where `running` (`[B]` bool), else the `carried` ones: Keras's masked
  step, forward and backward."""
  return tuple(masks.select_structure(running, tuple(computed),
                                      tuple(carried)))


# Per argument of `_forward` and `_backward`, the leading dimensions an eager
# call leaves unknown in its trace: every shape but its last dimension (time,
# batch, chunks), except the weights' (H must stay static) and the Python
# chunk length; a `[T, B]` mask entirely; `[gates, B, F]` dropout masks all
# but F.
_FORWARD_UNKNOWN = (-1, -1, 0, 0, 2, -1, -1)  # x, state0, weights, chunk,
# mask, dropout, zoneout
_BACKWARD_UNKNOWN = (-1, 0, -1, -1, -1, -1, -1, 0, 2, -1, -1)  # x, weights,
# outputs, kept, entries, d_outputs, d_final, chunk, mask, dropout, zoneout


def _check_zoneout(kind: str, zoneout: Dict[str, Tensor]) -> None:
  """Zoneout only where built, on the state leaves of the kind."""
  cell_class = kinds.CELLS[kind]
  takers = sorted(k for k, c in kinds.CELLS.items() if c.takes_zoneout)
  if not cell_class.takes_zoneout:
    raise ValueError(f"sequence.run: zoneout is built for the kinds "
                     f"{takers}, not {kind!r}.")
  if not set(zoneout) <= set(cell_class.state_rows):
    raise ValueError(f"sequence.run: zoneout of {kind!r} takes masks for "
                     f"the state leaves {list(cell_class.state_rows)}; got "
                     f"{sorted(zoneout)}.")


# The loop pairs made so far, by `(spec, recompute, mode, time_major)`
# (`_loop_functions`).
_loop_function_cache: Dict[Tuple[Any, ...], Tuple[Any, Any]] = {}


def _loop_functions(spec: Tuple[str, float], recompute: bool, mode: str,
                    time_major: bool = True):
  """The loop pair `(forward, backward)` as tf.functions, made once.

  mode "eager": for calls made eagerly, traced with time and batch left
  unknown (one trace for every length and batch size). "graph" and "xla":
  called inside the caller's `tf.function`, traced once per signature, so
  that a second trace of the caller reuses the loops' trace (a Keras
  model's first `train_on_batch` traces its train function twice); under
  "xla" the caller compiles them with itself.
  """
  key = (spec, recompute, mode, time_major)
  if key not in _loop_function_cache:
    pair = [functools.partial(fn, spec, recompute, mode == "xla",
                              time_major=time_major)
            for fn in (_forward, _backward)]
    # Plain Python control flow on Python values: nothing for AutoGraph to
    # convert (and it mis-binds the partials' arguments).
    if mode == "eager":
      # A convolutional kind's rows keep their spatial shape static too.
      geometry = spec[2]
      last = 1 + (geometry.rank if geometry is not None else 0)
      pair = [functools.partial(
          tracing.RelaxedFunction(fn, autograph=False),
          unknown=[-last if n == -1 else n for n in unknown])
              for fn, unknown in zip(pair, (_FORWARD_UNKNOWN,
                                            _BACKWARD_UNKNOWN))]
    else:
      pair = [tf.function(fn, autograph=False) for fn in pair]
    _loop_function_cache[key] = tuple(pair)
  return _loop_function_cache[key]


def tracing_count() -> int:
  """Traces of every loop pair made so far (tests count retraces)."""
  return sum(fn.func.tracing_count if isinstance(fn, functools.partial)
             else fn.experimental_get_tracing_count()
             for pair in _loop_function_cache.values() for fn in pair)


def run(kind: str, x: Tensor, state0: Sequence[Tensor],
        weights: Dict[str, Tensor], recompute: bool = False,
        mask: Optional[Tensor] = None,
        dropout: Optional[Dict[str, Tensor]] = None,
        norm_epsilon: float = 1e-3,
        zoneout: Optional[Dict[str, Tensor]] = None,
        geometry: Any = None,
        time_major: bool = True) -> Tuple[Tensor, List[Tensor]]:
  """Runs a built-in cell over a sequence of inputs, with its gradient.

  Args:
    kind: "lstm", "peephole_lstm" (an LSTM with diagonal peephole
      weights, Gers & Schmidhuber 2000), "gru" (Keras's `reset_after=True`),
      "gru_reset_before" (`reset_after=False`), "simple_rnn" (tanh), or
      `tf_recurrent.chunked.layer_norm`'s "layer_norm_lstm" and
      "layer_norm_simple_rnn".
    x: `[T, B, D]` inputs (`[B, T, D]` unless time_major) in the compute
      dtype, T >= 1.
    state0: The initial state, `[h, c]` (LSTMs) or `[h]`, `[B, H]`, in the
      compute dtype.
    weights: `kernel`, `recurrent_kernel`, `bias` (and a reset-after GRU's
      `recurrent_bias`; a peephole LSTM's `peephole` `[3, H]`, rows p_i,
      p_f, p_o; the layer norms' gammas and betas, see
      `tf_recurrent.chunked.layer_norm`), in their variable dtype, in Keras's
      layout.
    recompute: Keep only the states per step and rebuild each chunk's gates
      in the backward pass.
    mask: Optional `[T, B]` bool (time-major). Where False, the step carries
      the state (h and c) through unchanged and its inputs get no
      gradient, Keras's mask semantics; its outputs row is the carried h
      (the layers turn that into Keras's emitted output).
    dropout: Optional dropout masks, as Keras's cells draw them, the same
      for every step: "inputs" and/or "recurrent", each either one mask
      per gate (`implementation=1`), `[gates, B, D]` / `[gates, B, H]`
      (gates: 4 LSTM, 3 GRU, 1 SimpleRNN), gate g's block of the kernel
      reading `x * inputs[g]`, of the recurrent kernel `h * recurrent[g]`;
      or one mask for all gates, `[B, D]` / `[B, H]`. (One input mask for
      all gates is cheaper applied to x by the caller.)
    norm_epsilon: The layer-norm kinds' epsilon.
    geometry: The convolutional kinds' `convolutional.Geometry` (their
      inputs and states are `[T, B, ..., D]` and `[B, ..., H]` maps), a
      hashable value; None for the others.
    zoneout: Optional zoneout (Krueger et al. 2017) of the LSTM and GRU
      kinds: per state leaf ("h", and an LSTM's "c"), `[T, B, width]`
      masks k, bool (a quarter of float32's memory) or floats. Each step's
      new value of the leaf becomes
      `k * entering + (1 - k) * computed`: with 0/1 masks (training) a unit
      keeps its value where k is 1; with k the rate everywhere, the
      expectation (inference). Applied before a Keras mask's carry.
    time_major: Whether x and the outputs are `[T, B, ...]`; False:
      `[B, T, ...]`, a Keras layer's layout, read and written a chunk at a
      time with no transposed copy of the whole (which the gradient would
      keep beside the layer's own). mask and zoneout are time-major either
      way.

  Returns:
    `(outputs [T, B, H] (or [B, T, H]), final state list)`.

  An "lstm" without mask, dropout, zoneout or projection, float32, not
  recomputing, outside XLA and of at most `fused_lstm.MAX_UNITS` units runs
  on TensorFlow's whole-sequence LSTM kernels (`tf_recurrent.chunked.fused_lstm`);
  everything else on the chunked loops.

  Example:

  >>> w = {"kernel": tf.ones([3, 8]), "recurrent_kernel": tf.ones([2, 8]),
  ...      "bias": tf.zeros([8])}
  >>> outputs, (h, c) = run("lstm", tf.ones([5, 4, 3]),
  ...                       [tf.zeros([4, 2]), tf.zeros([4, 2])], w)
  >>> outputs.shape
  TensorShape([5, 4, 2])
  """
  if kind not in kinds.CELLS:
    raise ValueError(f"sequence.run: kind must be one of {sorted(kinds.CELLS)}; "
                     f"got {kind!r}.")
  if zoneout is not None:
    _check_zoneout(kind, zoneout)
  # Read variables here, outside the custom gradient: their gradient then
  # reaches them through the read.
  weights = {k: tf.convert_to_tensor(v) for k, v in weights.items()}
  if mask is not None:
    mask = tf.cast(mask, tf.bool)
  dropout = {k: tf.stop_gradient(m) for k, m in (dropout or {}).items()
             if m is not None} or None
  if zoneout is not None:
    zoneout = {k: tf.stop_gradient(m) for k, m in zoneout.items()} or None
  mode = ("eager" if tf.executing_eagerly() else
          "xla" if accumulators.in_xla_context() else "graph")
  if fused_lstm.applies(kind, x, weights, recompute, mode, mask, dropout,
                        zoneout):
    # TensorFlow's kernels run time-major.
    swap = functools.partial(structs.swap_batch_and_time, name="x")
    outputs, final = fused_lstm.run(x if time_major else swap(x), state0,
                                    weights)
    return (outputs if time_major else swap(outputs)), final
  names = sorted(weights)
  n_state = len(state0)
  chunk = CHUNK
  if mode == "eager" or tf.inside_function():
    forward_fn, backward_fn = _loop_functions(
        (kind, norm_epsilon, geometry), recompute, mode, time_major)
  else:  # A TF1 graph, built once: the loops inline.
    forward_fn, backward_fn = (
        tf.autograph.experimental.do_not_convert(
            functools.partial(fn, (kind, norm_epsilon, geometry), recompute,
                              mode == "xla", time_major=time_major))
        for fn in (_forward, _backward))

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
                                               chunk, mask, dropout,
                                               zoneout)
    # What the backward pass reads of the forward pass, behind an identity
    # TensorFlow does not differentiate past (see first_order).
    saved = first_order.saved_for_backward([outputs, kept, entries])

    def grad_fn(d_outputs, *d_final):
      # None: the backward pass adds no output gradient (`_backward`).
      d_outputs = (None if d_outputs is None or _filled_with_zeros(d_outputs)
                   else tf.cast(d_outputs, x.dtype))
      d_final = [tf.zeros_like(s) if d is None else tf.cast(d, s.dtype)
                 for s, d in zip(final, d_final)]
      dx, dstate0, dw = first_order.first_order_only(
          lambda *args: backward_fn(*args, chunk, mask, dropout, zoneout),
          [x, w, *saved, d_outputs, d_final],
          watch=[x, state, w, d_outputs, d_final],
          what=cell_lib.SECOND_ORDER_WHAT,
          remedy=cell_lib.SECOND_ORDER_REMEDY)
      return [dx] + dstate0 + [dw[k] for k in names]

    return [outputs] + final, grad_fn

  result = loop(x, *state0, *[weights[k] for k in names])
  return result[0], list(result[1:])
