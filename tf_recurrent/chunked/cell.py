"""What the chunked loop pair knows of a cell: the `Cell` interface.

`tf_recurrent.chunked.sequence` runs any `Cell`: it asks the cell for its
weights as its math reads them (`weights`), a chunk's projected inputs
(`project`), one step forward (`step`), what a chunk's backward steps read
(`prepare`), one step backward (`grad_step`) and a chunk's weight and input
gradients (`weight_grads`, single GEMMs over the chunk). The cells' math
lives one module each beside it (`lstm`, `gru`, `simple_rnn`, `layer_norm`,
`convolutional`); `Linear` and the row helpers here are what they share.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

# For `first_order.first_order_only`: the built-in cells' loops (chunked and
# fused) and what to use for a second-order gradient.
SECOND_ORDER_WHAT = (
    "The built-in cells' loop (LSTM, GRU, SimpleRNN and their peephole, "
    "projected, zoneout, layer-norm and convolutional variants)")
SECOND_ORDER_REMEDY = ("For a second order use the Keras layer "
                       "(keras.layers.LSTM, ...): autodiff's gradient.")

Tensor = tf.Tensor


def rows(block: Tensor) -> Tensor:
  """A `[K, B, w]` block as `[K * B, w]` rows of one GEMM."""
  width = block.shape[-1]
  return tf.reshape(block, [-1, tf.shape(block)[-1] if width is None
                            else width])


def _blocks(rows: Tensor, like: Tensor) -> Tensor:
  """`[K * B, w]` rows back into a block shaped like `like` but `w` wide."""
  shape = like.shape[:-1].concatenate(rows.shape[-1:])
  if not shape.is_fully_defined():
    shape = tf.concat([tf.shape(like)[:-1], tf.shape(rows)[-1:]], 0)
  return tf.reshape(rows, shape)


def column_sums(block: Tensor) -> Tensor:
  """The sum of a `[K, B, ..., w]` block's rows, `[w]` (a bias gradient).

  Over K first, then the rest: TF's CPU kernel sums the leading axis of a
  `[K * B, w]` matrix several times slower (6.5 ms against 1.5 ms for a
  `[12800, 512]` chunk of dz, the chunk's slowest op).
  """
  per_step = tf.reduce_sum(block, axis=0)
  return tf.reduce_sum(per_step, axis=list(range(per_step.shape.rank - 1)))


def shift_in(first: Tensor, block: Tensor) -> Tensor:
  """`[first, block[0], ..., block[K-2]]`: the rows entering each step."""
  return tf.concat([first[None], block[:-1]], axis=0)


def matmul_rows(a: Tensor, kernel: Tensor) -> Tensor:
  """`a @ kernel` for `a` of any rank >= 2 (one GEMM over all its rows)."""
  if a.shape.rank == 2:
    return tf.matmul(a, kernel)
  return _blocks(tf.matmul(rows(a), kernel), a)


def block_masks(masks: Optional[Tensor], blocks) -> Optional[Tensor]:
  """The dropout masks of the kernel column blocks `blocks` (indices), as
  `Linear` takes them: one shared `[B, F]` mask serves every block."""
  if masks is None or masks.shape.rank == 2:
    return masks
  return tf.gather(masks, blocks)


class Linear:
  """`a @ kernel` over `[..., B, F]` rows, and its two gradients.

  With a dropout mask every row of `a` is masked before the product, the
  same mask for every step of the sequence: one `[B, F]` mask for all of
  the kernel's `gates` column blocks, or `[gates, B, F]`, one per block
  (Keras's `implementation=1`, which recurrent dropout implies in
  Keras 3.6 and later; earlier Keras draws one mask for all gates).
  """

  def __init__(self, kernel: Tensor, gates: int,
               masks: Optional[Tensor] = None):
    self.kernel = kernel
    # Transposed once: a transposing matmul inside the loop costs several
    # times the plain one on this CPU (benchmarks/PROFILE.md).
    self.kernel_t = tf.transpose(kernel)
    self.gates = gates
    self.masks = masks
    self.per_gate = masks is not None and masks.shape.rank == 3

  def _per_gate(self, t: Tensor, axis: int = -1) -> List[Tensor]:
    return tf.split(t, self.gates, axis=axis)

  def _masked(self, a: Tensor) -> Tensor:
    return a if self.masks is None else a * self.masks

  def __call__(self, a: Tensor) -> Tensor:
    if not self.per_gate:
      return matmul_rows(self._masked(a), self.kernel)
    return tf.concat([matmul_rows(a * self.masks[g], k)
                      for g, k in enumerate(self._per_gate(self.kernel))],
                     axis=-1)

  def input_grad(self, dz: Tensor) -> Tensor:
    """The gradient of `a` given the gradient `dz` of `self(a)`."""
    if not self.per_gate:
      return self._masked(matmul_rows(dz, self.kernel_t))
    return tf.add_n([
        matmul_rows(d, k) * self.masks[g] for g, (d, k) in enumerate(
            zip(self._per_gate(dz), self._per_gate(self.kernel_t, 0)))])

  def kernel_grad(self, a: Tensor, dz: Tensor) -> Tensor:
    """The kernel's gradient, one GEMM over all rows of `a` and `dz`."""
    if not self.per_gate:
      return tf.matmul(rows(self._masked(a)), rows(dz), transpose_a=True)
    return tf.concat([
        tf.matmul(rows(a * self.masks[g]), rows(d), transpose_a=True)
        for g, d in enumerate(self._per_gate(dz))], axis=-1)


class Cell:
  """What the chunked loops ask of a cell's math (`Lstm`, `Gru`, ...).

  A cell reads its weights as built by `weights()`: `input` and
  `recurrent` (`Linear` maps of the kernels, with the call's dropout
  masks) and the biases.

  Attributes:
    gates: Width of the projection in units of H.
    grad_gates: Width of a step's gradient row (`grad_step`'s second
      result, `weight_grads`' block) in units of H, if not `gates`.
    gate_rows: Rows of the gate-major `[n, B, H]` activations kept per step.
    state_rows: The state leaves a step writes as rows of the same name
      (with a mask, the carried state is written).
    kept_with_gates: What the backward pass reads per step besides the
      outputs, unless recomputing.
    takes_zoneout: Whether `run`'s zoneout applies (the loops zone the
      state leaves out around `step` and `grad_step`; `prepare` gets the
      chunk's masks as `zone_block`).
  """

  gates: int
  takes_zoneout: bool = False
  grad_gates: Optional[int] = None
  gate_rows: int = 0
  state_rows: Tuple[str, ...] = ("h",)
  kept_with_gates: Tuple[str, ...] = ()

  def __init__(self, recompute: bool, use_xla: bool = False,
               epsilon: float = 1e-3, weight_names=(), geometry=None):
    self.recompute = recompute
    self.use_xla = use_xla
    self.epsilon = epsilon
    self.weight_names = frozenset(weight_names)
    self.geometry = geometry

  def widths(self, recurrent_kernel: Tensor) -> Dict[str, Any]:
    """`{"h": P, "cell": H}`: h's width (the recurrent kernel's rows) and
    the cell's (its columns over `gates`), Python ints where static."""
    static = recurrent_kernel.shape
    dynamic = tf.shape(recurrent_kernel)
    rows = static[0] if static[0] is not None else dynamic[0]
    columns = static[1] if static[1] is not None else dynamic[1]
    return {"h": rows, "cell": columns // self.gates}

  def grad_columns(self, widths) -> Any:
    """The width of a step's gradient row (`grad_step`'s second result,
    `weight_grads`' block)."""
    return (self.grad_gates or self.gates) * widths["cell"]

  def kept(self) -> Tuple[str, ...]:
    """The per-step rows the backward pass reads besides the outputs
    (which it always reads: h entering each step)."""
    return () if self.recompute else self.kept_with_gates

  def row_shapes(self, widths) -> Dict[str, Tuple[Any, Optional[int]]]:
    """Per row written per step, `(columns, gate rows)`: h `[B, P]`, and
    what `kept()` names, `[B, H]` or gate-major `[gate_rows, B, H]`."""
    shapes = {"h": (widths["h"], None)}
    for name in self.kept():
      shapes[name] = (widths["cell"],
                      self.gate_rows if name == "gates" else None)
    return shapes

  def weights(self, w: Dict[str, Tensor], dropout: Dict[str, Tensor]):
    """The step math's weights from the layer's (in the compute dtype) and
    the dropout masks (`dropout`: "inputs", "recurrent"; see `Linear`)."""
    return {**w,
            "input": self.linear(w["kernel"], dropout.get("inputs"),
                                 recurrent=False),
            "recurrent": self.linear(w["recurrent_kernel"],
                                     dropout.get("recurrent"),
                                     recurrent=True)}

  def linear(self, kernel: Tensor, masks: Optional[Tensor],
             recurrent: bool) -> "Linear":
    """The map of the input (or recurrent) kernel: a product of rows
    (`Linear`); a convolutional kind's convolution."""
    del recurrent
    return Linear(kernel, self.gates, masks)

  def external_grads(self, grads):
    """The weight gradients in the layer's layout (see `Lstm`)."""
    return grads

  def project(self, w, x_block):
    """The projected inputs `x W + b` of a `[K, B, D]` block."""
    return w["input"](x_block) + w["bias"]

  def weight_grads(self, w, prep, dz_block, x_block):
    """(the weights' gradients from one chunk, its inputs' gradient):
    single GEMMs over the chunk's `[K, B, .]` blocks."""
    grads = {"kernel": w["input"].kernel_grad(x_block, dz_block),
             "recurrent_kernel": w["recurrent"].kernel_grad(prep["h_prev"],
                                                            dz_block),
             "bias": column_sums(dz_block)}
    return grads, w["input"].input_grad(dz_block)


def split_last(t: Tensor, parts: Sequence[int]) -> List[Tensor]:
  """`t`'s last axis cut into blocks `parts` gate widths wide."""
  width = tf.shape(t)[-1] // sum(parts)
  return tf.split(t, [p * width for p in parts], axis=-1)
