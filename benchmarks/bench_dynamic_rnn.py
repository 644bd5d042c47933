r"""dynamic_rnn training step: tf_recurrent.dynamic_rnn against its peers.

One training step (forward over T steps, a loss over every step's output,
the gradients of all weights) of the same LSTM, `keras.layers.LSTMCell(H)`:

* `tf_recurrent.dynamic_rnn(cell, x, dtype=tf.float32)`;
* `keras.layers.RNN(cell, return_sequences=True)`;
* `tf.compat.v1.nn.dynamic_rnn(cell, x, initial_state=...)` (the Keras 3
  cell runs there only with its initial state given; TF's own legacy
  `LSTMCell` needs `TF_USE_LEGACY_KERAS=1` and tf-keras, which would put it
  in another process and out of the interleaving).

With and without XLA. Reported:

* time: per length, the steps of all implementations run in turn, round
  after round (interleaved, so a busy machine slows all of them alike), and
  the median per implementation, in microseconds per time step;
* memory: the peak RSS of one step at two lengths, each in its own
  subprocess; the slope between them is what each extra step costs, also as
  a multiple of the state's own bytes per step (h and c: 2 * B * H * 4).

Usage:

    python -m benchmarks.bench_dynamic_rnn             # full run (~30 min)
    python -m benchmarks.bench_dynamic_rnn --lengths=6,12 --batch=2 \
        --input=3 --hidden=4 --memory_lengths=6,12 --rounds=1 --out_dir=/tmp/b

Writes DYNAMIC_RNN.md and dynamic_rnn.json into --out_dir.
"""

import os
from typing import Callable, Dict, List

from absl import app
from absl import flags

from benchmarks.common import environment
from benchmarks.common import interleaved_medians
from benchmarks.common import peak_rss_slope
from benchmarks.common import run_child
from benchmarks.common import training_step
from benchmarks.common import write_results

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["250", "500", "1000", "2000"], "Lengths T.")
flags.DEFINE_list("memory_lengths", ["250", "1000"],
                  "Two lengths for the memory slope.")
flags.DEFINE_integer("batch", 32, "Batch size B.")
flags.DEFINE_integer("input", 128, "Input features D.")
flags.DEFINE_integer("hidden", 256, "LSTM units H.")
flags.DEFINE_integer("rounds", 5, "Interleaved timed rounds (median kept).")
flags.DEFINE_list("only", [], "Run only these implementations.")
flags.DEFINE_list("modes", ["tf", "xla"], "TF executor, XLA, or both.")
flags.DEFINE_string("out_dir", os.path.dirname(os.path.abspath(__file__)),
                    "Where to write the results.")
flags.DEFINE_string("child", "", "Internal: measure one case and exit.")

OURS = "tf_recurrent.dynamic_rnn(LSTMCell)"
KERAS = "keras.layers.RNN(LSTMCell)"
COMPAT = "tf.compat.v1.nn.dynamic_rnn(LSTMCell)"
IMPLS = [OURS, KERAS, COMPAT]


def build_step(name: str, steps: int, jit: bool) -> Callable[[], object]:
  """One training step of `name` over `steps` steps, as a callable."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top

  batch, hidden = FLAGS.batch, FLAGS.hidden
  cell = keras.layers.LSTMCell(hidden)
  cell.build((batch, FLAGS.input))
  x = tf.random.stateless_normal((batch, steps, FLAGS.input), seed=[1, 2])
  if name == KERAS:
    layer = keras.layers.RNN(cell, return_sequences=True)

  def outputs():
    if name == OURS:
      return tf_recurrent.dynamic_rnn(cell, x, dtype=tf.float32)[0]
    if name == COMPAT:
      state0 = cell.get_initial_state(batch_size=batch)
      return tf.compat.v1.nn.dynamic_rnn(cell, x, initial_state=state0)[0]
    return layer(x)

  return training_step(outputs, cell.trainable_weights, jit)


def memory_slope(name: str, jit: bool) -> Dict[str, object]:
  return peak_rss_slope(
      "benchmarks.bench_dynamic_rnn", name, jit,
      [int(t) for t in FLAGS.memory_lengths],
      [f"--batch={FLAGS.batch}", f"--input={FLAGS.input}",
       f"--hidden={FLAGS.hidden}"], 2 * FLAGS.batch * FLAGS.hidden * 4)


def report(results: dict) -> List[str]:
  """DYNAMIC_RNN.md: the table, then ours against each peer per mode."""
  env, lengths, rows = (results["environment"], results["lengths"],
                        results["rows"])

  def fmt(value, pattern="{:.0f}"):
    return "failed" if value is None else pattern.format(value)

  lines = [
      "# dynamic_rnn training step: tf_recurrent vs Keras and tf.compat.v1",
      "", f"One run of `python -m benchmarks.bench_dynamic_rnn` on "
      f"{env['cpu']}, TensorFlow {env['tensorflow']}. "
      f"`keras.layers.LSTMCell({FLAGS.hidden})`, B={FLAGS.batch}, "
      f"D={FLAGS.input}, float32; a training step (forward, loss over every "
      "step's output, gradients of all weights). Time: median of "
      f"{FLAGS.rounds} interleaved rounds, microseconds per step. Memory: "
      "slope of the peak RSS between T=" +
      " and T=".join(FLAGS.memory_lengths) + ", per step.", "",
      "| implementation | mode | " + " | ".join(f"T={t}" for t in lengths) +
      " | bytes per extra step | x state bytes |",
      "|---|---|" + "---|" * (len(lengths) + 2)]
  for r in rows:
    lines.append(
        f"| {r['name']} | {'XLA' if r['xla'] else 'TF'} | " +
        " | ".join(fmt(r["us_per_step"].get(str(t))) for t in lengths) +
        f" | {fmt(r['memory']['bytes_per_step'])} | "
        f"{fmt(r['memory']['vs_state'], '{:.2f}x')} |")
  lines += ["", "## Ratios (tf_recurrent.dynamic_rnn / peer, same mode)", ""]
  for xla in (False, True):
    ours = next((r for r in rows if r["name"] == OURS and r["xla"] == xla),
                None)
    for peer in rows:
      if ours is None or peer["name"] == OURS or peer["xla"] != xla:
        continue
      times = [f"T={t}: {ours['us_per_step'][str(t)] / peer['us_per_step'][str(t)]:.2f}x"
               for t in lengths]
      lines.append(f"- {'XLA' if xla else 'TF'}, vs {peer['name']}: time "
                   f"{', '.join(times)}.")
  return lines


def main(argv):
  del argv
  if FLAGS.child:
    run_child(build_step, FLAGS.child)
    return
  names = [n for n in IMPLS if not FLAGS.only or n in FLAGS.only]
  lengths = [int(t) for t in FLAGS.lengths]
  results = {"environment": environment(), "lengths": lengths, "rows": []}
  for jit in [mode == "xla" for mode in FLAGS.modes]:
    times = {name: {} for name in names}
    for steps in lengths:
      medians = interleaved_medians(
          {name: build_step(name, steps, jit) for name in names},
          FLAGS.rounds)
      for name, seconds in medians.items():
        times[name][str(steps)] = seconds / steps * 1e6
        print(f"  {name:40s} {'xla' if jit else 'tf ':3s} T={steps:5d} "
              f"{times[name][str(steps)]:10.1f} us/step", flush=True)
    for name in names:
      memory = memory_slope(name, jit)
      print(f"  {name:40s} {'xla' if jit else 'tf ':3s} memory "
            f"{memory['vs_state']} x state", flush=True)
      results["rows"].append({"name": name, "xla": jit,
                              "us_per_step": times[name], "memory": memory})
  write_results(FLAGS.out_dir, "dynamic_rnn", results, report(results))


if __name__ == "__main__":
  app.run(main)
