r"""Where a tf_recurrent.LSTM training step's time goes: a cost breakdown.

Times, side by side in one run and per time step, the pieces a training
step of `tf_recurrent.LSTM` (B=32, D=128, H=256) is made of:

* the whole step, and its forward pass alone;
* the op's loop machinery alone: the same op with a trivial cell (h + x),
  forward and backward;
* the hoisted input projection `x @ W + b` with its gradient;
* the three recurrent matmuls per step (forward, and the two of the
  backward) run step by step in a bare `tf.while_loop`: the floor a
  recurrence can reach, since step t needs step t-1;
* the same three matmuls batched over all T (bench_lstm's compute floor,
  which no recurrence can reach);
* for comparison, the whole step of `tf_recurrent.LSTM(recompute=True)`.

Usage:

    python -m benchmarks.profile_lstm            # writes PROFILE.md
    python -m benchmarks.profile_lstm --length=20 --batch=2 --input=4 \
        --hidden=8 --out_dir=/tmp/p
"""

import os
from typing import Callable, Dict

from absl import app
from absl import flags

from benchmarks.common import best_seconds
from benchmarks.common import environment

FLAGS = flags.FLAGS
flags.DEFINE_integer("length", 250, "Sequence length T.")
flags.DEFINE_integer("batch", 32, "Batch size B.")
flags.DEFINE_integer("input", 128, "Input features D.")
flags.DEFINE_integer("hidden", 256, "LSTM units H.")
flags.DEFINE_integer("repeats", 5, "Timed repetitions (best is kept).")
flags.DEFINE_string("out_dir", os.path.dirname(os.path.abspath(__file__)),
                    "Where to write PROFILE.md.")


def pieces(T: int, B: int, D: int, H: int,
           jit: bool) -> Dict[str, Callable[[], object]]:
  """Zero-argument callables, one per piece, each compiled as `jit` says."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top
  from tf_recurrent import cells  # pylint: disable=g-import-not-at-top

  rng = tf.random.Generator.from_seed(0)
  x = rng.normal([B, T, D])
  layer = tf_recurrent.LSTM(H, return_sequences=True)
  layer.build((B, T, D))
  lean = tf_recurrent.LSTM(H, return_sequences=True, recompute=True)
  lean.build((B, T, D))
  lean.set_weights(layer.get_weights())
  kernel, recurrent_kernel, bias = layer.trainable_weights
  time_major = tf.transpose(x, [1, 0, 2])
  zeros = tf.zeros([B, H])
  dz = rng.normal([B, 4 * H])

  def compiled(fn):
    fn = tf.function(fn, jit_compile=jit)
    return lambda: tf.nest.map_structure(lambda t: t.numpy(), fn())

  def training_step(rnn):
    def whole_step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(rnn(x)))
      return tape.gradient(loss, rnn.trainable_weights)
    return whole_step

  def forward_only():
    return tf.reduce_mean(tf.square(layer(x)))

  def trivial_op():
    projected = tf.tile(time_major[:, :, :1], [1, 1, H])
    with tf.GradientTape() as tape:
      tape.watch(projected)
      acc, _ = tf_recurrent.recurrent(
          {}, {"h": zeros, "c": zeros}, projected,
          lambda theta, s, x_t: ({"h": s["h"] + x_t, "c": s["c"]}, []))
      loss = tf.reduce_mean(tf.square(acc["h"]))
    return tape.gradient(loss, projected)

  def projection():
    with tf.GradientTape() as tape:
      projected = cells.project_inputs(time_major, kernel, bias)
      loss = tf.reduce_mean(tf.square(projected))
    return tape.gradient(loss, [kernel, bias])

  def stepwise_matmuls():
    def body(t, h, dk):
      z = tf.matmul(h, recurrent_kernel)
      dk += tf.matmul(h, dz, transpose_a=True)
      dh = tf.matmul(dz, recurrent_kernel, transpose_b=True)
      return t + 1, tf.tanh(z[:, :H] + dh), dk
    _, h, dk = tf.while_loop(
        lambda t, *_: t < T, body,
        (0, zeros, tf.zeros_like(recurrent_kernel)))
    return h[0, 0] + dk[0, 0]

  def batched_matmuls():
    h = tf.reshape(tf.tile(zeros, [T, 1]), [T * B, H]) + 0.5
    dzs = tf.tile(dz, [T, 1])
    z = tf.matmul(h, recurrent_kernel)
    dk = tf.matmul(h, dzs, transpose_a=True)
    dh = tf.matmul(dzs, recurrent_kernel, transpose_b=True)
    return z[0, 0] + dk[0, 0] + dh[0, 0]

  return {
      "tf_recurrent.LSTM, whole training step": compiled(
          training_step(layer)),
      "  its forward pass alone": compiled(forward_only),
      "  the op's loops with a trivial cell (fwd + bwd)": compiled(trivial_op),
      "  the hoisted input projection (fwd + bwd)": compiled(projection),
      "  3 recurrent matmuls per step, in a while loop": compiled(
          stepwise_matmuls),
      "  3 recurrent matmuls batched over T (compute floor)": compiled(
          batched_matmuls),
      "tf_recurrent.LSTM(recompute=True), whole training step (for "
      "comparison)": compiled(training_step(lean)),
  }


def main(argv):
  del argv
  T = FLAGS.length
  env = environment()
  rows = {}
  for jit in (False, True):
    for name, fn in pieces(T, FLAGS.batch, FLAGS.input, FLAGS.hidden,
                           jit).items():
      rows.setdefault(name, {})[jit] = best_seconds(fn, FLAGS.repeats) / T * 1e6
      print(f"{'xla' if jit else 'tf '} {name:55s} {rows[name][jit]:8.1f} "
            "us/step", flush=True)
  whole = "tf_recurrent.LSTM, whole training step"
  lines = [
      "# Where the time of a tf_recurrent.LSTM training step goes",
      "",
      "Generated by `python -m benchmarks.profile_lstm`: each piece timed "
      f"alone, best of {FLAGS.repeats}, at T={T}, B={FLAGS.batch}, "
      f"D={FLAGS.input}, H={FLAGS.hidden}, float32. TensorFlow "
      f"{env['tensorflow']}; {env['cpu']}. Indented rows are parts of the "
      "first; the share is of the whole step in the same mode.",
      "",
      "| piece | TF us/step | share | XLA us/step | share |",
      "|---|---:|---:|---:|---:|",
  ]
  for name, by_mode in rows.items():
    lines.append(
        f"| {name.strip()} | {by_mode[False]:.0f} | "
        f"{by_mode[False] / rows[whole][False]:.0%} | {by_mode[True]:.0f} | "
        f"{by_mode[True] / rows[whole][True]:.0%} |")
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "PROFILE.md"), "w") as f:
    f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)
