r"""The shape grid of issue #33: one recurrent layer's training step, Keras's
layer against ours, at every shape of the grid, with and without XLA.

What is measured, per row (cell, B, T, D, H):

* Keras and ours: the model `Input((T, D), batch_size=B)`, `LSTM(H)` (or
  `GRU(H)`), `Dense(1)`, compiled with Adam and MSE, one
  `model.train_on_batch(x, y)` timed (it returns the loss as numpy, so the
  step has finished). Keras's layer is `keras.layers.LSTM`, ours
  `tf_recurrent.LSTM`, both models starting from the same weights. Two modes:
  the default `model.compile(...)` (Keras 3 resolves `jit_compile="auto"` to
  no XLA for these models on a CPU; the resolved value is recorded as
  `jit_resolved`) and `compile(..., jit_compile=True)`. Per mode, both
  models are warmed up (2 calls: trace, compile, Adam's slots), then timed
  interleaved (Keras, ours, ours, Keras, ...) for REPS rounds; the median
  per model in ms, and the ratio Keras / ours (above 1: ours is faster).
* torch (when importable; torch is no dependency of the project):
  `nn.LSTM(D, H, batch_first=True)` (or `nn.GRU`) + `nn.Linear(H, 1)` on the
  last step, Adam, MSE, `torch.set_num_threads(2)`, median of REPS steps
  after 2 warm-up steps, in a process of its own (so its thread pool and
  floating-point mode do not touch TensorFlow's). `torch.set_flush_denormal
  (True)` is set before torch starts its threads: with the loss on the last
  step only, the backward values decay into denormal floats, which x86 runs
  5-15x slower, and TensorFlow flushes them in its own threads already.
  torch's two OpenMP threads wait for each other at every op, so other
  busy processes on a 2-core machine slow torch far more than TensorFlow
  (GRU(128), B=32: 1180 ms beside two busy processes, 37 ms a minute
  later): each row records the 1-minute load average (`loadavg`) taken
  before it started; run on a quiet machine.
* the GEMM floor: the six GEMMs of the step at these exact shapes (G = 4
  gates for an LSTM, 3 for a GRU), each timed alone (median of REPS after a
  warm-up) in one XLA program, summed: the two sequential ones per step,
  h @ U ([B, H] x [H, G*H], forward) and dz @ U^T ([B, G*H] x [G*H, H],
  backward), each in a `tf.while_loop` of T steps with a tanh between steps
  so that XLA cannot hoist them out of the loop; and the four batched over
  time, x @ W ([T*B, D] x [D, G*H]), dx = dz @ W^T, dW = x^T @ dz,
  dU = h^T @ dz. Each part is counted without the cost of calling an XLA
  program (a null program's median, recorded as `dispatch_ms`), which a
  step pays once, not six times. The floor leaves out the gates'
  elementwise work, so it is an estimate of what a step cannot go below,
  not a bound torch must respect.

The target, per mode: "met" when ours is at least 1.2x faster than Keras
(Keras / ours >= 1.2), or within 1.1x the GEMM floor (ours <= 1.1 * floor).

Each row runs in a fresh process (`--child`), so no earlier row's graphs,
caches or allocator state weigh on it; the torch figure in another one.

Rows: (B, T, D) in {(32, 200, 64), (256, 120, 8)} x H in {16, 32, 64, 128,
256, 512}, for LSTM and GRU (24 rows).

Environment variables:

* `ONLY`: the rows to run, a comma-separated list of `cell[:B[:H]]`
  patterns, any part `*` or left out: `ONLY=lstm:256:32` (one row),
  `ONLY=lstm:256` (the LSTM rows at B=256), `ONLY=gru` (all GRU rows),
  `ONLY=lstm:*:512,gru:32:16`. Default: every row.
* `REPS`: timed repetitions per model (median kept), default 9.
* `OUT`: the JSON lines file, default `benchmarks/shapes.json`.
* `MODES`: `default`, `xla` or `default,xla` (the default).
* `TORCH=0`: leave out the torch column even where torch is importable.
* `SHAPES` (`B,T,D;B,T,D`) and `UNITS` (`H,H`): another grid, for smoke
  tests (`SHAPES=2,5,3 UNITS=4`).

Usage:

    python -m benchmarks.bench_shapes          # the full grid (~15 min)
    ONLY=lstm:256:32 REPS=3 python -m benchmarks.bench_shapes   # one row

Writes `OUT` as JSON lines (the first line `{"environment": ...}`, then one
line per row, written as each row finishes) and prints a markdown table.
"""

import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

from benchmarks.common import environment
from benchmarks.common import interleaved_medians
from benchmarks.common import json_of_child
from benchmarks.common import load_note
from benchmarks.common import print_result
from benchmarks.common import print_table
from benchmarks.common import ROOT

MODULE = "benchmarks.bench_shapes"
SHAPES = ((32, 200, 64), (256, 120, 8))
UNITS = (16, 32, 64, 128, 256, 512)
CELLS = ("lstm", "gru")
GATES = {"lstm": 4, "gru": 3}
MODES = {"default": False, "xla": True}  # Name: compile(jit_compile=True).
WARMUP = 2  # Calls before timing: the trace, then Adam's first update.
TARGET_SPEEDUP = 1.2  # Keras / ours, per mode.
TARGET_FLOOR = 1.1  # ours / GEMM floor.

Row = Tuple[str, int, int, int, int]  # cell, B, T, D, H.


def parse_shapes(text: str) -> List[Tuple[int, int, int]]:
  return [tuple(int(v) for v in s.split(",")) for s in text.split(";") if s]


def grid() -> List[Row]:
  shapes = parse_shapes(os.environ.get("SHAPES", "")) or SHAPES
  units = [int(h) for h in os.environ.get("UNITS", "").split(",") if h] or UNITS
  return [(cell, B, T, D, H) for cell in CELLS for B, T, D in shapes
          for H in units]


def selected(row: Row, only: str) -> bool:
  """Whether `row` matches one of `only`'s `cell[:B[:H]]` patterns."""
  if not only:
    return True
  cell, B, _, _, H = row
  for pattern in only.lower().split(","):
    parts = (pattern.strip().split(":") + ["*", "*"])[:3]
    wants = (cell, str(B), str(H))
    if all(p in ("*", "", want) for p, want in zip(parts, wants)):
      return True
  return False


def row_name(row: Row) -> str:
  cell, B, _, _, H = row
  return f"{cell}:{B}:{H}"


def reps() -> int:
  return int(os.environ.get("REPS", "9"))


def modes() -> List[str]:
  """The modes MODES= selects (all by default), in MODES's order."""
  wanted = [m for m in os.environ.get("MODES", "").split(",") if m]
  unknown = set(wanted) - set(MODES)
  if unknown:
    raise ValueError(f"MODES: unknown {sorted(unknown)}; known {list(MODES)}")
  return [m for m in MODES if not wanted or m in wanted]


# The child: one row's Keras, ours and GEMM floor, in a fresh process.


def build_model(impl: str, row: Row, jit: bool, weights=None):
  """The row's model with Keras's layer or ours, compiled for one mode."""
  import keras  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top
  cell, B, T, D, H = row
  layers = keras.layers if impl == "keras" else tf_recurrent
  recurrent = getattr(layers, cell.upper())(H)
  inputs = keras.Input((T, D), batch_size=B)
  model = keras.Model(inputs, keras.layers.Dense(1)(recurrent(inputs)))
  if weights is not None:
    model.set_weights(weights)
  if jit:
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse",
                  jit_compile=True)
  else:
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
  return model


def time_models(row: Row) -> Dict[str, Dict[str, object]]:
  """Per mode: the median ms of Keras's model and ours, interleaved."""
  import gc  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  _, B, T, D, _ = row
  keras.utils.set_random_seed(0)
  x = tf.random.normal([B, T, D])
  y = tf.random.normal([B, 1])
  weights = None
  results = {}
  for mode in modes():
    jit = MODES[mode]
    models = {}
    for impl in ("keras", "ours"):
      models[impl] = build_model(impl, row, jit, weights)
      weights = models[impl].get_weights()  # Ours starts where Keras's does.
    steps = {impl: (lambda m=m: m.train_on_batch(x, y))
             for impl, m in models.items()}
    gc.collect()  # No collection of the previous mode's garbage mid-timing.
    seconds = interleaved_medians(steps, reps(), warmup=WARMUP)
    results[mode] = {
        "keras_ms": seconds["keras"] * 1e3, "ours_ms": seconds["ours"] * 1e3,
        "ratio": seconds["keras"] / seconds["ours"],
        "jit_resolved": bool(models["ours"].jit_compile)}
  return results


def gemm_programs(row: Row) -> Dict[str, Callable[[], object]]:
  """The six GEMMs of the row's training step, each as one XLA program."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cell, B, T, D, H = row
  G = GATES[cell]
  gen = tf.random.Generator.from_seed(1)
  # Scaled so the tanh chains neither saturate nor decay into denormals.
  u = gen.normal([H, G * H]) * (2.0 / H ** 0.5)
  w = gen.normal([D, G * H]) / D ** 0.5
  h0 = gen.normal([B, H])
  dz0 = gen.normal([B, G * H])
  x = gen.normal([T * B, D])
  h = gen.normal([T * B, H])
  dz = gen.normal([T * B, G * H])
  steps = tf.constant(T)

  # The trip count is an argument, so XLA cannot unroll the loop either.
  @tf.function(jit_compile=True)
  def forward_sequential(h0, u, steps):
    def body(t, h):
      return t + 1, tf.tanh(tf.matmul(h, u)[:, :H])
    return tf.while_loop(lambda t, _: t < steps, body, (0, h0))[1]

  @tf.function(jit_compile=True)
  def backward_sequential(dz0, u, steps):
    def body(t, dz):
      dh = tf.matmul(dz, u, transpose_b=True)
      return t + 1, tf.tanh(tf.tile(dh, [1, G]))
    return tf.while_loop(lambda t, _: t < steps, body, (0, dz0))[1]

  matmul = tf.function(tf.linalg.matmul, jit_compile=True)
  # Arguments, not captured constants: XLA would fold a GEMM of constants.
  return {
      "h @ U (sequential)": lambda: forward_sequential(h0, u, steps),
      "dz @ U^T (sequential)": lambda: backward_sequential(dz0, u, steps),
      "x @ W": lambda: matmul(x, w),
      "dx = dz @ W^T": lambda: matmul(dz, w, transpose_b=True),
      "dW = x^T @ dz": lambda: matmul(x, dz, transpose_a=True),
      "dU = h^T @ dz": lambda: matmul(h, dz, transpose_a=True),
  }


def dispatch_ms() -> float:
  """Median ms of calling an XLA program that does (almost) nothing.

  A training step pays this once; the floor's six programs would pay it six
  times (0.12 ms each here: 0.7 ms of the 4.9 ms floor of LSTM(16) at B=32),
  so each part is counted without it.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  null = tf.function(lambda a, b: a[0, 0] + b[0, 0], jit_compile=True)
  a = tf.ones([4, 4])
  return interleaved_medians({"null": lambda: null(a, a)}, reps())["null"] * 1e3


def gemm_floor(row: Row) -> Tuple[Dict[str, float], float]:
  """Median ms of each of the six GEMM programs, timed one at a time, less
  the cost of calling a program; and that cost."""
  overhead = dispatch_ms()
  parts = {}
  for name, program in gemm_programs(row).items():
    seconds = interleaved_medians({name: program}, reps())[name]
    parts[name] = max(0.0, seconds * 1e3 - overhead)
  return parts, overhead


def child(spec: str) -> None:
  """Measures one row, `cell:B:T:D:H`, and prints it for `json_of_child`."""
  cell, *dims = spec.split(":")
  row = (cell,) + tuple(int(v) for v in dims)
  figures = time_models(row)
  parts, overhead = gemm_floor(row)
  print_result({"environment": environment(), "modes": figures,
                "gemm_ms": parts, "dispatch_ms": overhead,
                "floor_ms": sum(parts.values())})


def torch_child(spec: str) -> None:
  """torch's training step of one row, `cell:B:T:D:H`, median ms."""
  import torch  # pylint: disable=g-import-not-at-top
  # Before any torch op starts the worker threads, which inherit the mode.
  torch.set_flush_denormal(True)
  torch.set_num_threads(2)
  cell, *dims = spec.split(":")
  B, T, D, H = (int(v) for v in dims)
  torch.manual_seed(0)
  rnn = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(
      D, H, batch_first=True)
  head = torch.nn.Linear(H, 1)
  optimizer = torch.optim.Adam(list(rnn.parameters()) + list(head.parameters()))
  x, y = torch.randn(B, T, D), torch.randn(B, 1)

  def step():
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(head(rnn(x)[0][:, -1]), y)
    loss.backward()
    optimizer.step()
    return loss.item()

  seconds = interleaved_medians({"torch": step}, reps(), warmup=WARMUP)
  print_result({"torch_ms": seconds["torch"] * 1e3,
                "torch": torch.__version__,
                "threads": torch.get_num_threads()})


# The parent: rows in children, the JSON lines and the table.


def torch_wanted() -> bool:
  if os.environ.get("TORCH", "1") == "0":
    return False
  import importlib.util  # pylint: disable=g-import-not-at-top
  return importlib.util.find_spec("torch") is not None


def target(mode: Dict[str, float], floor: Optional[float]) -> str:
  if mode["ratio"] >= TARGET_SPEEDUP or (
      floor is not None and mode["ours_ms"] <= TARGET_FLOOR * floor):
    return "met"
  return "not met"


def measure(row: Row, with_torch: bool) -> Optional[Dict[str, object]]:
  """One row: its child's figures, torch's, and the targets."""
  spec = ":".join(str(v) for v in row)
  # Other processes' load, to tell a row measured on a busy machine.
  load = os.getloadavg()[0]
  start = time.perf_counter()
  result = json_of_child(MODULE, [f"--child={spec}"])
  if result is None:
    return None
  cell, B, T, D, H = row
  # The environment goes to the file's first line, not to every row.
  out = {"row": row_name(row), "cell": cell, "B": B, "T": T, "D": D, "H": H,
         "reps": reps(), "loadavg": load,
         "environment": result["environment"]}
  for mode in modes():
    figures = result["modes"][mode]
    out[mode] = {**figures, "target": target(figures, result["floor_ms"])}
  out["floor_ms"] = result["floor_ms"]
  out["gemm_ms"] = result["gemm_ms"]
  out["dispatch_ms"] = result["dispatch_ms"]
  out["torch_ms"] = None
  if with_torch:
    peer = json_of_child(MODULE, [f"--torch_child={spec}"])
    if peer is not None:
      out["torch_ms"] = peer["torch_ms"]
      out["environment"]["torch"] = peer["torch"]
  out["seconds"] = time.perf_counter() - start
  return out


def table(rows: List[Dict[str, object]]) -> str:
  """The markdown table of the rows run."""
  def ms(value):
    return "-" if value is None else f"{value:.1f}"
  header = ["cell", "B, T, D", "H"]
  for mode in modes():
    suffix = " XLA" if MODES[mode] else ""
    header += [f"Keras{suffix} ms", f"ours{suffix} ms", f"Keras/ours{suffix}",
               f"target{suffix}"]
  header += ["torch ms", "GEMM floor ms"]
  lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
  for r in rows:
    cells = [r["cell"].upper(), f"{r['B']}, {r['T']}, {r['D']}", str(r["H"])]
    for mode in modes():
      m = r[mode]
      cells += [ms(m["keras_ms"]), ms(m["ours_ms"]), f"{m['ratio']:.2f}",
                m["target"]]
    cells += [ms(r["torch_ms"]), ms(r["floor_ms"])]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main() -> int:
  if any(a.startswith("--child=") for a in sys.argv[1:]):
    child(sys.argv[1].split("=", 1)[1])
    return 0
  if any(a.startswith("--torch_child=") for a in sys.argv[1:]):
    torch_child(sys.argv[1].split("=", 1)[1])
    return 0
  only = os.environ.get("ONLY", "")
  rows = [row for row in grid() if selected(row, only)]
  if not rows:
    print(f"ONLY={only!r} selects no row; the rows are "
          f"{', '.join(row_name(r) for r in grid())}.", file=sys.stderr)
    return 2
  out_path = os.environ.get("OUT", os.path.join(ROOT, "benchmarks",
                                                "shapes.json"))
  with_torch = torch_wanted()
  print(f"{len(rows)} row(s), REPS={reps()}, torch: "
        f"{'yes' if with_torch else 'no'}; writing {out_path}; {load_note()}",
        flush=True)
  done, failed = [], []
  with open(out_path, "w") as f:
    for row in rows:
      result = measure(row, with_torch)
      if result is None:
        failed.append(row_name(row))
        continue
      env = result.pop("environment")
      if not done:
        print(f"CPU: {env['cpu']} ({env['cpu_flags']}); TensorFlow "
              f"{env['tensorflow']}, Keras {env['keras']}"
              + (f", torch {env['torch']}" if "torch" in env else ""),
              flush=True)
        f.write(json.dumps({"environment": env}) + "\n")
      f.write(json.dumps(result) + "\n")
      f.flush()
      done.append(result)
      print(f"  {result['row']:14s} " + "  ".join(
          f"{mode}: Keras {result[mode]['keras_ms']:.1f} ours "
          f"{result[mode]['ours_ms']:.1f} ms ({result[mode]['ratio']:.2f}x)"
          for mode in modes()) +
            f"  torch {result['torch_ms'] or float('nan'):.1f}"
            f"  floor {result['floor_ms']:.1f}  [{result['seconds']:.0f} s]",
            flush=True)
  return print_table(
      f"Training step (train_on_batch), median of {reps()} interleaved "
      "calls in ms; Keras/ours above 1: ours is faster; target: ours >= "
      f"{TARGET_SPEEDUP}x Keras or <= {TARGET_FLOOR}x the GEMM floor.",
      table(done), failed)


if __name__ == "__main__":
  sys.exit(main())
