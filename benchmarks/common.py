"""What every benchmark here shares: the environment line and peak memory."""

import concurrent.futures
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional


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


def peak_rss_of_child(module: str, args: List[str],
                      env: Optional[Dict[str, str]] = None) -> Optional[int]:
  """Runs `python -m module args` (which prints `PEAK_RSS <bytes>`) in a
  fresh process from the repository root, with `env` added to the
  environment; its peak, or None if it failed."""
  proc = subprocess.run(
      [sys.executable, "-m", module] + args, capture_output=True, text=True,
      check=False, env={**os.environ, **(env or {})},
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  lines = [l for l in proc.stdout.splitlines() if l.startswith("PEAK_RSS")]
  if proc.returncode != 0 or not lines:
    print(f"  memory {module} {args[0]} failed: {proc.stderr[-500:]}")
    return None
  return int(lines[0].split()[1])


def peak_rss_of_children(module: str, arg_lists: List[List[str]],
                         env: Optional[Dict[str, str]] = None
                         ) -> List[Optional[int]]:
  """`peak_rss_of_child` for each argument list, two processes at a time.

  A peak RSS is one process's own, so running two at once (one per core)
  changes no figure, only halves the wait.
  """
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    return list(pool.map(lambda args: peak_rss_of_child(module, args, env),
                         arg_lists))


def run_child(build_step: Callable[[str, int, bool], Callable[[], object]],
              spec: str) -> None:
  """A memory child's body: one step of the case `name|jit|length` (jit "1"
  or "0"), then its peak RSS printed for `peak_rss_of_child`."""
  name, jit, length = spec.rsplit("|", 2)
  build_step(name, int(length), jit == "1")()
  print(f"PEAK_RSS {peak_rss_bytes()}")


def peak_rss_slope(module: str, name: str, jit: bool, lengths: List[int],
                   args: List[str], state_bytes: int,
                   per: str = "step") -> Dict[str, object]:
  """The peak RSS of one step of `name` at two lengths, each in its own
  process (`module --child=name|jit|length args`), and the slope between
  them: bytes per extra `per`, and as a multiple of `state_bytes`."""
  peaks = peak_rss_of_children(module, [
      [f"--child={name}|{int(jit)}|{t}"] + args for t in lengths])
  if None in peaks:
    return {"peaks": peaks, f"bytes_per_{per}": None, "vs_state": None}
  slope = (peaks[1] - peaks[0]) / (lengths[1] - lengths[0])
  return {"peaks": peaks, f"bytes_per_{per}": slope,
          "vs_state": slope / state_bytes}


def environment() -> Dict[str, str]:
  """TensorFlow, JAX (when installed), CPU and Python versions."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
    cpu = f"{names[0]} x{len(names)}" if names else cpu
  except OSError:
    pass
  env = {"tensorflow": tf.__version__, "cpu": cpu,
         "python": platform.python_version()}
  try:
    import jax  # pylint: disable=g-import-not-at-top
    env["jax"] = jax.__version__
  except ImportError:
    pass
  return env


def best_seconds(step: Callable[[], object], repeats: int) -> float:
  """Warms `step` up (trace, compile), then the best of `repeats` runs."""
  step()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    step()
    best = min(best, time.perf_counter() - start)
  return best


def jax_lstm_step(T: int, B: int, D: int, H: int, checkpoint: bool,
                  final_only: bool) -> Callable[[], object]:
  """One jitted JAX LSTM training step with lax.scan (the peer to beat).

  Args:
    T, B, D, H: Steps, batch, input features, units.
    checkpoint: Wrap the cell in `jax.checkpoint` (recompute on backward).
    final_only: The loss reads only the final h, else every step's h.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  params = (jax.random.normal(k1, (D, 4 * H)) * 0.05,
            jax.random.normal(k2, (H, 4 * H)) * 0.05, jnp.zeros(4 * H))
  x = jax.random.normal(k3, (T, B, D))

  def cell(params, carry, x_t):
    kernel, recurrent_kernel, bias = params
    h, c = carry
    z = x_t @ kernel + h @ recurrent_kernel + bias
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
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
