"""The ConvLSTM kind of the chunked loops against a float64 static unroll.

Chunks are 3 frames long here (T=5: 3 + 2, a partial last chunk). The unroll
convolves every frame's input and h with `tf.nn.convolution` and applies
Keras's ConvLSTM cell equations, masks carrying the state as Keras's masked
step does, dropout masks per gate as Keras's cell draws them.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

from conftest import GRAPH_MODES
from conftest import loop_values_and_grads
from conftest import pairwise
from tf_recurrent.chunked import convolutional
from tf_recurrent.chunked import sequence

B, C, F = 2, 2, 3


@pytest.fixture(autouse=True)
def short_chunks(monkeypatch):
  monkeypatch.setattr(sequence, "CHUNK", 3)


def geometry(rank, strides=1, padding="same", dilation=1, side=5):
  return convolutional.Geometry(
      (3,) * rank, (strides,) * rank, padding, (dilation,) * rank,
      tuple(side + k for k in range(rank)))


def conv(a, kernel, masks, g=None):
  """The input convolution (`g`; the recurrent one without), gate block k
  of the kernel convolving `a * masks[k]`."""
  options = (dict(strides=g.strides, padding=g.padding.upper(),
                  dilations=g.dilation_rate) if g else dict(padding="SAME"))
  if masks is None:
    return tf.nn.convolution(a, kernel, **options)
  return tf.concat([tf.nn.convolution(a * masks[k], w, **options)
                    for k, w in enumerate(tf.split(kernel, 4, axis=-1))], -1)


def unrolled(x, state0, w, g, mask=None, dropout=None):
  dropout = dropout or {}
  h, c = state0
  outputs = []
  for t in range(x.shape[0]):
    z = (conv(x[t], w["kernel"], dropout.get("inputs"), g) + w["bias"] +
         conv(h, w["recurrent_kernel"], dropout.get("recurrent")))
    i, f, gg, o = tf.split(z, 4, axis=-1)
    c1 = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(gg)
    h1 = tf.sigmoid(o) * tf.tanh(c1)
    if mask is not None:
      running = tf.reshape(mask[t], [-1] + [1] * g.rank + [1])
      h1, c1 = tf.where(running, h1, h), tf.where(running, c1, c)
    h, c = h1, c1
    outputs.append(h)
  return tf.stack(outputs), [h, c]


def case(g, steps, seed=0):
  rng = np.random.default_rng(seed)
  normal = lambda *shape: tf.constant(rng.normal(size=shape), tf.float64)
  k = g.kernel_size
  w = {"kernel": normal(*k, C, 4 * F) * 0.5,
       "recurrent_kernel": normal(*k, F, 4 * F) * 0.3,
       "bias": normal(4 * F)}
  state0 = [normal(B, *g.out_spatial, F), normal(B, *g.out_spatial, F)]
  return normal(steps, B, *g.in_spatial, C), state0, w


def dropout_masks(g, seed=1):
  rng = np.random.default_rng(seed)
  keep = lambda *shape: tf.constant((rng.random(shape) < 0.7) / 0.7,
                                    tf.float64)
  return {"inputs": keep(4, B, *g.in_spatial, C),
          "recurrent": keep(4, B, *g.out_spatial, F)}


def loss_of(outputs, final):
  # Weighted per frame and per leaf: a frame or leaf swapped changes it.
  frames = tf.cast(tf.range(1, tf.shape(outputs)[0] + 1), outputs.dtype)
  loss = tf.reduce_sum(tf.sin(outputs) * tf.reshape(
      frames, [-1] + [1] * (outputs.shape.rank - 1)))
  return loss + sum((i + 2.0) * tf.reduce_sum(tf.cos(s))
                    for i, s in enumerate(final))


def loop_inputs(g, steps, mask, dropout):
  def make_inputs():
    x, state0, w = case(g, steps)
    return (x, state0, w), (
        dropout_masks(g) if dropout else None,
        None if mask is None else tf.constant(mask))
  return make_inputs


@functools.lru_cache(maxsize=None)
def unrolled_reference(g, steps, mask_rows, dropout):
  """The unroll's values and gradients, shared by every mode and recompute
  choice of ours; `mask_rows`: the mask as a tuple of rows, or None."""
  mask = None if mask_rows is None else np.array(mask_rows, bool)
  # In a tf.function: eager autodiff of a 3D convolution fails in
  # TensorFlow 2.21 (its gradient reads a data_format the eager op lacks).
  return loop_values_and_grads(
      "function", loop_inputs(g, steps, mask, dropout),
      lambda x, s, w, d, m: unrolled(x, s, w, g, m, d), loss_of)


def run_both(mode, g, steps, recompute=False, mask=None, dropout=False):
  """Ours in `mode` against the unroll; mask: a `[T, B]` numpy bool array."""
  ours = loop_values_and_grads(
      mode, loop_inputs(g, steps, mask, dropout),
      lambda x, s, w, d, m: sequence.run("conv_lstm", x, s, w,
                                         recompute=recompute, mask=m,
                                         dropout=d, geometry=g), loss_of)
  want = unrolled_reference(
      g, steps, None if mask is None else tuple(map(tuple, mask.tolist())),
      dropout)
  for got, expected in zip(tf.nest.flatten(ours), tf.nest.flatten(want)):
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


GEOMETRIES = {
    "1d_same": geometry(1),
    "2d_same": geometry(2),
    "2d_strided_valid": geometry(2, strides=2, padding="valid"),
    "2d_dilated": geometry(2, dilation=2, side=6),
    "3d_valid": geometry(3, padding="valid", side=3),
}


# Holes across the chunk boundary and an all-masked example.
MASK = np.array([[1, 1, 0, 0, 1], [0, 0, 0, 0, 0]], bool).T

# Modes x recompute x geometries x (masks and dropout), pairwise: every
# geometry in every mode, each with both recompute values and with and
# without masks and dropout; the edges: one frame, eagerly and traced.
CASES = [(mode, recompute, name, 5, masked)
         for mode, recompute, name, masked in pairwise(
             GRAPH_MODES, [False, True], sorted(GEOMETRIES), [False, True])]
CASES += [(mode, False, "1d_same", 1, False) for mode in ("eager", "function")
          if (mode, False, "1d_same", 1, False) not in CASES]


def case_id(mode, recompute, name, steps, masked):
  return "-".join([name, f"{steps}_frame" + "s" * (steps > 1)] +
                  (["masks_and_dropout"] if masked else []) +
                  ["recompute" if recompute else "keep_gates", mode])


@pytest.mark.parametrize("mode,recompute,name,steps,masked", [
    pytest.param(*c, id=case_id(*c)) for c in CASES])
def test_matches_float64_unroll(mode, recompute, name, steps, masked):
  """T=5 frames (3 + 2) or one; with masks, holes across the chunk boundary
  and an all-masked example, together with Keras's per-gate dropout masks
  of the inputs and of h."""
  run_both(mode, GEOMETRIES[name], steps, recompute,
           mask=MASK if masked else None, dropout=masked)


def test_geometry_output_shape_and_error():
  assert geometry(2, strides=2, padding="valid").out_spatial == (2, 2)
  assert geometry(1, dilation=2).out_spatial == (5,)
  with pytest.raises(ValueError, match=r"padding='valid'.*kernel of size "
                     r"\(3, 3\).*frames of spatial shape \(2, 9\)"):
    convolutional.Geometry((3, 3), (1, 1), "valid", (1, 1), (2, 9)).check()


def test_keeps_gates_and_c_or_nothing():
  """Kept per frame: the gate maps `[4, B, ..., F]` (c is rebuilt from
  them), or with recompute nothing but the outputs."""
  g = GEOMETRIES["2d_same"]
  x, state0, w = case(g, 5)
  for recompute, shapes in [
      (False, [(2, 3, 4, B, *g.out_spatial, F)]),
      (True, [])]:
    run = tf.function(lambda: sequence._forward(  # pylint: disable=protected-access
        ("conv_lstm", 1e-3, g), recompute, False, x, state0, w, 3))
    kept = run()[2]
    assert [tuple(k.shape) for k in kept] == shapes
