"""Runs the tests with every option matrix whole (`--full`), in batches.

The option matrices run as all pairs plus the edges; after a change to the
loops, run their whole products (5,164 tests, not 2,293, on 2026-11-29):

    python tests/full_matrices.py                 # the whole suite
    python tests/full_matrices.py tests/chunked   # paths, as pytest takes them

A plain `pytest -n 2 --full` cannot finish on a 24 GiB machine: TensorFlow
keeps what each trace leaves in the runtime (XLA executables, function
libraries) for the life of the process, 6-20 MB for each Keras model
trained, ours and Keras's alike, and two workers grew past 13 GiB and
10 GiB halfway through. Here each batch of at most `--batch` consecutive
tests of one file runs in a pytest process of its own (two at a time,
each on one TensorFlow thread, as the xdist workers do), so memory is
bounded by a batch and a file's module fixtures are still shared within
it. Every batch's log is kept; the run ends with every failed test and a
nonzero exit status if any batch failed.
"""

import argparse
import concurrent.futures
import itertools
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import List, Sequence, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--full"]


def collect(paths: Sequence[str]) -> List[str]:
  """The node ids `pytest --full` collects under `paths`, in order."""
  proc = subprocess.run(PYTEST + ["--collect-only", *paths], cwd=ROOT,
                        capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    sys.exit(f"collecting failed (exit {proc.returncode}):\n"
             f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
  return [line for line in proc.stdout.splitlines() if "::" in line]


def batches(node_ids: Sequence[str], size: int) -> List[List[str]]:
  """Consecutive ids, at most `size` per batch: a file larger than that
  split in runs of `size`, a file that fits in the batch so far added whole.

  >>> batches(["a.py::x", "a.py::y", "a.py::z", "b.py::x", "c.py::x"], 2)
  [['a.py::x', 'a.py::y'], ['a.py::z', 'b.py::x'], ['c.py::x']]
  """
  result = [[]]
  for _, ids in itertools.groupby(node_ids, key=lambda i: i.split("::")[0]):
    ids = list(ids)
    for i in range(0, len(ids), size):
      if len(result[-1]) + len(ids[i:i + size]) > size:
        result.append([])
      result[-1].extend(ids[i:i + size])
  return [batch for batch in result if batch]


def run_batch(ids: Sequence[str], log: pathlib.Path) -> Tuple[int, float]:
  """Runs `ids` in a fresh pytest; returns its exit status and seconds."""
  env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1",
             TF_NUM_INTEROP_THREADS="1")
  start = time.monotonic()
  with open(log, "w") as out:
    status = subprocess.run(PYTEST + ["-rfE", *ids], cwd=ROOT, env=env,
                            stdout=out, stderr=subprocess.STDOUT,
                            check=False).returncode
  return status, time.monotonic() - start


def main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=250,
                      help="most tests per pytest process (default 250)")
  parser.add_argument("--jobs", type=int, default=2,
                      help="pytest processes at a time (default 2)")
  parser.add_argument("paths", nargs="*", help="what pytest collects from")
  args = parser.parse_args(argv)
  if args.batch < 1 or args.jobs < 1:
    parser.error("--batch and --jobs must be at least 1")
  work = batches(collect(args.paths), args.batch)
  logs = pathlib.Path(tempfile.mkdtemp(prefix="tfr_full_"))
  print(f"{sum(map(len, work))} tests in {len(work)} batches; logs in {logs}",
        flush=True)
  failed_batches = []
  with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
    futures = {pool.submit(run_batch, ids, logs / f"batch_{i:03d}.log"): i
               for i, ids in enumerate(work)}
    for future in concurrent.futures.as_completed(futures):
      i = futures[future]
      status, seconds = future.result()
      ids = work[i]
      print(f"batch {i:3d}: {len(ids):4d} tests from {ids[0].split('::')[0]}: "
            f"exit {status} in {seconds:.0f} s", flush=True)
      if status != 0:
        failed_batches.append(i)
  for i in sorted(failed_batches):
    log = (logs / f"batch_{i:03d}.log").read_text()
    failures = [l for l in log.splitlines() if l.startswith(("FAILED", "ERROR"))]
    print(f"\nbatch {i} ({logs / f'batch_{i:03d}.log'}):")
    print("\n".join(failures) or log[-3000:])
  print(f"\n{len(failed_batches)} of {len(work)} batches failed.")
  return 1 if failed_batches else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
