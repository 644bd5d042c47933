r"""ConvLSTM2D training step: tf_recurrent.ConvLSTM2D against Keras's.

A ConvLSTM's per-frame activations (four gate maps) are the largest of any
Keras recurrent layer, so a backward pass that keeps only the state per
frame matters most here. One training step (forward over T frames, a loss
over every frame's output, the gradients of all weights) of
`tf_recurrent.ConvLSTM2D` and `keras.layers.ConvLSTM2D` with the same
arguments, with and without XLA:

* time: best of several repetitions after a warm-up, per frame;
* memory: the peak RSS of one step at two lengths, each in its own
  subprocess; the slope between them is what each extra frame costs, also
  as a multiple of the state's own bytes per frame (h and c:
  2 * B * side * side * filters * 4).

Usage:

    python -m benchmarks.bench_convlstm                   # full run (~10 min)
    python -m benchmarks.bench_convlstm --lengths=4,8 --memory_lengths=4,8 \
        --side=8 --filters=2 --channels=2 --batch=1 --out_dir=/tmp/b

Writes CONVLSTM.md and convlstm.json into --out_dir.
"""

import json
import os
from typing import Callable, Dict, List

from absl import app
from absl import flags

from benchmarks.common import best_seconds
from benchmarks.common import environment
from benchmarks.common import peak_rss_slope
from benchmarks.common import run_child

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["32", "64", "128", "256"], "Frames T (time).")
flags.DEFINE_list("memory_lengths", ["64", "256"],
                  "Two lengths for the memory slope.")
flags.DEFINE_integer("batch", 4, "Batch size B.")
flags.DEFINE_integer("side", 32, "Frame height and width.")
flags.DEFINE_integer("channels", 8, "Input channels per frame.")
flags.DEFINE_integer("filters", 16, "ConvLSTM filters.")
flags.DEFINE_integer("repeats", 3, "Timed repetitions (best is kept).")
flags.DEFINE_string("out_dir", os.path.dirname(os.path.abspath(__file__)),
                    "Where to write the results.")
flags.DEFINE_string("child", "", "Internal: measure one case and exit.")

OURS = "tf_recurrent.ConvLSTM2D"
KERAS = "keras.layers.ConvLSTM2D"


def build_step(name: str, frames: int, jit: bool) -> Callable[[], object]:
  """One training step of `name` over `frames` frames, as a callable."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top

  layer_cls = tf_recurrent.ConvLSTM2D if name == OURS else (
      keras.layers.ConvLSTM2D)
  layer = layer_cls(FLAGS.filters, 3, padding="same", return_sequences=True)
  shape = (FLAGS.batch, frames, FLAGS.side, FLAGS.side, FLAGS.channels)
  layer.build(shape)
  x = tf.random.stateless_normal(shape, seed=[1, 2])

  @tf.function(jit_compile=jit)
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(layer(x)))
    return tape.gradient(loss, layer.trainable_weights)

  return lambda: [g.numpy() for g in step()]


def memory_slope(name: str, jit: bool) -> Dict[str, object]:
  return peak_rss_slope(
      "benchmarks.bench_convlstm", name, jit,
      [int(t) for t in FLAGS.memory_lengths],
      [f"--batch={FLAGS.batch}", f"--side={FLAGS.side}",
       f"--channels={FLAGS.channels}", f"--filters={FLAGS.filters}"],
      2 * FLAGS.batch * FLAGS.side * FLAGS.side * FLAGS.filters * 4,
      per="frame")


def report(results: dict) -> List[str]:
  env, lengths = results["environment"], results["lengths"]
  rows = results["rows"]

  def row(name, xla):
    return next(r for r in rows if r["name"] == name and r["xla"] == xla)

  def fmt(value, pattern="{:.0f}"):
    return "failed" if value is None else pattern.format(value)

  lines = [
      "# ConvLSTM2D training step: tf_recurrent vs Keras", "",
      f"One run of `python -m benchmarks.bench_convlstm` on {env['cpu']}, "
      f"TensorFlow {env['tensorflow']}. B={FLAGS.batch}, frames "
      f"{FLAGS.side}x{FLAGS.side}x{FLAGS.channels}, {FLAGS.filters} filters, "
      "3x3 kernel, padding same, float32; a training step (forward, loss "
      "over every frame's output, gradients of all weights). Time: best of "
      f"{FLAGS.repeats} after a warm-up, microseconds per frame.", "",
      "| implementation | mode | " + " | ".join(f"T={t}" for t in lengths) +
      " | bytes per extra frame | x state bytes |",
      "|---|---|" + "---|" * (len(lengths) + 2)]
  for r in rows:
    lines.append(
        f"| {r['name']} | {'XLA' if r['xla'] else 'TF'} | " +
        " | ".join(fmt(r["us_per_frame"][str(t)]) for t in lengths) +
        f" | {fmt(r['memory']['bytes_per_frame'])} | "
        f"{fmt(r['memory']['vs_state'], '{:.2f}x')} |")
  lines += [
      "", "Per frame, Keras's loop keeps every intermediate of the cell for "
      "its gradient (the gate maps and the convolutions feeding them); "
      "tf_recurrent keeps the state (h, c) and the output and recomputes "
      "each frame's cell in the backward pass: one more forward per frame, "
      "which is the extra time. The slopes also hold the frame's input and "
      "its gradient.", "", "## Ratios (tf_recurrent / Keras, same mode)",
      ""]
  for xla in (False, True):
    ours, keras_row = row(OURS, xla), row(KERAS, xla)
    times = [f"T={t}: {ours['us_per_frame'][str(t)] / keras_row['us_per_frame'][str(t)]:.2f}x"
             for t in lengths]
    a, b = ours["memory"]["vs_state"], keras_row["memory"]["vs_state"]
    memory = ("failed" if a is None or b is None else
              f"{a:.2f}x vs {b:.2f}x the state per frame ({a / b:.2f}x Keras's)")
    lines.append(f"- {'XLA' if xla else 'TF executor'}: time {', '.join(times)}; "
                 f"memory {memory}.")
  return lines


def main(argv):
  del argv
  if FLAGS.child:
    run_child(build_step, FLAGS.child)
    return
  lengths = [int(t) for t in FLAGS.lengths]
  results = {"environment": environment(), "lengths": lengths, "rows": []}
  for name in (OURS, KERAS):
    for jit in (False, True):
      times = {}
      for frames in lengths:
        seconds = best_seconds(build_step(name, frames, jit), FLAGS.repeats)
        times[str(frames)] = seconds / frames * 1e6
        print(f"  {name:26s} {'xla' if jit else 'tf ':3s} T={frames:4d} "
              f"{times[str(frames)]:10.1f} us/frame", flush=True)
      memory = memory_slope(name, jit)
      print(f"  {name:26s} {'xla' if jit else 'tf ':3s} memory "
            f"{memory['vs_state']} x state", flush=True)
      results["rows"].append({"name": name, "xla": jit, "us_per_frame": times,
                              "memory": memory})
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "convlstm.json"), "w") as f:
    json.dump(results, f, indent=1)
  with open(os.path.join(FLAGS.out_dir, "CONVLSTM.md"), "w") as f:
    f.write("\n".join(report(results)) + "\n")


if __name__ == "__main__":
  app.run(main)
