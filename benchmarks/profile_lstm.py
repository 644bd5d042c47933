r"""Where a tf_recurrent.LSTM training step's time goes: a cost breakdown.

Times, side by side in one run and per time step, the pieces a training
step of `tf_recurrent.LSTM` (B=32, D=128, H=256) is made of
(`tf_recurrent/sequence.py`):

* the whole step, and its forward pass alone;
* the two GEMMs per step that depend on the previous step (`h @ U` forward,
  `dz @ U^T` backward), step by step in a bare `tf.while_loop`: the floor a
  recurrence can reach; and the same with `dz @ U^T` as a transposing matmul
  inside the loop (what the pre-transposed U^T saves);
* the four GEMMs that do not (`x @ W`, `x^T dz`, `h^T dz`, `dz @ W^T`), in
  chunks of `sequence.CHUNK` steps as the layer runs them;
* all six GEMMs batched over all T (bench_lstm's compute floor, which no
  recurrence can reach);
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
  from tf_recurrent.chunked import sequence  # pylint: disable=g-import-not-at-top

  rng = tf.random.Generator.from_seed(0)
  x = rng.normal([B, T, D])
  layer = tf_recurrent.LSTM(H, return_sequences=True)
  layer.build((B, T, D))
  lean = tf_recurrent.LSTM(H, return_sequences=True, recompute=True)
  lean.build((B, T, D))
  lean.set_weights(layer.get_weights())
  kernel, recurrent_kernel, _ = layer.trainable_weights
  zeros = tf.zeros([B, H])
  dz = rng.normal([B, 4 * H])
  chunk = min(sequence.CHUNK, T)
  chunks = -(-T // chunk)
  x_rows = rng.normal([chunk * B, D])
  h_rows = rng.normal([chunk * B, H])
  dz_rows = rng.normal([chunk * B, 4 * H])

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

  def stepwise_matmuls(pretransposed):
    def run():
      u = tf.convert_to_tensor(recurrent_kernel)
      u_t = tf.transpose(u)
      def body(t, h, dh):
        z = tf.matmul(h, u)
        dh = (tf.matmul(dz, u_t) if pretransposed else
              tf.matmul(dz, u, transpose_b=True)) + dh * 0.5
        return t + 1, tf.tanh(z[:, :H]), dh
      _, h, dh = tf.while_loop(lambda t, *_: t < T, body,
                               (0, zeros, zeros))
      return h[0, 0] + dh[0, 0]
    return run

  def chunked_matmuls():
    w_t = tf.transpose(kernel)
    def body(c, dk, dw, dx):
      # Scaled by the chunk index, so XLA cannot hoist the GEMMs out of
      # the loop as loop-invariant.
      dzs = dz_rows * tf.cast(c + 1, dz_rows.dtype)
      return (c + 1, dk + tf.matmul(h_rows, dzs, transpose_a=True),
              dw + tf.matmul(x_rows, dzs, transpose_a=True),
              dx + tf.matmul(dzs, w_t) +
              tf.matmul(x_rows + dx, kernel)[:, :D])
    _, dk, dw, dx = tf.while_loop(
        lambda c, *_: c < chunks, body,
        (0, tf.zeros_like(recurrent_kernel), tf.zeros_like(kernel),
         tf.zeros_like(x_rows)))
    return dk[0, 0] + dw[0, 0] + dx[0, 0]

  def batched_matmuls():
    xs = tf.reshape(x, [T * B, D])
    h = tf.reshape(tf.tile(zeros, [T, 1]), [T * B, H]) + 0.5
    dzs = tf.tile(dz, [T, 1])
    products = [tf.matmul(xs, kernel), tf.matmul(h, recurrent_kernel),
                tf.matmul(xs, dzs, transpose_a=True),
                tf.matmul(dzs, kernel, transpose_b=True),
                tf.matmul(h, dzs, transpose_a=True),
                tf.matmul(dzs, recurrent_kernel, transpose_b=True)]
    return tf.add_n([p[0, 0] for p in products])

  return {
      "tf_recurrent.LSTM, whole training step": compiled(
          training_step(layer)),
      "  its forward pass alone": compiled(forward_only),
      "  the 2 sequential GEMMs per step (h @ U, dz @ U^T), in a while loop":
          compiled(stepwise_matmuls(pretransposed=True)),
      "  the same with dz @ U^T as matmul(transpose_b=True) in the loop":
          compiled(stepwise_matmuls(pretransposed=False)),
      f"  the 4 other GEMMs, in chunks of {chunk} steps": compiled(
          chunked_matmuls),
      "  all 6 GEMMs batched over T (compute floor)": compiled(
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
