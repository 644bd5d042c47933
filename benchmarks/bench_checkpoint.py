r"""Memory per time step of a final-state-only LSTM, with checkpointing.

A sequence classifier needs only the final state, yet a training step's
backward pass keeps every step's state. `recurrent(..., accumulate_state=
False, checkpoint_every="sqrt")` keeps about 2 sqrt(T) states instead; this
measures what that saves and costs, for one training step (forward, a loss on
the final h, gradients of all weights) of the same LSTM as bench_lstm:

* memory: peak RSS at two lengths, each in its own subprocess, and the slope
  between them in bytes per extra step and as a multiple of the state's own
  bytes per step (2 * B * H * 4);
* time: best of several repetitions at one length, per step, and as a ratio
  to the plain op (which returns every state).

Usage:

    python -m benchmarks.bench_checkpoint          # full run (~25 min)
    python -m benchmarks.bench_checkpoint --batch=2 --input=4 --hidden=8 \
        --memory_lengths=20,80 --time_length=20 --out_dir=/tmp/b

Writes CHECKPOINT.md and checkpoint.json into --out_dir.
"""

import json
import os
from typing import Callable, Dict, List, Optional

from absl import app
from absl import flags

from benchmarks.common import best_seconds
from benchmarks.common import environment
from benchmarks.common import jax_lstm_step
from benchmarks.common import peak_rss_bytes
from benchmarks.common import peak_rss_of_children

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 32, "Batch size B.")
flags.DEFINE_integer("input", 128, "Input features D.")
flags.DEFINE_integer("hidden", 512, "LSTM units H.")
flags.DEFINE_list("memory_lengths", ["2500", "20000"],
                  "Two lengths for the memory slope.")
flags.DEFINE_integer("time_length", 1000, "Length T for the time column.")
flags.DEFINE_integer("repeats", 3, "Timed repetitions (best is kept).")
flags.DEFINE_string("out_dir", os.path.dirname(os.path.abspath(__file__)),
                    "Where to write the results.")
flags.DEFINE_multi_string("only", [], "Run only these cases (the plain op "
                          "always); repeat the flag for several.")
flags.DEFINE_multi_string("memory_only", [], "Measure the memory of only "
                          "these cases (the others show -); repeat the flag "
                          "for several. None given: every case.")
flags.DEFINE_string("child", "", "Internal: measure one case and exit.")

PLAIN = "recurrent, every state returned (plain op)"
CASES = {
    PLAIN: dict(accumulate_state=True),
    "recurrent, final only, checkpoint_every=1":
        dict(accumulate_state=False, checkpoint_every=1),
    "recurrent, final only, checkpoint_every=\"sqrt\"":
        dict(accumulate_state=False, checkpoint_every="sqrt"),
    "jax lax.scan, final only": dict(jax_checkpoint=False),
    "jax lax.scan + jax.checkpoint, final only": dict(jax_checkpoint=True),
}


def _tf_step(options, T: int, B: int, D: int, H: int):
  """One XLA-compiled training step of the op; returns a callable."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top

  rng = tf.random.Generator.from_seed(0)
  x = rng.normal([T, B, D])
  weights = [tf.Variable(rng.normal([D, 4 * H]) * 0.05),
             tf.Variable(rng.normal([H, 4 * H]) * 0.05),
             tf.Variable(tf.zeros([4 * H]))]

  def cell_fn(theta, state, x_t):
    kernel, recurrent_kernel, bias = theta
    z = tf.matmul(x_t, kernel) + tf.matmul(state["h"], recurrent_kernel) + bias
    i, f, g, o = tf.split(z, 4, axis=-1)
    c = tf.sigmoid(f) * state["c"] + tf.sigmoid(i) * tf.tanh(g)
    return {"h": tf.sigmoid(o) * tf.tanh(c), "c": c}, []

  zeros = tf.zeros([B, H])

  @tf.function(jit_compile=True)
  def step():
    with tf.GradientTape() as tape:
      _, final = tf_recurrent.recurrent(
          weights, {"h": zeros, "c": zeros}, x, cell_fn, **options)
      loss = tf.reduce_mean(tf.square(final["h"]))
    return tape.gradient(loss, weights)

  return lambda: [g.numpy() for g in step()]


def build_step(name: str, T: int) -> Callable[[], object]:
  options = dict(CASES[name])
  args = (T, FLAGS.batch, FLAGS.input, FLAGS.hidden)
  if "jax_checkpoint" in options:
    return jax_lstm_step(*args, checkpoint=options["jax_checkpoint"],
                         final_only=True)
  return _tf_step(options, *args)


def available(name: str) -> bool:
  if "jax_checkpoint" not in CASES[name]:
    return True
  try:
    import jax  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


def time_per_step(name: str) -> float:
  """Best-of-repeats microseconds per step at --time_length."""
  step = build_step(name, FLAGS.time_length)
  return best_seconds(step, FLAGS.repeats) / FLAGS.time_length * 1e6


def peak_memory(name: str, lengths: List[int]) -> List[Optional[int]]:
  """Peak RSS of one training step at each length, each in a fresh
  subprocess."""
  return peak_rss_of_children("benchmarks.bench_checkpoint", [
      [f"--child={name}|{T}", f"--batch={FLAGS.batch}",
       f"--input={FLAGS.input}", f"--hidden={FLAGS.hidden}"]
      for T in lengths])


SQRT = "recurrent, final only, checkpoint_every=\"sqrt\""
JAX_CHECKPOINT = "jax lax.scan + jax.checkpoint, final only"


def _targets(results: Dict):
  """The issue's targets for "sqrt": memory and time, met or missed."""
  rows = {r["name"]: r for r in results["rows"]}
  sqrt, plain = rows.get(SQRT), rows.get(PLAIN)
  if not sqrt or sqrt.get("bytes_per_step") is None:
    return []
  ratio = sqrt["bytes_per_step"] / results["state_bytes"]
  out = [f"- \"sqrt\" memory slope {ratio:.2f}x the state (target < 0.63x, "
         f"JAX + checkpoint as measured in the issue): "
         f"{'met' if ratio < 0.63 else 'MISSED'}."]
  jax_row = rows.get(JAX_CHECKPOINT)
  if jax_row and jax_row.get("bytes_per_step") is not None:
    jax_ratio = jax_row["bytes_per_step"] / results["state_bytes"]
    out.append(f"- Against JAX + checkpoint in this run ({jax_ratio:.2f}x): "
               f"{'below' if ratio < jax_ratio else 'NOT below'}.")
  time_ratio = sqrt["us_per_step"] / plain["us_per_step"]
  out.append(f"- \"sqrt\" time {time_ratio:.2f}x the plain op's (target <= "
             f"1.4x): {'met' if time_ratio <= 1.4 else 'MISSED'}.")
  return out


def write_report(results: Dict, out_dir: str) -> None:
  env = results["environment"]
  shape = results["shape"]
  lines = [
      "# Final-state-only training: checkpointing (`checkpoint_every`)",
      "",
      "Generated by `python -m benchmarks.bench_checkpoint`. One training step "
      "(forward, loss on the final h, gradients of all weights) of an LSTM "
      f"with B={shape['B']} D={shape['D']} H={shape['H']}, float32, XLA "
      f"(jit_compile=True). TensorFlow {env['tensorflow']}"
      f"{', JAX ' + env['jax'] if 'jax' in env else ''}; {env['cpu']}.",
      "",
      f"Memory: peak RSS at T={shape['memory_lengths'][0]} and "
      f"T={shape['memory_lengths'][1]}, each in a fresh process; the slope "
      "is bytes per extra step, and its multiple of the state's own bytes "
      f"per step (2*B*H*4 = {results['state_bytes']} B). Time: best of "
      f"{FLAGS.repeats} at T={shape['time_length']}.",
      "",
      "| implementation | bytes/step | x state | us/step | time vs plain |",
      "|---|---:|---:|---:|---:|",
  ]
  plain = next(r for r in results["rows"] if r["name"] == PLAIN)
  for row in results["rows"]:
    slope = row.get("bytes_per_step")
    vs_state = None if slope is None else slope / results["state_bytes"]
    ratio = (row["us_per_step"] / plain["us_per_step"]
             if row["name"].startswith("recurrent") else None)
    memory = ("-" if "peaks" not in row else "failed" if slope is None
              else f"{slope:,.0f}")
    lines.append(
        f"| {row['name']} | {memory} | "
        f"{'' if vs_state is None else f'{vs_state:.2f}x'} "
        f"| {row['us_per_step']:.0f} | "
        f"{'' if ratio is None else f'{ratio:.2f}x'} |")
  lines += ["", "## Targets", ""] + _targets(results)
  with open(os.path.join(out_dir, "CHECKPOINT.md"), "w") as f:
    f.write("\n".join(lines) + "\n")


def main(argv):
  del argv
  if FLAGS.child:
    name, T = FLAGS.child.rsplit("|", 1)
    build_step(name, int(T))()
    print(f"PEAK_RSS {peak_rss_bytes()}")
    return
  lengths = [int(t) for t in FLAGS.memory_lengths]
  state_bytes = 2 * FLAGS.batch * FLAGS.hidden * 4
  results = {"environment": environment(), "rows": [],
             "state_bytes": state_bytes,
             "shape": {"B": FLAGS.batch, "D": FLAGS.input, "H": FLAGS.hidden,
                       "memory_lengths": lengths,
                       "time_length": FLAGS.time_length}}
  for name in CASES:
    if FLAGS.only and name != PLAIN and name not in FLAGS.only:
      continue
    if not available(name):
      print(f"{name}: jax not installed, skipped")
      continue
    us = time_per_step(name)
    row = {"name": name, "us_per_step": us}
    if not FLAGS.memory_only or name in FLAGS.memory_only:
      peaks = peak_memory(name, lengths)
      slope = (None if None in peaks else
               (peaks[1] - peaks[0]) / (lengths[1] - lengths[0]))
      row.update(peaks=peaks, bytes_per_step=slope)
      memory = ("failed" if slope is None else
                f"{slope / state_bytes:6.2f}x state")
    else:
      memory = "memory not measured"
    results["rows"].append(row)
    print(f"  {name:50s} {us:8.0f} us/step  {memory}", flush=True)
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "checkpoint.json"), "w") as f:
    json.dump(results, f, indent=1)
  write_report(results, FLAGS.out_dir)


if __name__ == "__main__":
  app.run(main)
