"""The training steps `bench_linear` times: the linear layers, their floors,
LSTM and GRU layers, JAX's minGRU, and the chunk sweep's scans.

Each builder returns a zero-argument callable running one training step
(forward over T steps, a loss over every step's output, the gradients of
all weights), its result copied to the host.
"""

from typing import Callable

from benchmarks import linear_report
from benchmarks.common import training_step

LINEAR, LSTM = linear_report.LINEAR, linear_report.LSTM
FLOORS = [name.split(".")[1] + linear_report.FLOOR_SUFFIX for name in LINEAR]
RNNS = [LSTM, "tf_recurrent.GRU", "keras.layers.LSTM", "keras.layers.GRU"]
JAX = ["jax minGRU lax.scan", "jax minGRU lax.associative_scan"]
HARNESS = linear_report.HARNESS
TF_ROWS = LINEAR + FLOORS + RNNS
# The floor's stand-in for the carried state: one multiply-add per step.
FLOOR_STATE = 0.5


def chunk_size_of(value: str):
  """A --chunk_size flag's value as the layers take it: "auto" or an int."""
  return value if value == "auto" else int(value)


def _layer(name: str, units: int, chunk_size="auto"):
  """A fresh layer of row `name` (a linear layer or an LSTM/GRU), returning
  every step's output."""
  import keras  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top
  module, cls = name.rsplit(".", 1)
  if name in LINEAR:
    return getattr(tf_recurrent, cls)(units, return_sequences=True,
                                      chunk_size=chunk_size)
  if module == "tf_recurrent":
    return getattr(tf_recurrent, cls)(units, return_sequences=True)
  return getattr(keras.layers, cls)(units, return_sequences=True,
                                    use_cudnn=False)


def tf_step(name: str, steps: int, jit: bool, batch: int, units: int,
            chunk_size="auto") -> Callable[[], object]:
  """One TensorFlow training step of row `name` at T=`steps`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x = tf.random.stateless_normal((batch, steps, units), seed=[1, 2])
  if name == HARNESS:
    w = tf.Variable(tf.ones([units]))
    weights = [w]

    def outputs():
      return x * w
  elif name in FLOORS:
    layer = _layer(LINEAR[FLOORS.index(name)], units)
    layer.build(x.shape)
    cell = layer.cell
    weights = cell.trainable_weights

    def outputs():
      a, b = type(cell).gate_function(x, *cell.gate_weights())
      return FLOOR_STATE * a + b
  else:
    layer = _layer(name, units, chunk_size)
    layer.build(x.shape)
    weights = layer.trainable_weights

    def outputs():
      return layer(x)

  return training_step(outputs, weights, jit)


def jax_min_gru_loss(kernel, bias, x, associative: bool):
  """The minGRU of `tf_recurrent.MinGRU` in JAX: x `[B, T, D]`, kernel
  `[D, 2H]` (z's columns, then h~'s), bias `[2H]`, h_0 = g(0) = 0.5; the
  mean square of every h_t.

  Its gates run over the whole sequence, then `lax.scan` (one step at a
  time) or `lax.associative_scan` over (a_t, b_t), composed as
  (a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  k_z, k_h = jnp.split(x @ kernel + bias, 2, axis=-1)
  g = jnp.where(k_h >= 0, k_h + 0.5, jax.nn.sigmoid(k_h))
  a, b = jax.nn.sigmoid(-k_z), jax.nn.sigmoid(k_z) * g
  h0 = jnp.full(a.shape[:1] + a.shape[2:], 0.5, a.dtype)
  if associative:
    b = b.at[:, 0].add(a[:, 0] * h0)

    def compose(first, second):
      (a1, b1), (a2, b2) = first, second
      return a1 * a2, a2 * b1 + b2

    _, h = jax.lax.associative_scan(compose, (a, b), axis=1)
  else:
    def step(h, ab):
      h = ab[0] * h + ab[1]
      return h, h

    _, h = jax.lax.scan(step, h0, (jnp.swapaxes(a, 0, 1),
                                   jnp.swapaxes(b, 0, 1)))
  return jnp.mean(jnp.square(h))


def jax_step(name: str, steps: int, batch: int,
             units: int) -> Callable[[], object]:
  """One jitted JAX training step of row `name`."""
  import jax  # pylint: disable=g-import-not-at-top
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  kernel = jax.random.normal(k1, (units, 2 * units)) * units**-0.5
  bias = jax.numpy.zeros(2 * units)
  x = jax.random.normal(k2, (batch, steps, units))
  associative = name.endswith("associative_scan")
  # x an argument, not a constant folded into the compiled program.
  grad = jax.jit(jax.grad(
      lambda k, b, x: jax_min_gru_loss(k, b, x, associative),
      argnums=(0, 1)))
  return lambda: [g.block_until_ready() for g in grad(kernel, bias, x)]


def sweep_step(name: str, steps: int, jit: bool, batch: int, units: int,
               chunk: int) -> Callable[[], object]:
  """The sweep's steps: MinGRU's training step, or linear_scan's (random
  decays in (0, 1) and inputs; gradients of a and b, summed)."""
  if name == "tf_recurrent.MinGRU":
    return tf_step(name, steps, jit, batch, units, chunk)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top
  shape = (batch, steps, units)
  a = tf.sigmoid(tf.random.stateless_normal(shape, seed=[3, 4]) + 2.0)
  b = tf.random.stateless_normal(shape, seed=[5, 6])

  @tf.function(jit_compile=jit)
  def step():
    with tf.GradientTape() as tape:
      tape.watch([a, b])
      h, _ = tf_recurrent.linear_scan(a, b, chunk_size=chunk)
      loss = tf.reduce_mean(tf.square(h))
    return [tf.reduce_sum(g) for g in tape.gradient(loss, [a, b])]

  return lambda: [g.numpy() for g in step()]


SWEPT = ["tf_recurrent.MinGRU", "tf_recurrent.linear_scan"]
