r"""Trains an LSTM through tf_recurrent on the adding problem.

The adding problem (Hochreiter & Schmidhuber, 1997): each example is a
sequence of T pairs (value in [0, 1), marker in {0, 1}); exactly two markers
are 1 and the target is the sum of the two marked values. Predicting the
mean of the target gives a mean squared error of about 0.167; a model that
has learned to carry the marked values across the sequence gets far below.

Runs under any strategy of `tpu_examples.strategy` (--strategy=tpu,
multi_worker, mirrored, default), several XLA-compiled steps per call, with
checkpoints and TensorBoard logs in --model_dir.

Example:

    python -m tpu_examples.train_adding --seq_len=100 --steps=2500
    python -m tpu_examples.train_adding --strategy=mirrored --model_dir=/tmp/a
"""

import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from tf_recurrent import cells
import tf_recurrent
from tpu_examples import strategy as strategy_lib

FLAGS = flags.FLAGS

TEST_SIZE = 1000


def adding_batch(seed: int, step, batch: int, seq_len: int):
  """Batch `step` of the adding problem, a stateless function of its index.

  Returns:
    `(x, y)`: batch-major x `[batch, seq_len, 2]` and y `[batch, 1]`.

  Example:

  >>> x, y = adding_batch(0, 3, batch=2, seq_len=10)
  >>> x.shape, y.shape, x[:, :, 1].numpy().sum(axis=1).tolist()
  (TensorShape([2, 10, 2]), TensorShape([2, 1]), [2.0, 2.0])
  """
  key = tf.stack([tf.cast(seed, tf.int64), tf.cast(step, tf.int64)])
  keys = tf.random.experimental.stateless_split(key, 3)
  values = tf.random.stateless_uniform([batch, seq_len], keys[0])
  half = max(seq_len // 2, 1)
  first = tf.random.stateless_uniform([batch], keys[1], 0, half, tf.int32)
  second = tf.random.stateless_uniform([batch], keys[2], min(half, seq_len - 1),
                                       seq_len, tf.int32)
  markers = tf.minimum(tf.one_hot(first, seq_len) + tf.one_hot(second, seq_len),
                       1.0)
  target = tf.reduce_sum(values * markers, axis=1, keepdims=True)
  return tf.stack([values, markers], axis=-1), target


class AddingModel(tf.Module):
  """LSTM over the sequence (tf_recurrent + the built-in cell), then a dense."""

  def __init__(self, hidden: int, seed: int, use_tpu: bool = False):
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
    self.use_tpu = use_tpu

  def __call__(self, x):
    """Predictions `[B, 1]` for batch-major `x` `[B, T, 2]`."""
    batch = tf.shape(x)[0]
    state0 = {"h": tf.zeros([batch, self.hidden]),
              "c": tf.zeros([batch, self.hidden])}
    time_major = tf.transpose(x, [1, 0, 2])
    _, final = tf_recurrent.recurrent(
        {"recurrent_kernel": self.recurrent_kernel}, state0,
        cells.project_inputs(time_major, self.kernel, self.bias),
        cells.lstm_step, cells.lstm_grad, use_tpu=self.use_tpu,
        accumulate_state=False)
    return tf.matmul(final["h"], self.out_w) + self.out_b


def build(strategy: tf.distribute.Strategy, hidden: int = 64, seed: int = 0,
          learning_rate: float = 3e-3, global_batch: int = 64,
          steps_per_call: int = 20, jit_compile: bool = True,
          use_tpu: bool = False):
  """The model, optimizer, step counter and trainer, under `strategy`.

  Args:
    strategy: The strategy to build under.
    hidden: LSTM units.
    seed: Initializer seed.
    learning_rate: Adam's learning rate.
    global_batch: Examples per step over all replicas.
    steps_per_call: Steps per `trainer.train` call.
    jit_compile: Compile the step with XLA.
    use_tpu: Build the op for XLA (implied under TPUStrategy).

  Returns:
    `(model, optimizer, step, trainer)`.
  """
  with strategy.scope():
    model = AddingModel(
        hidden, seed, use_tpu=use_tpu or strategy_lib.uses_tpu(strategy))
    optimizer = tf.keras.optimizers.Adam(learning_rate)
    step = tf.Variable(0, dtype=tf.int64, name="step")

  def per_example_loss(batch, training):
    del training
    x, y = batch
    return tf.reduce_mean(tf.square(model(x) - y), axis=-1)

  trainer = strategy_lib.Trainer(
      strategy, list(model.trainable_variables), per_example_loss, optimizer,
      global_batch, steps_per_call, jit_compile, clip_norm=1.0)
  return model, optimizer, step, trainer


def main(argv):
  del argv
  strategy = strategy_lib.strategy_from_flags()
  model, optimizer, step, trainer = build(
      strategy, FLAGS.hidden, FLAGS.seed, FLAGS.learning_rate, FLAGS.batch,
      FLAGS.steps_per_call, FLAGS.jit_compile)
  progress = strategy_lib.Progress(
      FLAGS.model_dir,
      tf.train.Checkpoint(model=model, optimizer=optimizer, step=step),
      step, FLAGS.checkpoint_every)
  batches = strategy_lib.distribute_steps(
      strategy, lambda i: adding_batch(FLAGS.seed, i, FLAGS.batch,
                                       FLAGS.seq_len),
      FLAGS.batch, first_step=progress.start_step)
  test_x, test_y = adding_batch(FLAGS.seed + 1, 0, TEST_SIZE, FLAGS.seq_len)
  evaluate = tf.function(lambda: tf.reduce_mean(tf.square(model(test_x) -
                                                          test_y)))
  print(f"adding problem: T={FLAGS.seq_len}, hidden={FLAGS.hidden}, "
        f"global batch {FLAGS.batch} over {strategy.num_replicas_in_sync} "
        f"replica(s), {FLAGS.steps_per_call} steps per call, "
        f"XLA {'on' if trainer.jit_compile else 'off'}; predicting the mean "
        f"gives MSE {float(tf.math.reduce_variance(test_y)):.3f}", flush=True)
  start = time.time()
  losses = []
  while int(step.numpy()) < FLAGS.steps:
    losses.append(float(trainer.train(batches)))
    step.assign_add(FLAGS.steps_per_call)
    done = int(step.numpy())
    if done % FLAGS.log_every < FLAGS.steps_per_call or done >= FLAGS.steps:
      progress.report({"train_mse": np.mean(losses),
                       "test_mse": float(evaluate())})
      losses = []
    progress.maybe_save(force=done >= FLAGS.steps)
  print(f"final test_mse {float(evaluate()):.4f} after {int(step.numpy())} "
        f"steps ({int(step.numpy()) - progress.start_step} in this run, "
        f"{time.time() - start:.0f} s)")


if __name__ == "__main__":
  strategy_lib.set_job_defaults(seq_len=100, hidden=64, batch=64, steps=2500,
                                learning_rate=3e-3, log_every=100)
  app.run(main)
