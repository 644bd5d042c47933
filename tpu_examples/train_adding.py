r"""Trains an LSTM through tf_recurrent on the adding problem.

The adding problem (Hochreiter & Schmidhuber, 1997): each example is a
sequence of T pairs (value in [0, 1), marker in {0, 1}); exactly two markers
are 1 and the target is the sum of the two marked values. Predicting the
mean of the target gives a mean squared error of about 0.167; a model that
has learned to carry the marked values across the sequence gets far below.

Example:

    python -m tpu_examples.train_adding --seq_len=100 --steps=2500
"""

import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from tf_recurrent import cells
import tf_recurrent

FLAGS = flags.FLAGS
flags.DEFINE_integer("seq_len", 100, "Sequence length T.")
flags.DEFINE_integer("hidden", 64, "LSTM units.")
flags.DEFINE_integer("batch", 64, "Batch size.")
flags.DEFINE_integer("steps", 2500, "Training steps.")
flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate.")
flags.DEFINE_integer("log_every", 100, "Steps between progress lines.")
flags.DEFINE_integer("seed", 0, "Random seed.")
flags.DEFINE_bool("jit_compile", True, "Compile the train step with XLA.")


def adding_batch(rng: np.random.Generator, batch: int, seq_len: int):
  """A batch of adding-problem sequences, time-major: x [T, B, 2], y [B, 1]."""
  values = rng.uniform(size=[batch, seq_len]).astype(np.float32)
  markers = np.zeros([batch, seq_len], np.float32)
  half = max(seq_len // 2, 1)
  first = rng.integers(0, half, size=batch)
  second = rng.integers(half, seq_len, size=batch) if seq_len > 1 else first
  markers[np.arange(batch), first] = 1.0
  markers[np.arange(batch), second] = 1.0
  target = (values * markers).sum(axis=1, keepdims=True)
  x = np.stack([values, markers], axis=-1).transpose(1, 0, 2)
  return tf.constant(x), tf.constant(target)


class AddingModel(tf.Module):
  """LSTM over the sequence (tf_recurrent + the built-in cell), then a dense."""

  def __init__(self, hidden: int, seed: int):
    super().__init__()
    init = tf.keras.initializers.GlorotUniform(seed=seed)
    self.kernel = tf.Variable(init([2, 4 * hidden]), name="kernel")
    self.recurrent_kernel = tf.Variable(
        tf.keras.initializers.Orthogonal(seed=seed + 1)([hidden, 4 * hidden]),
        name="recurrent_kernel")
    forget_bias = np.zeros([4 * hidden], np.float32)
    forget_bias[hidden:2 * hidden] = 1.0
    self.bias = tf.Variable(forget_bias, name="bias")
    self.out_w = tf.Variable(init([hidden, 1]), name="out_w")
    self.out_b = tf.Variable(tf.zeros([1]), name="out_b")
    self.hidden = hidden

  def __call__(self, x):
    batch = tf.shape(x)[1]
    state0 = {"h": tf.zeros([batch, self.hidden]),
              "c": tf.zeros([batch, self.hidden])}
    _, final = tf_recurrent.recurrent(
        {"recurrent_kernel": self.recurrent_kernel}, state0,
        cells.project_inputs(x, self.kernel, self.bias),
        cells.lstm_step, cells.lstm_grad)
    return tf.matmul(final["h"], self.out_w) + self.out_b


def main(argv):
  del argv
  rng = np.random.default_rng(FLAGS.seed)
  model = AddingModel(FLAGS.hidden, FLAGS.seed)
  optimizer = tf.keras.optimizers.Adam(FLAGS.learning_rate, clipnorm=1.0)

  @tf.function(jit_compile=FLAGS.jit_compile)
  def train_step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  @tf.function(jit_compile=FLAGS.jit_compile)
  def eval_step(x, y):
    return tf.reduce_mean(tf.square(model(x) - y))

  test_x, test_y = adding_batch(np.random.default_rng(12345), 1000,
                                FLAGS.seq_len)
  print(f"adding problem: T={FLAGS.seq_len}, hidden={FLAGS.hidden}, "
        f"batch={FLAGS.batch}; predicting the mean gives MSE "
        f"{float(tf.math.reduce_variance(test_y)):.3f}")
  start, window_start, window_losses = time.time(), time.time(), []
  for step in range(1, FLAGS.steps + 1):
    window_losses.append(float(train_step(*adding_batch(
        rng, FLAGS.batch, FLAGS.seq_len))))
    if step % FLAGS.log_every == 0 or step == FLAGS.steps:
      rate = len(window_losses) / (time.time() - window_start)
      print(f"step {step:5d}  train_mse {np.mean(window_losses):.4f}  "
            f"test_mse {float(eval_step(test_x, test_y)):.4f}  "
            f"{rate:.1f} steps/s", flush=True)
      window_start, window_losses = time.time(), []
  test_mse = float(eval_step(test_x, test_y))
  print(f"final test_mse {test_mse:.4f} after {FLAGS.steps} steps in "
        f"{time.time() - start:.0f} s")


if __name__ == "__main__":
  app.run(main)
