r"""ConvLSTM training step: tf_recurrent.ConvLSTM{1,2,3}D against Keras's.

One training step (forward over T frames, a loss over every frame's output,
the gradients of all weights) of `tf_recurrent.ConvLSTM<r>D` and
`keras.layers.ConvLSTM<r>D` with the same arguments (padding "same", kernel
3, return_sequences), without XLA (Keras 3's default `compile()` for these
models) and with it:

* time: per (rank, mode, T) both layers are warmed up, then timed
  interleaved (ours, Keras, Keras, ours, ...) for --repeats rounds; the
  median per layer in microseconds per frame, and the ratio Keras / ours
  (above 1: ours is faster), both from the same run;
* memory: the peak RSS of one step at two lengths, each in its own
  process; the slope between them is what each extra frame costs, also as
  a multiple of the state's own bytes per frame (h and c).

Issue #30's targets, printed beside each row: without XLA ours >= 1.5x
Keras's speed, with XLA >= 1.2x; memory slope <= 3x the state per frame.

Frames per rank (B, spatial, channels -> filters): 1D B=8, 256 x 16 -> 32;
2D B=4, 32x32x8 -> 16; 3D B=2, 12x12x12x4 -> 8.

Usage:

    python -m benchmarks.bench_convlstm                      # full run
    python -m benchmarks.bench_convlstm --ranks=2 --lengths=4 \
        --memory_lengths=4,8 --scale=8 --out_dir=/tmp/b      # a smoke run

Writes CONVLSTM.md and convlstm.json into --out_dir.
"""

import os
from typing import Callable, Dict, List

from absl import app
from absl import flags

from benchmarks.common import environment
from benchmarks.common import interleaved_medians
from benchmarks.common import peak_rss_slope
from benchmarks.common import run_child
from benchmarks.common import write_results

FLAGS = flags.FLAGS
flags.DEFINE_list("ranks", ["1", "2", "3"], "Spatial ranks to run.")
flags.DEFINE_list("lengths", ["32", "128"], "Frames T (time) timed.")
flags.DEFINE_list("modes", ["tf", "xla"], "tf (no XLA) and/or xla.")
# Both past one chunk (sequence.CHUNK = 50 frames): a call of one chunk runs
# without the chunk loop, longer ones hold two chunks' temporaries at once
# (two in flight), a fixed cost a slope from T=50 would count per frame.
flags.DEFINE_list("memory_lengths", ["100", "300"],
                  "Two lengths for the memory slope (empty: no memory).")
flags.DEFINE_list("memory_impls", ["keras", "ours", "ours_recompute"],
                  "Whose memory slopes to measure (the others' columns "
                  "show -).")
flags.DEFINE_integer("memory_repeats", 1,
                     "Processes per memory point (median kept).")
flags.DEFINE_integer("repeats", 7, "Timed rounds per layer (median kept).")
flags.DEFINE_integer("scale", 1, "Divide every frame side by this (smoke).")
flags.DEFINE_string("out_dir", os.path.dirname(os.path.abspath(__file__)),
                    "Where to write the results.")
flags.DEFINE_string("child", "", "Internal: measure one case and exit.")

# rank: (batch, frame side, channels, filters).
SHAPES = {1: (8, 256, 16, 32), 2: (4, 32, 8, 16), 3: (2, 12, 4, 8)}
TARGETS = {"tf": 1.5, "xla": 1.2}
MEMORY_TARGET = 3.0
# Memory rows: Keras, ours as built (kept gate maps) and ours with
# `recompute=True` (nothing kept per frame but the outputs).
MEMORY_IMPLS = ("keras", "ours", "ours_recompute")
# A memory column --memory_impls leaves out.
_UNMEASURED = object()


def shape_of(rank: int):
  batch, side, channels, filters = SHAPES[rank]
  return batch, max(side // FLAGS.scale, 3), channels, filters


def state_bytes(rank: int) -> int:
  """h and c of one frame, float32."""
  batch, side, _, filters = shape_of(rank)
  return 2 * batch * side ** rank * filters * 4


def build_step(name: str, frames: int, jit: bool) -> Callable[[], object]:
  """One training step of `name`: "ours:<rank>", "ours_recompute:<rank>"
  (`recompute=True`: only the outputs kept per frame) or "keras:<rank>"."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top

  impl, rank = name.split(":")
  rank = int(rank)
  batch, side, channels, filters = shape_of(rank)
  module = keras.layers if impl == "keras" else tf_recurrent
  options = {"recompute": True} if impl == "ours_recompute" else {}
  layer = getattr(module, f"ConvLSTM{rank}D")(
      filters, 3, padding="same", return_sequences=True, **options)
  shape = (batch, frames) + (side,) * rank + (channels,)
  layer.build(shape)
  x = tf.random.stateless_normal(shape, seed=[1, 2])

  @tf.function(jit_compile=jit)
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(layer(x)))
    return tape.gradient(loss, layer.trainable_weights)

  return lambda: [g.numpy() for g in step()]


def memory_slope(name: str, jit: bool) -> Dict[str, object]:
  rank = int(name.split(":")[1])
  return peak_rss_slope(
      "benchmarks.bench_convlstm", name, jit,
      [int(t) for t in FLAGS.memory_lengths], [f"--scale={FLAGS.scale}"],
      state_bytes(rank), per="frame", repeats=FLAGS.memory_repeats)


def _met(ratio, target) -> str:
  return "failed" if ratio is None else ("met" if ratio >= target
                                         else "missed")


def report(results: dict) -> List[str]:
  env = results["environment"]
  lines = [
      "# ConvLSTM training step: tf_recurrent vs Keras", "",
      f"One run of `python -m benchmarks.bench_convlstm` on {env['cpu']}, "
      f"TensorFlow {env['tensorflow']}, Keras {env.get('keras', '?')}. "
      "Padding same, 3-wide kernels, return_sequences, float32; a training "
      "step (forward, loss over every frame's output, gradients of all "
      f"weights). Time: medians of {FLAGS.repeats} interleaved rounds, "
      "microseconds per frame; ratio Keras / ours (above 1: ours is "
      "faster). Targets (issue #30): >= 1.5x without XLA, >= 1.2x with XLA; "
      "memory <= 3x the state (h and c) per frame.", "",
      "| layer | B, frame -> filters | mode | T | Keras us/frame | "
      "ours us/frame | Keras/ours | target |",
      "|---|---|---|---|---|---|---|---|"]
  for row in results["time"]:
    batch, side, channels, filters = row["shape"]
    frame = "x".join([str(side)] * row["rank"])
    lines.append(
        f"| ConvLSTM{row['rank']}D | {batch}, {frame}x{channels} -> "
        f"{filters} | {'XLA' if row['mode'] == 'xla' else 'no XLA'} | "
        f"{row['frames']} | {row['keras']:.0f} | {row['ours']:.0f} | "
        f"{row['ratio']:.2f}x | {_met(row['ratio'], TARGETS[row['mode']])} |")
  if results["memory"]:
    lines += ["", "Memory: peak RSS slope per extra frame between two "
              "lengths, as a multiple of the state's bytes per frame (each "
              "point a fresh process, or the median of several; the slope "
              "also holds the frame's input, the outputs and their gradient "
              "and, for Keras, every intermediate of its cell). Ours: as "
              "built (the gate maps kept per frame) and with "
              "`recompute=True`.", "",
              "| layer | mode | T | processes a point | Keras x state | ours "
              "x state | target | ours, recompute=True | target |",
              "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: ("-" if v is _UNMEASURED else "failed" if v is None
                     else f"{v:.2f}x")
    met = lambda v: ("-" if v is _UNMEASURED else "failed" if v is None else
                     "met" if v <= MEMORY_TARGET else "missed")
    for row in results["memory"]:
      keras, ours, recomputing = (
          row[impl]["vs_state"] if impl in row else _UNMEASURED
          for impl in MEMORY_IMPLS)
      lines.append(f"| ConvLSTM{row['rank']}D | "
                   f"{'XLA' if row['mode'] == 'xla' else 'no XLA'} | "
                   f"{' / '.join(str(t) for t in row['lengths'])} | "
                   f"{row['repeats']} | "
                   f"{fmt(keras)} | {fmt(ours)} | "
                   f"{met(ours)} | {fmt(recomputing)} | {met(recomputing)} |")
  return lines


def main(argv):
  del argv
  if FLAGS.child:
    run_child(build_step, FLAGS.child)
    return
  unknown = set(FLAGS.memory_impls) - set(MEMORY_IMPLS)
  if unknown:
    raise app.UsageError(f"--memory_impls: unknown {sorted(unknown)}; they "
                         f"are {list(MEMORY_IMPLS)}.")
  memory_impls = [i for i in MEMORY_IMPLS if i in FLAGS.memory_impls]
  results = {"environment": environment(), "time": [], "memory": []}
  for rank in (int(r) for r in FLAGS.ranks):
    for mode in FLAGS.modes:
      jit = mode == "xla"
      for frames in (int(t) for t in FLAGS.lengths):
        steps = {impl: build_step(f"{impl}:{rank}", frames, jit)
                 for impl in ("ours", "keras")}
        seconds = interleaved_medians(steps, FLAGS.repeats)
        row = {"rank": rank, "shape": shape_of(rank), "mode": mode,
               "frames": frames,
               **{k: s / frames * 1e6 for k, s in seconds.items()}}
        row["ratio"] = row["keras"] / row["ours"]
        results["time"].append(row)
        print(f"  ConvLSTM{rank}D {mode:3s} T={frames:4d} keras "
              f"{row['keras']:9.0f} ours {row['ours']:9.0f} us/frame "
              f"{row['ratio']:.2f}x", flush=True)
      if len(FLAGS.memory_lengths) == 2:
        memory = {impl: memory_slope(f"{impl}:{rank}", jit)
                  for impl in memory_impls}
        results["memory"].append({
            "rank": rank, "mode": mode, "repeats": FLAGS.memory_repeats,
            "lengths": [int(t) for t in FLAGS.memory_lengths], **memory})
        print(f"  ConvLSTM{rank}D {mode:3s} memory x state: " + ", ".join(
            f"{impl} {memory[impl]['vs_state']}" for impl in memory_impls),
              flush=True)
  write_results(FLAGS.out_dir, "convlstm", results, report(results))


if __name__ == "__main__":
  app.run(main)
