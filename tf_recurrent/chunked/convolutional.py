"""Convolutional LSTM math for the chunked loops of `sequence` (kind "conv_lstm").

Keras's `ConvLSTMCell` (Shi et al. 2015) of any rank (1, 2 or 3 spatial
axes), channels last, gate blocks `[i, f, c, o]` along the kernels' last
axis:

    z = conv(x, W; strides, padding, dilation) + b + conv(h, U; "same")
    i, f, o = sigmoid(z_i, z_f, z_o);  g = tanh(z_c)
    c = f * c_prev + i * g;  h = o * tanh(c)

It is `lstm.Lstm` with its two products of rows replaced by
convolutions (`ConvLinear`), so the loops run it as they run an LSTM: per
chunk of frames the input convolution is one batched convolution over the
chunk's `K * B` frames (where Keras's cell convolves each frame's input in
the loop, and a recomputing backward pass again), and so are the kernels'
gradients and the inputs' gradient after the chunk's backward steps; a step
convolves only h forward and back-propagates only dz through U. Kept per
frame: the gate maps (c is rebuilt per chunk from them), or with `recompute`
nothing but the outputs.

A frame's elementwise work (the gates, c and h forward; the gates'
gradients back) runs over whole maps, `[B, *spatial, 4F]`: in the TF
executor each of its ~15 ops is a pass over memory (the splits and stacks
of the gate blocks as costly as the convolutions' own work at 32x32x16
maps), so outside XLA each is one XLA cluster (`step_clusters.wrap`), one
pass; the convolutions stay outside the clusters, TensorFlow's own kernels.
"""

import dataclasses
import functools
import itertools
import math
from typing import Optional, Sequence, Tuple

import tensorflow as tf

from tf_recurrent.chunked import lstm
from tf_recurrent.op import cells
from tf_recurrent.op import step_clusters

Tensor = tf.Tensor


@dataclasses.dataclass(frozen=True)
class Geometry:
  """The input convolution of a ConvLSTM, and the frames it reads.

  Attributes:
    kernel_size: The kernels' spatial size, one int per spatial axis.
    strides: The input convolution's strides (the recurrent one's are 1).
    padding: "same" or "valid" (the recurrent convolution's is "same").
    dilation_rate: The input convolution's dilation.
    in_spatial: The input frames' spatial shape (channels last).

  Example:

  >>> Geometry((3, 3), (2, 2), "valid", (1, 1), (9, 8)).out_spatial
  (4, 3)
  """
  kernel_size: Tuple[int, ...]
  strides: Tuple[int, ...]
  padding: str
  dilation_rate: Tuple[int, ...]
  in_spatial: Tuple[int, ...]

  @property
  def rank(self) -> int:
    """The number of spatial axes."""
    return len(self.kernel_size)

  @property
  def out_spatial(self) -> Tuple[int, ...]:
    """The state's spatial shape: the input convolution's output's."""
    sizes = []
    for n, k, s, d in zip(self.in_spatial, self.kernel_size, self.strides,
                          self.dilation_rate):
      span = n if self.padding == "same" else n - (k - 1) * d
      sizes.append(math.ceil(span / s))
    return tuple(sizes)

  def check(self) -> None:
    """Raises ValueError where the frames are too small for the kernel."""
    if any(n < 1 for n in self.out_spatial):
      raise ValueError(
          f"ConvLSTM: with padding='valid' a kernel of size "
          f"{self.kernel_size} (dilation {self.dilation_rate}) does not fit "
          f"frames of spatial shape {self.in_spatial}: each spatial axis "
          f"must be at least (kernel_size - 1) * dilation_rate + 1. Use "
          f"padding='same' or a smaller kernel.")


class _Convolution:
  """One convolution (channels last, 1 to 3 spatial axes) and its two
  gradients, as the loops run them on many frames at once.

  A 1D convolution runs as a 2D one over frames of height 1, so that every
  rank has TensorFlow's (and XLA's) backprop kernels. A dilated one's
  gradients are autodiff's: TensorFlow's CPU backprop kernels take no
  dilation, and `tf.nn.convolution` runs it through space-to-batch. Under
  XLA the kernel's gradient is one GEMM per kernel offset
  (`_kernel_grad_by_offsets`).
  """

  def __init__(self, strides: Sequence[int], padding: str,
               dilation_rate: Sequence[int], in_spatial: Sequence[int],
               use_xla: bool = False):
    self.use_xla = use_xla
    self.lift = len(strides) == 1
    pad = (1,) if self.lift else ()
    self.strides = [1, *pad, *strides, 1]
    self.dilations = [1, *pad, *dilation_rate, 1]
    self.padding = padding.upper()
    self.in_spatial = [*pad, *in_spatial]
    self.rank = len(self.in_spatial)

  def _lifted(self, t: Tensor, axis: int) -> Tensor:
    return tf.expand_dims(t, axis) if self.lift else t

  def _lowered(self, t: Tensor, axis: int) -> Tensor:
    return tf.squeeze(t, [axis]) if self.lift else t

  def apply(self, frames: Tensor, kernel: Tensor) -> Tensor:
    """`[N, ..., C]` frames convolved with `[..., C, O]`: `[N, ..., O]`."""
    out = tf.nn.convolution(self._lifted(frames, 1), self._lifted(kernel, 0),
                            strides=self.strides[1:-1],
                            padding=self.padding,
                            dilations=self.dilations[1:-1])
    return self._lowered(out, 1)

  @property
  def _dilated(self) -> bool:
    return any(d > 1 for d in self.dilations)

  def _autodiff(self, frames: Tensor, kernel: Tensor, dy: Tensor,
                wrt: Tensor) -> Tensor:
    with tf.GradientTape() as tape:
      tape.watch(wrt)
      out = self.apply(frames, kernel)
    return tape.gradient(out, wrt, output_gradients=dy)

  def input_grad(self, dy: Tensor, kernel: Tensor) -> Tensor:
    """The frames' gradient, given the output's `dy`."""
    if self._dilated:  # The values of the frames do not matter.
      frames = tf.zeros(tf.concat([tf.shape(dy)[:1], self.in_spatial[
          int(self.lift):], tf.shape(kernel)[-2:-1]], 0), dy.dtype)
      return self._autodiff(frames, kernel, dy, frames)
    dy, kernel = self._lifted(dy, 1), self._lifted(kernel, 0)
    sizes = tf.concat([tf.shape(dy)[:1], self.in_spatial,
                       tf.shape(kernel)[-2:-1]], 0)
    backprop = (tf.raw_ops.Conv2DBackpropInput if self.rank == 2 else
                tf.raw_ops.Conv3DBackpropInputV2)
    dx = backprop(input_sizes=sizes, filter=kernel, out_backprop=dy,
                  strides=self.strides, padding=self.padding,
                  dilations=self.dilations)
    return self._lowered(dx, 1)

  def kernel_grad(self, frames: Tensor, dy: Tensor, kernel: Tensor) -> Tensor:
    """The kernel's gradient, given the frames and the output's `dy`."""
    if self.use_xla:
      return self._lowered(self._kernel_grad_by_offsets(
          self._lifted(frames, 1), self._lifted(dy, 1),
          self._lifted(kernel, 0).shape), 0)
    if self._dilated:
      return self._autodiff(frames, kernel, dy, kernel)
    lifted = self._lifted(kernel, 0)
    backprop = (tf.raw_ops.Conv2DBackpropFilter if self.rank == 2 else
                tf.raw_ops.Conv3DBackpropFilterV2)
    dk = backprop(input=self._lifted(frames, 1), filter_sizes=tf.shape(lifted),
                  out_backprop=self._lifted(dy, 1), strides=self.strides,
                  padding=self.padding, dilations=self.dilations)
    return self._lowered(dk, 0)

  def _kernel_grad_by_offsets(self, frames: Tensor, dy: Tensor,
                              kernel_shape: tf.TensorShape) -> Tensor:
    """The kernel's gradient as one GEMM per kernel offset: the frames'
    window at that offset (a strided slice), transposed, times dy.

    For XLA: its CPU backend ran a filter-gradient convolution inside a
    while loop 70x slower than alone (1273 ms against 18 ms for two of a
    chunk's at 1D, B=8, 256 x 16), where its GEMMs run at full speed.
    """
    *window, channels, _ = kernel_shape.as_list()
    out_spatial = dy.shape[1:-1].as_list()
    strides, dilations = self.strides[1:-1], self.dilations[1:-1]
    paddings = [[0, 0]]
    for n, k, s, d, out in zip(self.in_spatial, window, strides, dilations,
                               out_spatial):
      total = (max((out - 1) * s + (k - 1) * d + 1 - n, 0)
               if self.padding == "SAME" else 0)
      paddings.append([total // 2, total - total // 2])
    padded = tf.pad(frames, paddings + [[0, 0]])
    dy_rows = tf.reshape(dy, [-1, dy.shape[-1]])
    grads = []
    for offset in itertools.product(*(range(k) for k in window)):
      at = tuple(slice(o * d, o * d + (out - 1) * s + 1, s) for o, d, s, out
                 in zip(offset, dilations, strides, out_spatial))
      rows = tf.reshape(padded[(slice(None),) + at], [-1, channels])
      grads.append(tf.matmul(rows, dy_rows, transpose_a=True))
    return tf.reshape(tf.stack(grads), kernel_shape)


def _frames(block: Tensor, rank: int) -> Tensor:
  """A `[..., B, *spatial, C]` block as `[N, *spatial, C]` frames."""
  static = block.shape[-(rank + 1):]
  trailing = (static.as_list() if static.is_fully_defined()
              else tf.shape(block)[-(rank + 1):])
  return tf.reshape(block, tf.concat([[-1], trailing], 0))


def _unframed(frames: Tensor, like: Tensor, rank: int) -> Tensor:
  """`[N, *spatial, O]` frames back into `like`'s leading axes."""
  shape = like.shape[:-(rank + 1)].concatenate(frames.shape[1:])
  if not shape.is_fully_defined():
    shape = tf.concat([tf.shape(like)[:-(rank + 1)], tf.shape(frames)[1:]],
                      0)
  return tf.reshape(frames, shape)


class ConvLinear:
  """`cell.Linear`'s interface for a convolution: the map of a kernel
  over `[..., B, *spatial, C]` maps, its input's and its kernel's gradients,
  each one convolution over all the frames given.

  Keras's ConvLSTM cell draws its dropout masks per gate (`[gates, B,
  *spatial, C]`): gate g's block of the kernel convolves the masked
  `a * masks[g]`.
  """

  def __init__(self, kernel: Tensor, gates: int, masks: Optional[Tensor],
               convolution: _Convolution):
    self.kernel = kernel
    self.gates = gates
    self.masks = masks
    self._convolution = convolution
    self._rank = len(convolution.in_spatial) - int(convolution.lift)

  def _blocks(self, t: Tensor) -> Sequence[Tensor]:
    return tf.split(t, self.gates, axis=-1)

  def __call__(self, a: Tensor) -> Tensor:
    conv, rank = self._convolution, self._rank
    if self.masks is None:
      return _unframed(conv.apply(_frames(a, rank), self.kernel), a, rank)
    return tf.concat([
        _unframed(conv.apply(_frames(a * self.masks[g], rank), k), a, rank)
        for g, k in enumerate(self._blocks(self.kernel))], axis=-1)

  def input_grad(self, dz: Tensor) -> Tensor:
    """The gradient of `a` given the gradient `dz` of `self(a)`."""
    conv, rank = self._convolution, self._rank
    if self.masks is None:
      return _unframed(conv.input_grad(_frames(dz, rank), self.kernel), dz,
                       rank)
    return tf.add_n([
        _unframed(conv.input_grad(_frames(d, rank), k), dz, rank) *
        self.masks[g] for g, (d, k) in enumerate(
            zip(self._blocks(dz), self._blocks(self.kernel)))])

  def kernel_grad(self, a: Tensor, dz: Tensor) -> Tensor:
    """The kernel's gradient, one convolution over all frames of a and dz."""
    conv, rank = self._convolution, self._rank
    if self.masks is None:
      return conv.kernel_grad(_frames(a, rank), _frames(dz, rank),
                              self.kernel)
    return tf.concat([
        conv.kernel_grad(_frames(a * self.masks[g], rank), _frames(d, rank),
                         k)
        for g, (d, k) in enumerate(zip(self._blocks(dz),
                                       self._blocks(self.kernel)))], axis=-1)


class ConvLstm(lstm.Lstm):
  """`lstm.Lstm` on `[B, *spatial, F]` maps (see the module docstring).

  Weights (Keras's layout): kernel `[*kernel_size, D, 4F]`,
  recurrent_kernel `[*kernel_size, F, 4F]`, bias `[4F]`; `geometry` a
  `Geometry`. No projection, peepholes or zoneout.
  """

  takes_zoneout = False

  def kept(self):
    # c is rebuilt per chunk from the gates in every mode (an elementwise
    # scan, next to nothing beside a frame's convolutions): F floats less
    # per frame of the 6F the gates, c and h would hold.
    return () if self.recompute else ("gates",)

  def widths(self, recurrent_kernel):
    shape = (*self.geometry.out_spatial, recurrent_kernel.shape[-1] // 4)
    return {"h": shape, "cell": shape}

  def grad_columns(self, widths):
    return (*self.geometry.out_spatial, 4 * widths["cell"][-1])

  def step(self, w, state, projected):
    h, c = state
    kept = self.kept()
    state_math = step_clusters.wrap(
        functools.partial(_state_math, "gates" in kept), True, self.use_xla,
        "ConvLSTM step")
    c1, h1, gates = state_math(projected, w["recurrent"](h), c)
    rows = {"h": h1, "c": c1, "gates": gates}
    return (h1, c1), {k: v for k, v in rows.items() if k == "h" or k in kept}

  def grad_step(self, w, prep, j, dstate):
    dh, dc = dstate
    gate_grads = step_clusters.wrap(_gate_grads, True, self.use_xla,
                                    "ConvLSTM gradient step")
    dz, dc_prev = gate_grads(prep["gates"][j], prep["c"][j],
                             prep["c_prev"][j], dh, dc)
    return (w["recurrent"].input_grad(dz), dc_prev), dz

  def linear(self, kernel, masks, recurrent):
    g = self.geometry
    if recurrent:
      rank = g.rank
      convolution = _Convolution((1,) * rank, "same", (1,) * rank,
                                 g.out_spatial, self.use_xla)
    else:
      convolution = _Convolution(g.strides, g.padding, g.dilation_rate,
                                 g.in_spatial, self.use_xla)
    return ConvLinear(kernel, self.gates, masks, convolution)


def _state_math(keep_gates: bool, projected: Tensor, recurrent: Tensor,
                c: Tensor):
  """A frame's `(c1, h1, gates)` from its two convolutions (gates `[i, c, f,
  o]` along the last axis, as inside the loops) and c; gates: the
  gate-major `[4, B, ..., F]` activations, or None unless `keep_gates`."""
  i, g, f, o = tf.split(projected + recurrent, 4, axis=-1)
  i, g, f, o = tf.sigmoid(i), tf.tanh(g), tf.sigmoid(f), tf.sigmoid(o)
  c1, h1 = cells.lstm_state(i, f, g, o, c)
  return c1, h1, tf.stack([i, g, f, o]) if keep_gates else None


def _gate_grads(gates: Tensor, c: Tensor, c_prev: Tensor, dh: Tensor,
                dc: Tensor):
  """A frame's `(dz, dc_prev)`: dz `[..., 4F]` in the loops' gate order."""
  i, g, f, o = gates[0], gates[1], gates[2], gates[3]
  (dzi, dzf, dzg, dzo), dc = cells.lstm_gate_grads(i, f, g, o, c_prev,
                                                   tf.tanh(c), dh, dc)
  return tf.concat([dzi, dzg, dzf, dzo], axis=-1), dc * f

