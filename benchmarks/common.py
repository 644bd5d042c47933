"""What every benchmark here shares: the environment line and peak memory."""

import platform
import resource
from typing import Dict


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
