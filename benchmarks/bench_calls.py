r"""Calls that meet a new shape (issue #33): what a user waits for before the
steady state, Keras's layer against ours.

Three figures, each measured in fresh processes (`--child`), one per run of
one layer, so the first trace, the first build and the first compile count
as a user meets them. Per row, PROCS processes per layer, alternating which
layer's process runs first (Keras, ours, ours, Keras, ...), and the median
over the processes; imports and input tensors are made before the clock
starts. The target of every row: ours <= Keras (median seconds).

* `eager` (a): a layer `LSTM(32)` called eagerly (no tf.function) on
  B=8, D=16 and 20 new lengths T = 10..29, one call each, each output read
  back; the total wall time from the layer's construction to the last
  output.
* `first:<config>` (b): the first `model.train_on_batch` (trace, the
  optimizer's build, one step) of `Input((T, D), batch_size=B)`, the layer,
  `Dense(1)`, Adam, MSE, default `compile`. Configurations:
  `first:lstm256` LSTM(256) B=64 T=20 D=40; `first:lstm32` LSTM(32) B=256
  T=120 D=7; `first:bilstm64` Bidirectional(LSTM(64)) B=32 T=200 D=128
  (`keras.layers.Bidirectional` around either layer). The model's
  construction and compile and the second step are recorded beside it.
* `predict` (c): a greedy decoder's loop, as keras-io's seq2seq example
  runs one: `model.predict` called on a new length each time, B=1, lengths
  1..30, of `Input((None, 32))`, `LSTM(64, return_sequences=True)`,
  `Dense(32, softmax)`; the total wall time of the 30 calls.

Environment variables:

* `ONLY`: the rows, comma-separated, each a row name or its prefix:
  `ONLY=eager`, `ONLY=first` (the three first-call rows),
  `ONLY=first:lstm32,predict`. Default: all five rows.
* `PROCS`: fresh processes per layer and row, default 3.
* `CALLS`: at most this many lengths for `eager` and `predict` (the first
  ones), for smoke tests.
* `OUT`: the JSON lines file, default `benchmarks/calls.json`.
* `JOBS`: fresh processes run at once, default 1. Above 1 only for smoke
  tests: processes side by side on a 2-core machine slow each other down.

Usage:

    python -m benchmarks.bench_calls                  # all rows (~3 min)
    ONLY=eager PROCS=3 python -m benchmarks.bench_calls   # one row

Writes `OUT` as JSON lines (the first line `{"environment": ...}`, then one
line per row, written as each row finishes) and prints a markdown table.
"""

import concurrent.futures
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

from benchmarks.common import environment
from benchmarks.common import json_of_child
from benchmarks.common import load_note
from benchmarks.common import print_result
from benchmarks.common import print_table
from benchmarks.common import ROOT

MODULE = "benchmarks.bench_calls"
IMPLS = ("keras", "ours")
EAGER = {"units": 32, "B": 8, "D": 16, "lengths": list(range(10, 30))}
FIRST = {
    "lstm256": {"layer": "LSTM", "units": 256, "B": 64, "T": 20, "D": 40},
    "lstm32": {"layer": "LSTM", "units": 32, "B": 256, "T": 120, "D": 7},
    "bilstm64": {"layer": "Bidirectional(LSTM)", "units": 64, "B": 32,
                 "T": 200, "D": 128},
}
PREDICT = {"units": 64, "B": 1, "D": 32, "lengths": list(range(1, 31))}
ROWS = ["eager"] + [f"first:{name}" for name in FIRST] + ["predict"]


def calls(lengths: List[int]) -> List[int]:
  """The first CALLS lengths (all without CALLS)."""
  limit = os.environ.get("CALLS")
  return lengths[:int(limit)] if limit else lengths


def layer_class(impl: str, name: str):
  import keras  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top
  return getattr(keras.layers if impl == "keras" else tf_recurrent, name)


# The children: one layer, one row, in a fresh process.


def eager_child(impl: str) -> Dict[str, object]:
  """(a) Eager calls of one layer on new lengths, seconds."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  lengths = calls(EAGER["lengths"])
  rng = np.random.default_rng(0)
  # Made before the clock: TensorFlow's runtime starts with the first tensor.
  xs = [tf.constant(rng.normal(size=(EAGER["B"], t, EAGER["D"])), tf.float32)
        for t in lengths]
  lstm = layer_class(impl, "LSTM")
  start = time.perf_counter()
  layer = lstm(EAGER["units"])
  per_call = []
  for x in xs:
    begin = time.perf_counter()
    layer(x).numpy()
    per_call.append(time.perf_counter() - begin)
  return {"seconds": time.perf_counter() - start, "per_call_s": per_call,
          "lengths": lengths}


def first_child(impl: str, config: str) -> Dict[str, object]:
  """(b) The first train_on_batch of a fresh model, seconds."""
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  c = FIRST[config]
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=(c["B"], c["T"], c["D"])), tf.float32)
  y = tf.constant(rng.normal(size=(c["B"], 1)), tf.float32)
  start = time.perf_counter()
  recurrent = layer_class(impl, "LSTM")(c["units"])
  if c["layer"].startswith("Bidirectional"):
    recurrent = keras.layers.Bidirectional(recurrent)
  inputs = keras.Input((c["T"], c["D"]), batch_size=c["B"])
  model = keras.Model(inputs, keras.layers.Dense(1)(recurrent(inputs)))
  model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
  built = time.perf_counter()
  model.train_on_batch(x, y)
  first = time.perf_counter()
  model.train_on_batch(x, y)
  second = time.perf_counter()
  return {"seconds": first - built, "build_s": built - start,
          "second_s": second - first}


def predict_child(impl: str) -> Dict[str, object]:
  """(c) model.predict on a new length each call, seconds."""
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  lengths = calls(PREDICT["lengths"])
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(PREDICT["B"], t, PREDICT["D"])).astype("float32")
        for t in lengths]
  inputs = keras.Input((None, PREDICT["D"]))
  hidden = layer_class(impl, "LSTM")(PREDICT["units"],
                                     return_sequences=True)(inputs)
  model = keras.Model(
      inputs, keras.layers.Dense(PREDICT["D"], activation="softmax")(hidden))
  start = time.perf_counter()
  per_call = []
  for x in xs:
    begin = time.perf_counter()
    model.predict(x, verbose=0)
    per_call.append(time.perf_counter() - begin)
  return {"seconds": time.perf_counter() - start, "per_call_s": per_call,
          "lengths": lengths}


def child(spec: str) -> None:
  """Runs one `row|impl` and prints it for `json_of_child`."""
  row, impl = spec.split("|")
  if row == "eager":
    result = eager_child(impl)
  elif row == "predict":
    result = predict_child(impl)
  else:
    result = first_child(impl, row.split(":", 1)[1])
  print_result({**result, "environment": environment()})


# The parent: rows in children, the JSON lines and the table.


def describe(row: str) -> str:
  if row == "eager":
    lengths = calls(EAGER["lengths"])
    return (f"(a) eager LSTM({EAGER['units']}) B={EAGER['B']} D={EAGER['D']}, "
            f"{len(lengths)} lengths T={lengths[0]}..{lengths[-1]}, total")
  if row == "predict":
    lengths = calls(PREDICT["lengths"])
    return (f"(c) predict, LSTM({PREDICT['units']}, return_sequences) + Dense,"
            f" B={PREDICT['B']}, {len(lengths)} lengths "
            f"{lengths[0]}..{lengths[-1]}, total")
  c = FIRST[row.split(":", 1)[1]]
  layer = c["layer"].replace("LSTM", f"LSTM({c['units']})")
  return (f"(b) first train_on_batch, {layer} B={c['B']} T={c['T']} "
          f"D={c['D']}")


def procs() -> int:
  return int(os.environ.get("PROCS", "3"))


def measure(row: str) -> Optional[Dict[str, object]]:
  """One row: PROCS fresh processes per layer, alternating, and medians."""
  # Other processes' load, to tell a row measured on a busy machine.
  load = os.getloadavg()[0]
  # Keras, ours, ours, Keras, ...: neither layer always runs first.
  order = [impl for i in range(procs())
           for impl in (IMPLS if i % 2 == 0 else IMPLS[::-1])]
  jobs = int(os.environ.get("JOBS", "1"))
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    results = list(pool.map(
        lambda impl: json_of_child(MODULE, [f"--child={row}|{impl}"]), order))
  if None in results:
    return None
  runs = {impl: [] for impl in IMPLS}
  for impl, result in zip(order, results):
    env = result.pop("environment")
    runs[impl].append(result)
  medians = {impl: statistics.median(r["seconds"] for r in runs[impl])
             for impl in IMPLS}
  return {"row": row, "what": describe(row), "procs": procs(),
          "loadavg": load,
          "keras_s": medians["keras"], "ours_s": medians["ours"],
          "ratio": medians["keras"] / medians["ours"],
          "target": "met" if medians["ours"] <= medians["keras"] else "not met",
          "runs": runs, "environment": env}


def selected(only: str) -> List[str]:
  if not only:
    return ROWS
  patterns = [p.strip() for p in only.split(",") if p.strip()]
  return [row for row in ROWS if any(row.startswith(p) for p in patterns)]


def table(rows: List[Dict[str, object]]) -> str:
  lines = ["| row | what | Keras s | ours s | Keras/ours "
           "| target ours <= Keras |", "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['row']} | {r['what']} | {r['keras_s']:.3f} | "
                 f"{r['ours_s']:.3f} | {r['ratio']:.2f} | {r['target']} |")
  return "\n".join(lines)


def main() -> int:
  if sys.argv[1:] and sys.argv[1].startswith("--child="):
    child(sys.argv[1].split("=", 1)[1])
    return 0
  only = os.environ.get("ONLY", "")
  rows = selected(only)
  if not rows:
    print(f"ONLY={only!r} selects no row; the rows are {', '.join(ROWS)}.",
          file=sys.stderr)
    return 2
  out_path = os.environ.get("OUT", os.path.join(ROOT, "benchmarks",
                                                "calls.json"))
  print(f"{len(rows)} row(s), PROCS={procs()} per layer; writing {out_path}; "
        f"{load_note()}", flush=True)
  done, failed = [], []
  with open(out_path, "w") as f:
    for row in rows:
      start = time.perf_counter()
      result = measure(row)
      if result is None:
        failed.append(row)
        continue
      env = result.pop("environment")
      if not done:
        print(f"CPU: {env['cpu']} ({env['cpu_flags']}); TensorFlow "
              f"{env['tensorflow']}, Keras {env['keras']}", flush=True)
        f.write(json.dumps({"environment": env}) + "\n")
      f.write(json.dumps(result) + "\n")
      f.flush()
      done.append(result)
      print(f"  {row:16s} Keras {result['keras_s']:.3f} s  ours "
            f"{result['ours_s']:.3f} s  ({result['ratio']:.2f}x, "
            f"{result['target']})  [{time.perf_counter() - start:.0f} s]",
            flush=True)
  return print_table(
      f"Seconds, median of {procs()} fresh processes per layer; Keras/ours "
      "above 1: ours is faster; target: ours <= Keras.", table(done), failed)


if __name__ == "__main__":
  sys.exit(main())
