r"""Layer configurations against the Keras layer with the same configuration.

Each configuration (a masked LSTM, a masked GRU, ...) is run as
`tf_recurrent.<Layer>` and as `keras.layers.<Layer>` with the same options,
inputs and mask (for the cells Keras 3 does not ship, peephole,
layer-norm, projected and zoneout, Keras's loop `keras.layers.RNN` of our
`<Layer>Cell`), one full training step each (forward over T steps, a loss
over every step's output, the gradients of all weights). The "op" rows run
`tf_recurrent.recurrent` itself with an LSTM `cell_fn` and its default
gradient (the weights passed in theta, as Lingvo does) against
`keras.layers.LSTM`.

Modes (--modes): "tf", a `tf.function` without XLA (what Keras 3's
`compile()` gives); "xla", `jit_compile=True`; "tf1", a TF1 graph
differentiated by `tf.gradients` and run by a `Session` (Lingvo's and
TF1 users' mode), for the op rows only. Reported:

* time: per (configuration, mode, T) both layers are warmed up, then timed
  interleaved (ours, Keras, Keras, ours, ...) for --repeats rounds each; the
  median per layer, in microseconds per time step, and the ratio Keras /
  ours (above 1: ours is faster), both from the same run;
* memory: the peak RSS of one training step at two lengths, each in its own
  process; the slope between them is the memory per extra time step, also
  as a multiple of the state's bytes per step (LSTM: h and c, 2 * B * H * 4;
  GRU: h, B * H * 4).

Masks are right padded: the lengths run evenly from T/2 to T over the batch.

Usage:

    python -m benchmarks.bench_configs                  # full run
    python -m benchmarks.bench_configs --lengths=6 --batch=2 --input=3 \
        --hidden=4 --memory_hidden=4 --memory_lengths=6,12 --out_dir=/tmp/c
    python -m benchmarks.bench_configs --only="op LSTM cell_fn" \
        --modes=tf1,tf --lengths=250 --nomemory

Writes CONFIGS.md and configs.json into --out_dir.
"""

import json
import os
import statistics
import time
from typing import Callable, Dict, List, Optional

from absl import app
from absl import flags

from benchmarks.common import environment
from benchmarks.common import peak_rss_bytes
from benchmarks.common import peak_rss_of_children
from benchmarks.common import training_step

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["250", "1000"], "Sequence lengths timed.")
flags.DEFINE_integer("batch", 32, "Batch size B.")
flags.DEFINE_integer("input", 128, "Input features D.")
flags.DEFINE_integer("hidden", 256, "Units H for the time benchmark.")
flags.DEFINE_integer("memory_hidden", 512, "Units H for memory.")
flags.DEFINE_list("memory_lengths", ["250", "1250"], "Two lengths for memory.")
flags.DEFINE_integer("repeats", 3, "Timed rounds per layer (median kept).")
flags.DEFINE_list("only", [], "Run only these configurations.")
flags.DEFINE_list("modes", ["tf", "xla", "tf1"],
                  "tf (no XLA), xla and/or tf1 (a TF1 graph and Session: the "
                  "op rows only).")
flags.DEFINE_bool("memory", True, "Measure the memory slopes.")
flags.DEFINE_list("memory_only", [],
                  "Measure the memory of only these rows: a configuration "
                  "(every mode) or `<configuration>|<mode>`; the others "
                  "show -. Empty: every row.")
flags.DEFINE_list("memory_impls", ["ours", "keras"],
                  "Whose memory slopes to measure (ours and/or keras; the "
                  "others show -).")
flags.DEFINE_string("out_dir", os.path.dirname(os.path.abspath(__file__)),
                    "Where to write the results.")
flags.DEFINE_string("memory_child", "", "Internal: measure one case and exit.")

_USER_CELL = "custom_cells.UserLayerNormLSTMCell"
_OP_LSTM = "recurrent(LSTM cell_fn)"
# name: (layer class name, layer options, masked).
CONFIGS = {
    "LSTM plain": ("LSTM", {}, False),
    "LSTM masked": ("LSTM", {}, True),
    "LSTM dropout 0.1 + recurrent_dropout 0.1": (
        "LSTM", {"dropout": 0.1, "recurrent_dropout": 0.1}, False),
    "GRU plain": ("GRU", {}, False),
    "GRU masked": ("GRU", {}, True),
    "GRU reset_after=False": ("GRU", {"reset_after": False}, False),
    "SimpleRNN plain": ("SimpleRNN", {}, False),
    "SimpleRNN masked": ("SimpleRNN", {}, True),
    # Cells Keras 3 does not ship: against keras.layers.RNN of our cell.
    "PeepholeLSTM plain": ("PeepholeLSTM", {}, False),
    "LayerNormLSTM plain": ("LayerNormLSTM", {}, False),
    "LayerNormLSTM masked": ("LayerNormLSTM", {}, True),
    "LayerNormSimpleRNN plain": ("LayerNormSimpleRNN", {}, False),
    "ProjectedLSTM proj_size=128": ("ProjectedLSTM", {"proj_size": 128},
                                    False),
    "ZoneoutLSTM zoneout 0.1/0.1": ("ZoneoutLSTM", {"zoneout_h": 0.1,
                                                    "zoneout_c": 0.1}, False),
    # A user's own cell (benchmarks/custom_cells.py): tf_recurrent.RNN(cell),
    # the op's generic path, against keras.layers.RNN(cell).
    "user LayerNorm LSTM cell": (_USER_CELL, {}, False),
    "user LayerNorm LSTM cell xla_steps=False": (
        _USER_CELL, {"xla_steps": False}, False),
    # The op with an LSTM cell_fn and its default gradient (each step
    # recomputed and differentiated), against keras.layers.LSTM.
    "op LSTM cell_fn": (_OP_LSTM, {}, False),
    "op LSTM cell_fn xla_steps=False": (_OP_LSTM, {"xla_steps": False},
                                        False),
}
IMPLS = ("ours", "keras")
MODE_NAMES = {"tf": "no XLA", "xla": "XLA", "tf1": "TF1 graph"}
# The user's cell also in JAX (lax.scan, plain and jax.checkpoint), timed
# beside the XLA rows where JAX is installed (it is no dependency).
JAX_IMPLS = ("jax", "jax checkpoint")


def right_padded_mask(B: int, T: int):
  """`[B, T]` bool: example b runs for a length between T/2 and T."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  lengths = np.linspace(max(1, T // 2), T, B).round().astype(int)
  return np.arange(T)[None, :] < lengths[:, None]


def _lstm_cell_fn(theta, state, x_t):
  """An LSTM step as `tf_recurrent.recurrent` takes it (Keras's gates)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  z = (tf.matmul(x_t, theta["kernel"]) +
       tf.matmul(state["h"], theta["recurrent_kernel"]) + theta["bias"])
  i, f, g, o = tf.split(z, 4, axis=-1)
  c = tf.sigmoid(f) * state["c"] + tf.sigmoid(i) * tf.tanh(g)
  return {"h": tf.sigmoid(o) * tf.tanh(c), "c": c}, []


def _op_outputs(weights, options, x, H: int):
  """The op's `[B, T, H]` outputs over `x`, the weights read into theta."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top
  theta = {name: tf.convert_to_tensor(w) for name, w in
           zip(("kernel", "recurrent_kernel", "bias"), weights)}
  zeros = tf.zeros([x.shape[0], H])
  # The loss reads h only: c's rows need no gradient tensor.
  acc, _ = tf_recurrent.recurrent(
      theta, {"h": zeros, "c": zeros}, tf.transpose(x, [1, 0, 2]),
      _lstm_cell_fn, accumulate_state={"h": True, "c": False}, **options)
  return tf.transpose(acc["h"], [1, 0, 2])


def build_step(config: str, impl: str, T: int, B: int, D: int, H: int,
               mode: str) -> Callable[[], object]:
  """A zero-argument callable running one training step in `mode`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if mode != "tf1":
    return _build(config, impl, T, B, D, H, mode == "xla")
  graph = tf.Graph()
  with graph.as_default():
    grads = _build(config, impl, T, B, D, H, jit=False, graph=True)
    init = tf.compat.v1.global_variables_initializer()
  session = tf.compat.v1.Session(graph=graph)
  session.run(init)
  return lambda: session.run(grads)


def _build(config: str, impl: str, T: int, B: int, D: int, H: int,
           jit: bool, graph: bool = False):
  """A callable running one training step, or in a TF1 graph (`graph`)
  the step's gradient tensors."""
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top

  layer_name, options, masked = CONFIGS[config]
  if impl in JAX_IMPLS:
    from benchmarks.common import jax_lstm_step  # pylint: disable=g-import-not-at-top
    return jax_lstm_step(T, B, D, H, checkpoint=impl == "jax checkpoint",
                         final_only=False, layer_norm=True)
  x = tf.random.Generator.from_seed(0).normal([B, T, D])
  mask = tf.constant(right_padded_mask(B, T)) if masked else None
  if layer_name == _OP_LSTM and impl == "ours":
    rng = np.random.default_rng(0)
    weights = [tf.Variable(rng.normal(size=shape).astype("float32") * 0.05)
               for shape in ([D, 4 * H], [H, 4 * H], [4 * H])]

    def outputs():
      return _op_outputs(weights, options, x, H)
  else:
    layer = _layer(layer_name, options, impl, H, keras, tf_recurrent)
    layer.build((B, T, D))
    weights = layer.trainable_weights

    def outputs():
      return layer(x, mask=mask, training=True)

  if graph:
    loss = tf.reduce_mean(tf.square(outputs()))
    return tf.gradients(loss, [w.value if isinstance(w, keras.Variable)
                               else w for w in weights])

  return training_step(outputs, weights, jit)


def _layer(layer_name: str, options, impl: str, H: int, keras, tf_recurrent):
  """The configuration's layer: ours or Keras's."""
  if layer_name == _OP_LSTM:  # Keras's peer of the op.
    return keras.layers.LSTM(H, return_sequences=True, use_cudnn=False)
  if layer_name == _USER_CELL:
    from benchmarks import custom_cells  # pylint: disable=g-import-not-at-top
    cell = custom_cells.UserLayerNormLSTMCell(H)
    return (tf_recurrent.RNN(cell, return_sequences=True, **options)
            if impl == "ours" else
            keras.layers.RNN(cell, return_sequences=True))
  if impl == "ours":
    return getattr(tf_recurrent, layer_name)(H, return_sequences=True,
                                              **options)
  if not hasattr(keras.layers, layer_name):  # Keras's loop, our cell.
    cell = getattr(tf_recurrent, layer_name + "Cell")(H, **options)
    return keras.layers.RNN(cell, return_sequences=True)
  if layer_name != "SimpleRNN":  # Keras's LSTM/GRU only.
    options = {**options, "use_cudnn": False}
  return getattr(keras.layers, layer_name)(H, return_sequences=True,
                                           **options)


def _jax_peer(config: str) -> bool:
  """Whether the configuration has a JAX peer here (the user's cell)."""
  if CONFIGS[config][0] != _USER_CELL or CONFIGS[config][1]:
    return False
  try:
    import jax  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def time_pair(config: str, mode: str, T: int) -> Dict[str, float]:
  """Median microseconds per time step of each layer, timed interleaved."""
  impls = IMPLS + (JAX_IMPLS if mode == "xla" and _jax_peer(config) else ())
  steps = {impl: build_step(config, impl, T, FLAGS.batch, FLAGS.input,
                            FLAGS.hidden, mode) for impl in impls}
  for step in steps.values():
    step()  # Trace and compile.
  seconds = {impl: [] for impl in impls}
  for r in range(FLAGS.repeats):
    for impl in (impls if r % 2 == 0 else impls[::-1]):
      start = time.perf_counter()
      steps[impl]()
      seconds[impl].append(time.perf_counter() - start)
  return {impl: statistics.median(s) / T * 1e6 for impl, s in seconds.items()}


def memory_child(spec: str) -> None:
  """Runs one training step and prints the process's peak RSS in bytes."""
  config, impl, mode, T = spec.split("|")
  step = build_step(config, impl, int(T), FLAGS.batch, FLAGS.input,
                    FLAGS.memory_hidden, mode)
  step()
  print(f"PEAK_RSS {peak_rss_bytes()}")


def memory_slope(config: str, impl: str, mode: str) -> Optional[float]:
  """Bytes per extra time step, or None if a child failed."""
  lengths = [int(t) for t in FLAGS.memory_lengths]
  peaks = peak_rss_of_children("benchmarks.bench_configs", [
      [f"--memory_child={config}|{impl}|{mode}|{T}",
       f"--batch={FLAGS.batch}", f"--input={FLAGS.input}",
       f"--memory_hidden={FLAGS.memory_hidden}"] for T in lengths])
  if None in peaks:
    return None
  return (peaks[1] - peaks[0]) / (lengths[1] - lengths[0])


def state_bytes(config: str) -> int:
  leaves = 2 if "LSTM" in CONFIGS[config][0] else 1
  return leaves * FLAGS.batch * FLAGS.memory_hidden * 4


def report(results: Dict) -> str:
  """The markdown table of one run."""
  env = results["environment"]
  lengths = results["lengths"]
  lines = [
      "# Layer configurations against Keras",
      "",
      f"{env['cpu']}, TensorFlow {env['tensorflow']}, B={FLAGS.batch} "
      f"D={FLAGS.input} H={FLAGS.hidden}; memory at H={FLAGS.memory_hidden}, "
      f"T={'/'.join(FLAGS.memory_lengths)}. Training step, medians of "
      f"{FLAGS.repeats} interleaved rounds; ratio = Keras time / ours "
      "(above 1: ours is faster); memory slope in multiples of the state.",
      "",
      "| configuration | mode | " + " | ".join(
          f"T={T} ours us/step | T={T} Keras | T={T} ratio" for T in lengths)
      + " | memory ours / Keras |",
      "|---|---|" + "---|" * (3 * len(lengths) + 1),
  ]
  for row in results["rows"]:
    cells = []
    for T in lengths:
      t = row["us_per_step"][str(T)]
      cells += [f"{t['ours']:.1f}", f"{t['keras']:.1f}",
                f"{t['keras'] / t['ours']:.2f}x"]
    memory = row.get("memory_vs_state") or {}
    cells.append(" / ".join("-" if memory.get(i) is None else
                            f"{memory[i]:.2f}" for i in IMPLS))
    mode = row.get("mode", "xla" if row["xla"] else "tf")
    lines.append(f"| {row['config']} | {MODE_NAMES[mode]} | "
                 + " | ".join(cells) + " |")
  peers = [_jax_line(row, T) for row in results["rows"] for T in lengths
           if "jax" in row["us_per_step"][str(T)]]
  if peers:
    lines += ["", "The same cell in JAX (`lax.scan`, jitted), timed in the "
              "XLA rows' rounds; ratio = JAX time / ours:", ""] + peers
  return "\n".join(lines) + "\n"


def _jax_line(row: Dict, T: int) -> str:
  t = row["us_per_step"][str(T)]
  return (f"- {row['config']}, T={T}: JAX {t['jax']:.1f} us/step "
          f"({t['jax'] / t['ours']:.2f}x), JAX with `jax.checkpoint` "
          f"{t['jax checkpoint']:.1f} ({t['jax checkpoint'] / t['ours']:.2f}x)")


def main(argv):
  del argv
  if FLAGS.memory_child:
    memory_child(FLAGS.memory_child)
    return
  unknown = set(FLAGS.only) - set(CONFIGS)
  if unknown:
    raise app.UsageError(f"--only: unknown {sorted(unknown)}; the "
                         f"configurations are {list(CONFIGS)}.")
  configs = [c for c in CONFIGS if not FLAGS.only or c in FLAGS.only]
  unknown = set(FLAGS.modes) - set(MODE_NAMES)
  if unknown:
    raise app.UsageError(f"--modes: unknown {sorted(unknown)}; the modes "
                         f"are {list(MODE_NAMES)}.")
  unknown = set(FLAGS.memory_impls) - set(IMPLS)
  if unknown:
    raise app.UsageError(f"--memory_impls: unknown {sorted(unknown)}; they "
                         f"are {list(IMPLS)}.")
  lengths = [int(t) for t in FLAGS.lengths]
  results = {"environment": environment(), "lengths": lengths, "rows": []}
  for config in configs:
    # TF1 graphs are the op's mode (Lingvo's); the layers are Keras's.
    modes = [m for m in FLAGS.modes
             if m != "tf1" or CONFIGS[config][0] == _OP_LSTM]
    for mode in modes:
      row = {"config": config, "mode": mode, "xla": mode == "xla",
             "us_per_step": {}}
      for T in lengths:
        times = time_pair(config, mode, T)
        row["us_per_step"][str(T)] = times
        print(f"  {config:20s} {mode:3s} T={T:5d} "
              f"ours {times['ours']:9.1f} keras {times['keras']:9.1f} us/step "
              f"({times['keras'] / times['ours']:.2f}x)"
              + "".join(f" {impl} {times[impl]:9.1f}" for impl in JAX_IMPLS
                        if impl in times), flush=True)
      if FLAGS.memory and (not FLAGS.memory_only or
                           config in FLAGS.memory_only or
                           f"{config}|{mode}" in FLAGS.memory_only):
        row["memory_vs_state"] = {}
        for impl in (i for i in IMPLS if i in FLAGS.memory_impls):
          slope = memory_slope(config, impl, mode)
          row["memory_vs_state"][impl] = (
              None if slope is None else slope / state_bytes(config))
        print(f"  {config:20s} {mode:3s} memory "
              f"{row['memory_vs_state']}", flush=True)
      results["rows"].append(row)
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  with open(os.path.join(FLAGS.out_dir, "configs.json"), "w") as f:
    json.dump(results, f, indent=1)
  with open(os.path.join(FLAGS.out_dir, "CONFIGS.md"), "w") as f:
    f.write(report(results))
  print(report(results))


if __name__ == "__main__":
  app.run(main)
