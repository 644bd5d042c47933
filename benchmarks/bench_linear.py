r"""Linear recurrent layers' training step: MinGRU, MinLSTM and RG-LRU against
LSTM and GRU layers, their floor and JAX, time and memory per step.

One training step (forward over T steps, a loss over every step's output,
the gradients of all weights; the inputs are constants) of a layer with
B=32, D=H=256, float32, for:

* `tf_recurrent.MinGRU`, `MinLSTM`, `RGLRU`: `gated_scan`, the gates and
  the recurrence as one chunked custom gradient keeping only h;
* their floors: the same gate projection and activations over the whole
  sequence, and one multiply-add per step from a fixed state (h_t = 0.5 a_t
  + b_t) instead of the recurrence, differentiated by TensorFlow: what the
  layer costs without its sequential part;
* `tf_recurrent.LSTM`/`GRU` and `keras.layers.LSTM`/`GRU` (use_cudnn=False),
  H=256 units;
* JAX (when installed; jit, counted in the XLA mode): the same minGRU, its
  gates over the whole sequence then `lax.scan` or `lax.associative_scan`
  over (a, b), differentiated by `jax.grad`.

Without XLA and with `jit_compile=True`. Reported:

* time: per mode and T, the steps of every row run in turn, round after
  round (after one untimed warm-up call each: trace, compile), and the
  median per row, in microseconds per time step; ratios within the run:
  `tf_recurrent.LSTM`'s time over each layer's (the speed-up) and each
  layer's over its floor. A row is skipped at a length where one step is
  predicted to take longer than --max_row_seconds over the warm-up and the
  rounds (its time there, scaled by the lengths and by the growth of its
  time per step between the last two lengths: autodiff under XLA grows
  faster than T; the linear layers are timed at every length), or to need
  more memory than the machine has (its peak extrapolated from its memory
  slope); the reason is recorded;
* memory: the peak RSS of one step at two lengths (--memory_lengths),
  each in a fresh process (start-up and compile costs cancel), and the
  slope between them: the bytes each extra step costs, also as a multiple
  of one state `[B, H]` (an LSTM's state is two). What the harness itself
  keeps per step (the inputs x, D = H, the outputs, the loss's gradient)
  is the slope of its own memory-only row, `harness (outputs = w x)`: the
  same step around a layer that multiplies its inputs by one weight; the
  report gives each row's slope beyond it. Measured for the harness, the
  linear layers, the LSTM layers and JAX's rows (--memory_rows;
  bench_lstm measures the GRU layers'), before the first
  length past --memory_lengths is timed: a row whose peak, extrapolated,
  would not fit in memory is skipped there. A row whose step at the
  longer length would take too long is measured at --short_memory_lengths.

The floors are timed up to --floor_max_length (4096): the targets compare
with them at 1024 and 4096, and the run stays within its budget.

`--sweep_chunk` times instead the training step of `tf_recurrent.MinGRU`
and of `tf_recurrent.linear_scan` (a, b given) at --chunk_sizes, in turn,
at --sweep_lengths in both modes: the data for `chunk_size="auto"`.

Usage (the full run and the sweep on a quiet machine):

    python -m benchmarks.bench_linear                # full run (~15 min)
    python -m benchmarks.bench_linear --quick        # T=256,1024 (~5 min)
    python -m benchmarks.bench_linear --sweep_chunk  # chunk sizes (~4 min)
    python -m benchmarks.bench_linear --lengths=8,16 --batch=2 --hidden=4 \
        --memory_lengths=8,16 --rounds=1 --out_dir=/tmp/b

Writes linear.json (linear_chunks.json for --sweep_chunk) into --out_dir and
renders LINEAR.md there from every linear*.json and char_lm.json present
(`benchmarks/linear_report.py`).
"""

import gc
import sys
import time
from typing import Callable, Dict, List, Optional

from absl import app
from absl import flags

from benchmarks import linear_report
from benchmarks import linear_steps
from benchmarks.common import cpu_model
from benchmarks.common import environment
from benchmarks.common import interleaved_medians
from benchmarks.common import load_note
from benchmarks.common import memory_at_hand
from benchmarks.common import peak_rss_slope
from benchmarks.common import predicted_seconds
from benchmarks.common import run_child

FLAGS = flags.FLAGS
# The rows whose memory the full run measures (both modes): bench_lstm
# measures the GRU layers' (RESULTS.md); the floors' is autodiff's of their
# gates.
MEMORY_ROWS = ([linear_steps.HARNESS] + linear_steps.LINEAR +
               ["tf_recurrent.LSTM", "keras.layers.LSTM"] + linear_steps.JAX)
flags.DEFINE_list("lengths", ["256", "1024", "4096", "16384"],
                  "Sequence lengths T.")
flags.DEFINE_integer("batch", 32, "Batch size B.")
flags.DEFINE_integer("hidden", 256, "Units H, and input features D = H.")
flags.DEFINE_integer("rounds", 3, "Interleaved timed rounds (median kept).")
flags.DEFINE_float("max_row_seconds", 40.0,
                   "Skip a row at a length where its warm-up and rounds are "
                   "predicted to take longer than this.")
flags.DEFINE_list("memory_lengths", ["512", "2048"],
                  "Two lengths for the memory slope.")
flags.DEFINE_list("short_memory_lengths", ["64", "256"],
                  "The memory slope's lengths for a row too slow at the "
                  "longer of --memory_lengths (as --max_row_seconds says).")
flags.DEFINE_list("memory_rows", MEMORY_ROWS,
                  "The rows whose memory is measured (both modes).")
flags.DEFINE_bool("memory", True, "Measure the memory slopes.")
flags.DEFINE_integer("floor_max_length", 4096,
                     "Time the floors up to this length (the targets compare "
                     "with them at T=1024 and 4096).")
flags.DEFINE_string("chunk_size", "auto", "The linear layers' chunk_size.")
flags.DEFINE_list("only", [], "Run only these rows (implementation names).")
flags.DEFINE_list("modes", ["tf", "xla"], "TF executor, XLA, or both.")
flags.DEFINE_bool("quick", False,
                  "T=256,1024 only, the memory of the linear layers and "
                  "tf_recurrent.LSTM at 256,1024 (flags given explicitly "
                  "win).")
flags.DEFINE_bool("sweep_chunk", False,
                  "Time the scans at --chunk_sizes instead.")
flags.DEFINE_list("chunk_sizes", ["16", "32", "64", "128", "256"],
                  "The chunk sizes of --sweep_chunk.")
flags.DEFINE_list("sweep_lengths", ["1024", "4096"],
                  "The lengths of --sweep_chunk.")
flags.DEFINE_string("out_dir", linear_report.DEFAULT_DIR,
                    "Where to write the results.")
flags.DEFINE_string("child", "", "Internal: measure one case and exit.")

LINEAR, LSTM, FLOORS, JAX, SWEPT = (
    linear_steps.LINEAR, linear_steps.LSTM, linear_steps.FLOORS,
    linear_steps.JAX, linear_steps.SWEPT)
# What --quick changes (about 5 minutes on a quiet 2-core machine).
QUICK = {"lengths": ["256", "1024"], "memory_lengths": ["256", "1024"],
         "memory_rows": [linear_steps.HARNESS] + LINEAR + [LSTM]}


def build_step(name: str, steps: int, jit: bool) -> Callable[[], object]:
  """Row `name`'s training step at T=`steps` (JAX rows are always jit)."""
  if name in JAX:
    return linear_steps.jax_step(name, steps, FLAGS.batch, FLAGS.hidden)
  return linear_steps.tf_step(name, steps, jit, FLAGS.batch, FLAGS.hidden,
                              linear_steps.chunk_size_of(FLAGS.chunk_size))


def rows_of_mode(jit: bool) -> List[str]:
  """The rows of one mode, in report order: JAX with XLA, when installed."""
  names = list(linear_steps.TF_ROWS)
  if jit:
    try:
      import jax  # pylint: disable=g-import-not-at-top,unused-import
      names += JAX
    except ImportError:
      print("jax is not installed (pip install -e '.[bench]'): JAX rows "
            "skipped")
  return [n for n in names if not FLAGS.only or n in FLAGS.only]


def _shape_args() -> List[str]:
  return [f"--batch={FLAGS.batch}", f"--hidden={FLAGS.hidden}",
          f"--chunk_size={FLAGS.chunk_size}"]


def _state_bytes() -> int:
  return 4 * FLAGS.batch * FLAGS.hidden


class Row:
  """One row (implementation, mode) as the run fills it in."""

  def __init__(self, name: str, jit: bool):
    self.name, self.jit = name, jit
    self.us_per_step: Dict[str, float] = {}
    self.skipped: Dict[str, str] = {}
    self.memory: Optional[dict] = None
    # Seconds to build, trace, compile and run the first step.
    self.first_call: Dict[str, float] = {}
    # Seconds of one step at each length timed, for the predictions.
    self.seconds: Dict[int, float] = {}

  def first_skipped(self) -> Optional[int]:
    return min((int(t) for t in self.skipped), default=None)

  def to_json(self) -> dict:
    return {"name": self.name, "xla": self.jit,
            "us_per_step": self.us_per_step, "skipped": self.skipped,
            "memory": self.memory, "first_call_seconds": self.first_call}


def _predicted_peak(row: Row, steps: int) -> Optional[float]:
  memory = row.memory or {}
  if memory.get("bytes_per_step") is None:
    return None
  longer = memory["lengths"][1]
  return memory["peaks"][1] + memory["bytes_per_step"] * (steps - longer)


def too_slow(row: Row, steps: int) -> Optional[str]:
  """Why one step of `row` at `steps` would take too long (None: it would
  not): its warm-up and rounds predicted over --max_row_seconds. The linear
  layers, the run's subject, are never too slow."""
  if row.name in LINEAR:
    return None
  seconds = predicted_seconds(row.seconds, steps)
  runs = 1 + FLAGS.rounds
  if seconds is None or seconds * runs <= FLAGS.max_row_seconds:
    return None
  last = max(row.seconds)
  return (f"predicted {seconds:.1f} s a step ({runs} runs: "
          f"{seconds * runs:.0f} s > --max_row_seconds="
          f"{FLAGS.max_row_seconds:.0f}) from {row.seconds[last]:.2f} s at "
          f"T={last}")


def skip_reason(row: Row, steps: int) -> Optional[str]:
  """Why row is not timed at `steps` (None: it is)."""
  first = row.first_skipped()
  if first is not None and first < steps:
    return f"skipped at T={first} already"
  if row.name in FLOORS and steps > FLAGS.floor_max_length:
    return (f"floors are timed up to T={FLAGS.floor_max_length} "
            "(--floor_max_length; the targets compare with them at T=1024 "
            "and 4096)")
  reason = too_slow(row, steps)
  if reason is not None:
    return reason
  peak = _predicted_peak(row, steps)
  have = memory_at_hand()
  if peak is not None and peak > 0.9 * have:
    return (f"predicted peak {peak / 2**30:.1f} GB (its memory slope) > 90% "
            f"of the {have / 2**30:.1f} GB at hand")
  return None


def time_length(rows: List[Row], steps: int) -> None:
  """Interleaved medians of the rows' steps at `steps` (skips recorded)."""
  mode = "XLA" if rows and rows[0].jit else "TF"
  built = {}
  for row in rows:
    reason = skip_reason(row, steps)
    if reason is None:
      try:  # Built and warmed up (traced, compiled) alone.
        start = time.perf_counter()
        built[row.name] = build_step(row.name, steps, row.jit)
        built[row.name]()
        row.first_call[str(steps)] = time.perf_counter() - start
      except Exception as e:  # pylint: disable=broad-except
        built.pop(row.name, None)
        reason = f"failed: {type(e).__name__}: {str(e)[:200]}"
    if reason is not None:
      row.skipped[str(steps)] = reason
      print(f"  {row.name:36s} {mode:3s} T={steps:5d} skipped: {reason}",
            flush=True)
  medians = (interleaved_medians(built, FLAGS.rounds, warmup=0) if built
             else {})
  for row in rows:
    if row.name in medians:
      row.seconds[steps] = medians[row.name]
      row.us_per_step[str(steps)] = medians[row.name] / steps * 1e6
      print(f"  {row.name:36s} {mode:3s} T={steps:5d} "
            f"{row.us_per_step[str(steps)]:9.1f} us/step (first call "
            f"{row.first_call[str(steps)]:.1f} s)", flush=True)
  del built
  gc.collect()


def memory_lengths_of(row: Row) -> Optional[List[int]]:
  """The memory slope's lengths for `row`: --memory_lengths, or the short
  ones where a step at the longer would take too long (None: both would,
  or the row was not timed at all)."""
  if row.skipped and not row.seconds:
    return None
  for pair in (FLAGS.memory_lengths, FLAGS.short_memory_lengths):
    lengths = [int(t) for t in pair]
    if too_slow(row, lengths[1]) is None:
      return lengths
  return None


def measure_memory(rows: List[Row], jit: bool) -> None:
  """The memory slopes of the rows --memory_rows names; the harness's row
  (memory only) joins `rows` first if named."""
  if linear_steps.HARNESS in FLAGS.memory_rows:
    rows.insert(0, Row(linear_steps.HARNESS, jit))
  for row in rows:
    if row.name not in FLAGS.memory_rows:
      continue
    lengths = memory_lengths_of(row)
    if lengths is None:
      row.memory = {"skipped": "too slow at every memory length"}
      continue
    slope = peak_rss_slope("benchmarks.bench_linear", row.name, row.jit,
                           lengths, _shape_args(), _state_bytes())
    row.memory = {"lengths": lengths, **slope}
    vs = slope["vs_state"]
    print(f"  {row.name:36s} {'XLA' if row.jit else 'TF':3s} memory "
          f"T={lengths[0]},{lengths[1]}: "
          f"{'failed' if vs is None else f'{vs:.2f} x state'}", flush=True)


def run_mode(jit: bool, lengths: List[int]) -> List[Row]:
  """Times every row of one mode at `lengths`, measuring memory before the
  first length past --memory_lengths (its peaks predict what fits)."""
  rows = [Row(name, jit) for name in rows_of_mode(jit)]
  measured = not FLAGS.memory
  longest = int(FLAGS.memory_lengths[1])
  for steps in lengths:
    if not measured and steps > longest:
      measure_memory(rows, jit)
      measured = True
    time_length(rows, steps)
  if not measured:
    measure_memory(rows, jit)
  return rows


def sweep(modes: List[bool]) -> dict:
  """Microseconds per step of each swept scan at each chunk size."""
  chunks = [int(c) for c in FLAGS.chunk_sizes]
  rows = []
  for jit in modes:
    for steps in [int(t) for t in FLAGS.sweep_lengths]:
      built = {(name, chunk): linear_steps.sweep_step(
          name, steps, jit, FLAGS.batch, FLAGS.hidden, chunk)
               for name in SWEPT for chunk in chunks}
      medians = interleaved_medians(
          {f"{n} chunk={c}": step for (n, c), step in built.items()},
          FLAGS.rounds)
      for name in SWEPT:
        times = {str(c): medians[f"{name} chunk={c}"] / steps * 1e6
                 for c in chunks}
        rows.append({"name": name, "xla": jit, "length": steps,
                     "us_per_step": times})
        print(f"  {name:26s} {'XLA' if jit else 'TF':3s} T={steps:5d} " +
              " ".join(f"{c}:{v:.1f}" for c, v in times.items()), flush=True)
      del built
      gc.collect()
  return {"chunk_sizes": chunks, "lengths": [int(t) for t in
                                             FLAGS.sweep_lengths],
          "rows": rows}


def main(argv):
  del argv
  if FLAGS.child:
    run_child(build_step, FLAGS.child)
    return
  started = time.perf_counter()
  if FLAGS.quick:
    for name, value in QUICK.items():
      if not FLAGS[name].present:
        FLAGS[name].value = list(value)
  from tf_recurrent.linear import chunks  # pylint: disable=g-import-not-at-top
  print(f"CPU: {cpu_model()}; {load_note()}", flush=True)
  modes = [mode == "xla" for mode in FLAGS.modes]
  results = {"environment": environment(), "load": load_note(),
             "command": " ".join(["python -m benchmarks.bench_linear"] +
                                 sys.argv[1:]),
             "shape": {"B": FLAGS.batch, "D": FLAGS.hidden,
                       "H": FLAGS.hidden},
             "rounds": FLAGS.rounds, "auto_chunk": chunks.AUTO_CHUNK,
             "chunk_size": FLAGS.chunk_size, "state_bytes": _state_bytes()}
  if FLAGS.sweep_chunk:
    results.update(sweep(modes), wall_seconds=time.perf_counter() - started)
    linear_report.write(FLAGS.out_dir, linear_report.CHUNKS, results)
    return
  lengths = sorted(int(t) for t in FLAGS.lengths)
  rows = []
  for jit in modes:
    rows += [row.to_json() for row in run_mode(jit, lengths)]
  results.update(lengths=lengths, rows=rows,
                 memory_lengths=[int(t) for t in FLAGS.memory_lengths],
                 max_row_seconds=FLAGS.max_row_seconds,
                 wall_seconds=time.perf_counter() - started)
  linear_report.write(FLAGS.out_dir, linear_report.STEP, results)


if __name__ == "__main__":
  app.run(main)
