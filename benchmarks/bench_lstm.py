r"""LSTM training-step time and memory per time step, side by side in one run.

Every implementation computes the same LSTM (Keras gate order, tanh/sigmoid)
and one full training step: forward over T steps, a loss over every step's
output, and the gradients of all weights. Reported:

* time: best of several repetitions after a warm-up, in microseconds per time
  step, with ratios to keras.layers.LSTM in the same mode;
* memory: the peak RSS of one training step at two lengths, each in its own
  subprocess; the slope between them is the memory each extra time step
  costs (start-up and compile costs cancel), also as a multiple of the
  state's own bytes per step (h and c: 2 * B * H * 4 bytes).

Usage:

    python -m benchmarks.bench_lstm                      # full run (~40 min)
    python -m benchmarks.bench_lstm --lengths=20 --batch=2 --input=4 \
        --hidden=8 --memory_hidden=8 --memory_lengths=20,40 --out_dir=/tmp/b

Writes RESULTS.md, results.json and results.png into --out_dir.
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
flags.DEFINE_list("lengths", ["100", "250", "1000", "2000"], "Sequence lengths.")
flags.DEFINE_integer("batch", 32, "Batch size B.")
flags.DEFINE_integer("input", 128, "Input features D.")
flags.DEFINE_integer("hidden", 256, "LSTM units H for the time benchmark.")
flags.DEFINE_integer("memory_hidden", 512, "LSTM units H for memory.")
flags.DEFINE_list("memory_lengths", ["250", "1250"], "Two lengths for memory.")
flags.DEFINE_integer("repeats", 3, "Timed repetitions (best is kept).")
flags.DEFINE_float("skip_after", 60.0,
                   "Skip longer lengths of an implementation once one step "
                   "takes longer than this many seconds.")
flags.DEFINE_list("only", [], "Run only these implementations.")
flags.DEFINE_list("memory_only", [],
                  "Measure the memory of only these rows: an implementation "
                  "(both modes) or `<implementation>|tf` or `|xla` (one "
                  "mode); the others get no memory columns. Empty: every "
                  "row.")
flags.DEFINE_string("out_dir", os.path.dirname(os.path.abspath(__file__)),
                    "Where to write the results.")
flags.DEFINE_string("memory_child", "", "Internal: measure one case and exit.")
flags.DEFINE_bool("merge", False,
                  "Keep the timings and memory of results.json in --out_dir "
                  "for the cases not named by --only; measure those named.")

KERAS_LSTM = "keras.layers.LSTM"
LEAN_LSTM = "tf_recurrent.LSTM(recompute=True)"
KERAS_GRU = "keras.layers.GRU"
GRU_IMPLS = ["tf_recurrent.GRU", "tf_recurrent.GRU(recompute=True)",
             KERAS_GRU]
TF_IMPLS = ["tf_recurrent.recurrent (default cell_grad)",
            "tf_recurrent.RNN(LSTMCell)", "tf_recurrent.LSTM", LEAN_LSTM,
            KERAS_LSTM,
            "tf.scan", "tf.while_loop + TensorArray"] + GRU_IMPLS
# The fastest layer and Keras under Keras's mixed_bfloat16 policy: bfloat16
# compute, float32 weights (and float32 weight gradients).
MIXED = " (mixed_bfloat16)"
MIXED_IMPLS = ["tf_recurrent.LSTM" + MIXED, KERAS_LSTM + MIXED]
JAX_IMPLS = ["jax lax.scan", "jax lax.scan + checkpoint"]
FLOOR = "compute floor (6 matmuls, XLA)"
# The TF executor allocates each tensor with glibc malloc, whose mmap
# threshold grows as large blocks are freed; the per-step rows of a TensorList
# then fragment the heap. Pinning the threshold shows how much of a TF-mode
# slope is that fragmentation rather than tensors alive at the peak.
PINNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "16384"}


def _tf_step(name: str, T: int, B: int, D: int, H: int, jit: bool):
  """Returns a zero-argument callable running one TF training step."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top

  rng = tf.random.Generator.from_seed(0)
  x = rng.normal([B, T, D])
  kernel = tf.Variable(rng.normal([D, 4 * H]) * 0.05)
  recurrent_kernel = tf.Variable(rng.normal([H, 4 * H]) * 0.05)
  bias = tf.Variable(tf.zeros([4 * H]))
  weights = [kernel, recurrent_kernel, bias]

  def cell(h, c, x_t):
    z = tf.matmul(x_t, kernel) + tf.matmul(h, recurrent_kernel) + bias
    i, f, g, o = tf.split(z, 4, axis=-1)
    c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
    return tf.sigmoid(o) * tf.tanh(c), c

  zeros = tf.zeros([B, H])
  time_major = tf.transpose(x, [1, 0, 2])

  if name.startswith("tf_recurrent.recurrent"):
    def cell_fn(theta, state, x_t):
      del theta  # The weights are read as captured variables.
      h, c = cell(state["h"], state["c"], x_t)
      return {"h": h, "c": c}, []

    def outputs():
      # The loss reads h only: c's rows need no gradient tensor.
      acc, _ = tf_recurrent.recurrent({}, {"h": zeros, "c": zeros},
                                      time_major, cell_fn,
                                      accumulate_state={"h": True, "c": False})
      return acc["h"]
  elif name.removesuffix(MIXED) in ("tf_recurrent.RNN(LSTMCell)",
                                    "tf_recurrent.LSTM", LEAN_LSTM,
                                    KERAS_LSTM, *GRU_IMPLS):
    # A layer keeps the policy it was made under.
    keras.mixed_precision.set_global_policy(
        "mixed_bfloat16" if name.endswith(MIXED) else "float32")
    name = name.removesuffix(MIXED)
    if name == "tf_recurrent.RNN(LSTMCell)":
      layer = tf_recurrent.RNN(keras.layers.LSTMCell(H), return_sequences=True)
    elif name == "tf_recurrent.LSTM":
      layer = tf_recurrent.LSTM(H, return_sequences=True)
    elif name == LEAN_LSTM:
      layer = tf_recurrent.LSTM(H, return_sequences=True, recompute=True)
    elif name in GRU_IMPLS[:2]:
      layer = tf_recurrent.GRU(H, return_sequences=True,
                               recompute=name.endswith("(recompute=True)"))
    elif name == KERAS_GRU:
      layer = keras.layers.GRU(H, return_sequences=True, use_cudnn=False)
    else:
      layer = keras.layers.LSTM(H, return_sequences=True, use_cudnn=False)
    keras.mixed_precision.set_global_policy("float32")
    layer.build((B, T, D))
    weights = layer.trainable_weights

    def outputs():
      return layer(x)
  elif name == "tf.scan":
    def outputs():
      hs, _ = tf.scan(lambda s, x_t: cell(s[0], s[1], x_t), time_major,
                      initializer=(zeros, zeros))
      return hs
  elif name == "tf.while_loop + TensorArray":
    def outputs():
      def body(t, h, c, ta):
        h, c = cell(h, c, time_major[t])
        return t + 1, h, c, ta.write(t, h)
      _, _, _, ta = tf.while_loop(
          lambda t, *_: t < T, body,
          (0, zeros, zeros, tf.TensorArray(tf.float32, size=T)),
          maximum_iterations=T)
      return ta.stack()
  else:
    raise ValueError(name)

  @tf.function(jit_compile=jit)
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(tf.cast(outputs(), tf.float32)))
    return tape.gradient(loss, weights)

  return lambda: [g.numpy() for g in step()]


def _floor_step(T: int, B: int, D: int, H: int):
  """Every matmul of an LSTM training step, batched over T, under XLA.

  The input projection x @ W and the recurrent h @ U, and both gradients of
  each (dW = x^T dz, dx = dz W^T, dU = h^T dz, dh = dz U^T), each as one GEMM
  over all T*B rows: what no loop can beat, since two of the six depend on
  the previous step and must run one step at a time.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = tf.random.Generator.from_seed(0)
  x = rng.normal([T * B, D])
  h = rng.normal([T * B, H])
  dz = rng.normal([T * B, 4 * H])
  kernel = rng.normal([D, 4 * H])
  recurrent_kernel = rng.normal([H, 4 * H])

  @tf.function(jit_compile=True)
  def step():
    products = [
        tf.matmul(x, kernel),
        tf.matmul(h, recurrent_kernel),
        tf.matmul(x, dz, transpose_a=True),
        tf.matmul(dz, kernel, transpose_b=True),
        tf.matmul(h, dz, transpose_a=True),
        tf.matmul(dz, recurrent_kernel, transpose_b=True),
    ]
    return tf.add_n([p[0, 0] for p in products])

  return lambda: step().numpy()


def build_step(name: str, T: int, B: int, D: int, H: int,
               jit: bool) -> Callable[[], object]:
  if name in JAX_IMPLS:
    return jax_lstm_step(T, B, D, H, checkpoint=name.endswith("checkpoint"),
                         final_only=False)
  if name == FLOOR:
    return _floor_step(T, B, D, H)
  return _tf_step(name, T, B, D, H, jit)


def cases() -> List[tuple]:
  """(implementation, jit) pairs to run; JAX only when installed."""
  out = [(name, jit) for name in TF_IMPLS + MIXED_IMPLS
         for jit in (False, True)]
  try:
    import jax  # pylint: disable=g-import-not-at-top,unused-import
    out += [(name, True) for name in JAX_IMPLS]
  except ImportError:
    print("jax is not installed (pip install -e '.[bench]'): JAX rows skipped")
  out.append((FLOOR, True))
  if FLAGS.only:
    out = [c for c in out if c[0] in FLAGS.only]
  return out


def time_case(name: str, jit: bool, lengths: List[int]) -> Dict[int, Optional[float]]:
  """Microseconds per time step for each length (None where skipped)."""
  result = {}
  too_slow = False
  for T in lengths:
    if too_slow:
      result[T] = None
      continue
    step = build_step(name, T, FLAGS.batch, FLAGS.input, FLAGS.hidden, jit)
    best = best_seconds(step, FLAGS.repeats)
    result[T] = best / T * 1e6
    too_slow = best > FLAGS.skip_after
    print(f"  {name:45s} {'xla' if jit else 'tf ':3s} T={T:5d} "
          f"{result[T]:9.1f} us/step", flush=True)
  return result


def memory_child(spec: str) -> None:
  """Runs one training step and prints the process's peak RSS in bytes."""
  name, jit, T = spec.rsplit("|", 2)
  step = build_step(name, int(T), FLAGS.batch, FLAGS.input,
                    FLAGS.memory_hidden, jit == "1")
  step()
  print(f"PEAK_RSS {peak_rss_bytes()}")


def measure_memory(name: str, jit: bool,
                   env: Optional[Dict[str, str]] = None) -> Optional[tuple]:
  """(bytes per extra time step, [peak at each memory length])."""
  lengths = [int(t) for t in FLAGS.memory_lengths]
  peaks = peak_rss_of_children("benchmarks.bench_lstm", [
      [f"--memory_child={name}|{int(jit)}|{T}", f"--batch={FLAGS.batch}",
       f"--input={FLAGS.input}", f"--memory_hidden={FLAGS.memory_hidden}"]
      for T in lengths], env=env)
  if None in peaks:
    return None
  return (peaks[1] - peaks[0]) / (lengths[1] - lengths[0]), peaks


def measures_memory(name: str, jit: bool) -> bool:
  """Whether --memory_only leaves the row `(name, jit)` measured."""
  mode = "xla" if jit else "tf"
  return (not FLAGS.memory_only or name in FLAGS.memory_only or
          f"{name}|{mode}" in FLAGS.memory_only)


def main(argv):
  del argv
  if FLAGS.memory_child:
    memory_child(FLAGS.memory_child)
    return
  lengths = [int(t) for t in FLAGS.lengths]
  results = {"environment": environment(), "lengths": lengths,
             "shape": {"B": FLAGS.batch, "D": FLAGS.input, "H": FLAGS.hidden,
                       "memory_H": FLAGS.memory_hidden,
                       "memory_lengths": [int(t) for t in FLAGS.memory_lengths]},
             "rows": []}
  print(f"time per step: B={FLAGS.batch} D={FLAGS.input} H={FLAGS.hidden}")
  previous = {}
  if FLAGS.merge:
    with open(os.path.join(FLAGS.out_dir, "results.json")) as f:
      previous = {(r["name"], r["xla"]): r for r in json.load(f)["rows"]}
  only, FLAGS.only = FLAGS.only, [] if FLAGS.merge else FLAGS.only
  for name, jit in cases():
    if FLAGS.merge and name not in only and (name, jit) in previous:
      times = {int(t): v for t, v in
               previous[(name, jit)]["us_per_step"].items()}
    else:
      times = time_case(name, jit, lengths)
    results["rows"].append({"name": name, "xla": jit, "us_per_step": times})
  state_bytes = 2 * FLAGS.batch * FLAGS.memory_hidden * 4
  print(f"memory per step: H={FLAGS.memory_hidden}, state {state_bytes} B/step")
  for row in results["rows"]:
    if row["name"] == FLOOR:
      continue
    kept = previous.get((row["name"], row["xla"]), {})
    if FLAGS.merge and row["name"] not in only and "peak_rss_bytes" in kept:
      row.update({k: v for k, v in kept.items() if k != "us_per_step"})
      continue
    if not measures_memory(row["name"], row["xla"]):
      continue
    slope = measure_memory(row["name"], row["xla"])
    row["memory_bytes_per_step"] = slope[0] if slope else None
    row["peak_rss_bytes"] = slope[1] if slope else None
    slope = slope[0] if slope else None
    # A GRU's state is h alone: its rows are in multiples of B*H*4 bytes.
    row_state = state_bytes // 2 if "GRU" in row["name"] else state_bytes
    row["memory_vs_state"] = None if slope is None else slope / row_state
    line = (f"  {row['name']:45s} {'xla' if row['xla'] else 'tf ':3s} "
            f"{'failed' if slope is None else f'{slope / row_state:6.2f}x state'}")
    if not row["xla"]:
      pinned = measure_memory(row["name"], row["xla"], PINNED_MALLOC)
      row["memory_vs_state_pinned_malloc"] = (
          None if pinned is None else pinned[0] / row_state)
      if pinned is not None:
        line += (f" ({pinned[0] / row_state:.2f}x with "
                 f"{' '.join(f'{k}={v}' for k, v in PINNED_MALLOC.items())})")
    print(line, flush=True)
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  report.write(results, FLAGS.out_dir)


if __name__ == "__main__":
  app.run(main)
