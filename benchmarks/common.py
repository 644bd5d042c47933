"""What every benchmark here shares: the environment line, peak memory,
interleaved medians, fresh child processes, and the profiles' choice of
layer."""

import concurrent.futures
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a child prints before its JSON result, for `json_of_child`.
RESULT_PREFIX = "RESULT "


def define_layer_flags(hidden: int) -> None:
  """Flags naming one recurrent layer, its shapes and whose layers to profile
  (`profile_ops`, `profile_xla`); `hidden` is the default H."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("layer", "LSTM", "LSTM, GRU or SimpleRNN.")
  flags.DEFINE_integer("batch", 256, "Batch size B.")
  flags.DEFINE_integer("steps", 120, "Sequence length T.")
  flags.DEFINE_integer("input", 8, "Input features D.")
  flags.DEFINE_integer("hidden", hidden, "Units H.")
  flags.DEFINE_list("impls", ["ours", "keras"], "Whose layer, in this order.")


def layer_module(impl: str):
  """`(public name, module)` of whose layers: "ours" (tf_recurrent) or
  "keras" (keras.layers; Keras before 3.6 reports it as keras.api.layers)."""
  if impl == "ours":
    import tf_recurrent  # pylint: disable=g-import-not-at-top
    return "tf_recurrent", tf_recurrent
  import keras  # pylint: disable=g-import-not-at-top
  return "keras.layers", keras.layers


def peak_rss_bytes() -> int:
  """This process's peak resident set size.

  VmHWM, not getrusage's ru_maxrss: on Linux ru_maxrss survives exec, so a
  child started by a large parent reports the parent's size.
  """
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _run_module(module: str, args: List[str], env: Optional[Dict[str, str]],
                python: Optional[str] = None) -> subprocess.CompletedProcess:
  """`python -m module args` in a fresh process from the repository root,
  with `env` added to the environment, its output captured; `python` is
  this one's interpreter unless given (another venv's, say)."""
  return subprocess.run(
      [python or sys.executable, "-m", module] + args, capture_output=True,
      text=True, check=False, env={**os.environ, **(env or {})}, cwd=ROOT)


def peak_rss_of_child(module: str, args: List[str],
                      env: Optional[Dict[str, str]] = None,
                      python: Optional[str] = None) -> Optional[int]:
  """Runs `python -m module args` (which prints `PEAK_RSS <bytes>`) in a
  fresh process from the repository root, with `env` added to the
  environment (`python`: see `_run_module`); its peak, or None if it
  failed."""
  proc = _run_module(module, args, env, python)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("PEAK_RSS")]
  if proc.returncode != 0 or not lines:
    print(f"  memory {module} {args[0]} failed: {proc.stderr[-500:]}")
    return None
  return int(lines[0].split()[1])


def memory_at_hand() -> int:
  """The bytes this process's steps may take: its resident memory (which
  they reuse) and the memory available."""
  def kb(path, key):
    with open(path) as f:
      return next(int(l.split()[1]) for l in f if l.startswith(key))
  return (kb("/proc/meminfo", "MemAvailable:") +
          kb("/proc/self/status", "VmRSS:")) * 1024


def print_result(result: Any) -> None:
  """A child's last word: `result` as one JSON line for `json_of_child`."""
  print(RESULT_PREFIX + json.dumps(result), flush=True)


def json_of_child(module: str, args: List[str],
                  env: Optional[Dict[str, str]] = None,
                  python: Optional[str] = None) -> Optional[Any]:
  """Runs `python -m module args` in a fresh process (see `_run_module`) and
  returns what it gave `print_result`, or None (with its stderr's tail
  printed) if it failed.

  A fresh process is what a user's first call meets: nothing traced, no
  function cached, no kernel warmed up by an earlier case.
  """
  proc = _run_module(module, args, {"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
                     python)
  lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_PREFIX)]
  if proc.returncode != 0 or not lines:
    print(f"  child {module} {' '.join(args)} failed "
          f"(exit {proc.returncode}): {proc.stderr[-2000:]}", flush=True)
    return None
  return json.loads(lines[-1][len(RESULT_PREFIX):])


def peak_rss_of_children(module: str, arg_lists: List[List[str]],
                         env: Optional[Dict[str, str]] = None,
                         python: Optional[str] = None
                         ) -> List[Optional[int]]:
  """`peak_rss_of_child` for each argument list, two processes at a time.

  A peak RSS is one process's own, so running two at once (one per core)
  changes no figure, only halves the wait.
  """
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    return list(pool.map(
        lambda args: peak_rss_of_child(module, args, env, python), arg_lists))


def run_child(build_step: Callable[[str, int, bool], Callable[[], object]],
              spec: str) -> None:
  """A memory child's body: one step of the case `name|jit|length` (jit "1"
  or "0"), then its peak RSS printed for `peak_rss_of_child`."""
  name, jit, length = spec.rsplit("|", 2)
  build_step(name, int(length), jit == "1")()
  print(f"PEAK_RSS {peak_rss_bytes()}")


def peak_rss_slope(module: str, name: str, jit: bool, lengths: List[int],
                   args: List[str], state_bytes: int,
                   per: str = "step", repeats: int = 1,
                   python: Optional[str] = None) -> Dict[str, object]:
  """The peak RSS of one step of `name` at two lengths, each in its own
  process (`module --child=name|jit|length args`, run by `python`: see
  `_run_module`), and the slope between them: bytes per extra `per`, and as
  a multiple of `state_bytes`. With `repeats`, each length's peak is the
  median of that many processes (the allocator moves a peak by tens of MB
  between identical runs)."""
  peaks = peak_rss_of_children(module, [
      [f"--child={name}|{int(jit)}|{t}"] + args
      for _ in range(repeats) for t in lengths], python=python)
  if None in peaks:
    return {"peaks": peaks, f"bytes_per_{per}": None, "vs_state": None}
  low, high = (statistics.median(peaks[i::2]) for i in (0, 1))
  slope = (high - low) / (lengths[1] - lengths[0])
  return {"peaks": peaks, f"bytes_per_{per}": slope,
          "vs_state": slope / state_bytes}


# The CPU flags that move these figures: the vector width XLA and oneDNN
# use, and the bf16/int8 tiles (AMX) that oneDNN uses and XLA does not.
NOTABLE_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
                     "amx_tile", "amx_bf16", "amx_int8")


def print_table(caption: str, table: str, failed: List[str]) -> int:
  """Prints a run's caption, its markdown table and the rows that failed;
  the run's exit status (1 if any row failed)."""
  print()
  print(caption)
  print()
  print(table)
  if failed:
    print(f"\nFailed: {', '.join(failed)}")
  return 1 if failed else 0


def cpu_model() -> str:
  """`lscpu`'s model name and the CPU count, e.g. "Intel(R) Xeon(R) ... x2".

  Falls back to /proc/cpuinfo (the same name on x86) where lscpu is missing.
  """
  names = []
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True,
                         check=False, env={**os.environ, "LC_ALL": "C"}).stdout
    names = [l.split(":", 1)[1].strip() for l in out.splitlines()
             if l.startswith("Model name:")]
  except OSError:
    pass
  if not names:
    try:
      with open("/proc/cpuinfo") as f:
        names = [l.split(":", 1)[1].strip() for l in f
                 if l.startswith("model name")]
    except OSError:
      pass
  if not names:
    return platform.processor() or platform.machine()
  return f"{names[0]} x{os.cpu_count()}"


def cpu_flags() -> List[str]:
  """Which of `NOTABLE_CPU_FLAGS` this CPU has: on two 2-core machines, one
  with AVX-512 and AMX, one Keras/ours ratio was 1.61x and 1.20x."""
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((l.split(":", 1)[1].split() for l in f
                    if l.startswith("flags")), [])
  except OSError:
    return []
  return [flag for flag in NOTABLE_CPU_FLAGS if flag in flags]


def load_note() -> str:
  """The 1-minute load average, with a warning when other processes keep
  the machine busy: interleaving evens out a slow-down between two layers,
  but not one between runs, and torch's spinning threads suffer most."""
  load = os.getloadavg()[0]
  note = f"load average {load:.2f}"
  if load > 0.5:
    note += (" - WARNING: other processes are busy and the figures will be "
             "off; run on a quiet machine")
  return note


def environment() -> Dict[str, str]:
  """TensorFlow, Keras, JAX (when installed), CPU and Python versions."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  env = {"tensorflow": tf.__version__, "keras": keras.__version__,
         "cpu": cpu_model(), "cpu_flags": " ".join(cpu_flags()),
         "python": platform.python_version()}
  try:
    import jax  # pylint: disable=g-import-not-at-top
    env["jax"] = jax.__version__
  except ImportError:
    pass
  return env


def training_step(outputs: Callable[[], Any], weights: List[Any],
                  jit: bool) -> Callable[[], object]:
  """The benchmarks' training step: the mean square of `outputs()`, its
  gradients of `weights`, in a `tf.function` (XLA when `jit`); the returned
  callable runs it and waits for the gradients."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function(jit_compile=jit)
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(outputs()))
    return tape.gradient(loss, weights)

  return lambda: [g.numpy() for g in step()]


def best_seconds(step: Callable[[], object], repeats: int) -> float:
  """Warms `step` up (trace, compile), then the best of `repeats` runs."""
  step()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    step()
    best = min(best, time.perf_counter() - start)
  return best


def predicted_seconds(seconds: Dict[int, float],
                      steps: int) -> Optional[float]:
  """One step's seconds at `steps` from `seconds` (one step's, by length):
  the last length's time scaled by the lengths, and by the growth of the
  time per step between the last two lengths, extrapolated as a power of
  the length (none if it fell); None without a timed length.

  Example:

  >>> predicted_seconds({100: 1.0}, 400)   # One length: linear.
  4.0
  >>> predicted_seconds({100: 1.0, 200: 4.0}, 400)   # Quadratic.
  16.0
  """
  timed = sorted(seconds)
  if not timed:
    return None
  last = timed[-1]
  growth = 1.0
  if len(timed) > 1:
    before = timed[-2]
    growth = max(1.0, (seconds[last] / last) / (seconds[before] / before))
    growth **= math.log(steps / last) / math.log(last / before)
  return seconds[last] * steps / last * growth


def write_results(out_dir: str, name: str, results: dict,
                  report_lines: List[str]) -> None:
  """Writes `results` as `<name>.json` and its report as `<NAME>.md` into
  `out_dir` (made if missing)."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
    json.dump(results, f, indent=1)
  with open(os.path.join(out_dir, f"{name.upper()}.md"), "w") as f:
    f.write("\n".join(report_lines) + "\n")


def interleaved_medians(steps: Dict[str, Callable[[], object]], rounds: int,
                        warmup: int = 1) -> Dict[str, float]:
  """Median seconds of each step, the steps run in turn round by round.

  Each round starts one step later in the order (two steps: A B, B A, A B,
  ...), so a machine that slows down or speeds up during the run (another
  process, frequency scaling) weighs on every step alike, and no step always
  runs right after the same other one. `warmup` untimed calls of each step
  first trace, compile and build its optimizer.
  """
  for step in steps.values():
    for _ in range(warmup):
      step()
  seconds = {name: [] for name in steps}
  names = list(steps)
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      start = time.perf_counter()
      steps[name]()
      seconds[name].append(time.perf_counter() - start)
  return {name: statistics.median(s) for name, s in seconds.items()}


def jax_lstm_step(T: int, B: int, D: int, H: int, checkpoint: bool,
                  final_only: bool,
                  layer_norm: bool = False) -> Callable[[], object]:
  """One jitted JAX LSTM training step with lax.scan (the peer to beat).

  Args:
    T, B, D, H: Steps, batch, input features, units.
    checkpoint: Wrap the cell in `jax.checkpoint` (recompute on backward).
    final_only: The loss reads only the final h, else every step's h.
    layer_norm: The cell of `benchmarks.custom_cells.UserLayerNormLSTMCell`:
      the input and the recurrent gate pre-activations, and c, each
      layer-normalized (epsilon 1e-3, a scale and an offset each).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  params = (jax.random.normal(k1, (D, 4 * H)) * 0.05,
            jax.random.normal(k2, (H, 4 * H)) * 0.05, jnp.zeros(4 * H))
  x = jax.random.normal(k3, (T, B, D))

  if layer_norm:  # A scale and an offset for each of the three norms.
    params += tuple(jnp.ones(n) if k % 2 == 0 else jnp.zeros(n)
                    for n in (4 * H, 4 * H, H) for k in range(2))

  def norm(x, scale, offset):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(variance + 1e-3) * scale + offset

  def cell(params, carry, x_t):
    kernel, recurrent_kernel, bias = params[:3]
    h, c = carry
    if layer_norm:
      z = (norm(x_t @ kernel, *params[3:5]) +
           norm(h @ recurrent_kernel, *params[5:7]) + bias)
    else:
      z = x_t @ kernel + h @ recurrent_kernel + bias
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(norm(c, *params[7:9]) if layer_norm
                                      else c)
    return (h, c), (None if final_only else h)

  if checkpoint:
    cell = jax.checkpoint(cell)

  def loss(params):
    zeros = jnp.zeros((B, H))
    (h, _), hs = jax.lax.scan(lambda carry, x_t: cell(params, carry, x_t),
                              (zeros, zeros), x)
    return jnp.mean(jnp.square(h if final_only else hs))

  grad = jax.jit(jax.grad(loss))
  return lambda: [g.block_until_ready() for g in grad(params)]
