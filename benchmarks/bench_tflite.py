r"""TFLite interpreter latency of the fused LSTM, and the quantized sizes.

`tf_recurrent.LSTM` converts to TFLite's fused UNIDIRECTIONAL_SEQUENCE_LSTM;
`keras.layers.LSTM` (Keras 3) converts to a WHILE loop of builtin ops. This
converts the same one-layer model (same weights, `return_sequences=True`,
batch 1) both ways and measures:

* latency: `Interpreter.invoke()` on one sequence, the two models timed in
  interleaved rounds (each round: `--invokes` calls of each, alternating
  which goes first), reporting the median per-call time over the rounds, so
  a burst of load on a shared machine hits both alike;
* size: the fused model's flatbuffer as float, dynamic-range quantized and
  full-integer int8 (a representative dataset of random sequences).

The fused op has no XNNPack kernel and runs on one thread whatever
`--threads` says, so only the WHILE model changes with `--threads` and
`--noxnnpack` (its FULLY_CONNECTED ops run on XNNPack by default; with two
threads XNNPack's thread pool costs the loop more than it saves on a
`[1, D] x [D, 4H]` product, which inflates the speed-up).

With `--proj_size=P` the model is a `tf_recurrent.ProjectedLSTM(H,
proj_size=P)` (which Keras 3 lacks), converted twice: by
`tf_recurrent.tflite.convert` (the fused op with its projection weights)
and by `converter.convert()` (a WHILE loop); no sizes are printed.

Usage:

    python -m benchmarks.bench_tflite            # B=1, T=100, D=H=128
    python -m benchmarks.bench_tflite --proj_size=64
    python -m benchmarks.bench_tflite --threads=2 --noxnnpack
    python -m benchmarks.bench_tflite --length=5 --input=4 --hidden=4 \
        --rounds=2 --invokes=2 --json=/tmp/tflite.json

Prints a table; `--json` also writes the numbers.
"""

import contextlib
import io
import json
import statistics
import time
from typing import Callable, Dict, List

from absl import app
from absl import flags

from benchmarks.common import environment

FLAGS = flags.FLAGS
flags.DEFINE_integer("length", 100, "Sequence length T.")
flags.DEFINE_integer("input", 128, "Input features D.")
flags.DEFINE_integer("hidden", 128, "LSTM units H.")
flags.DEFINE_integer("rounds", 15, "Interleaved timing rounds.")
flags.DEFINE_integer("invokes", 20, "Interpreter calls per model per round.")
flags.DEFINE_integer("threads", 1, "Interpreter threads.")
flags.DEFINE_bool("xnnpack", True, "Apply the interpreter's default XNNPack "
                  "delegate.")
flags.DEFINE_integer("proj_size", 0, "Above 0: a ProjectedLSTM's fused op "
                     "against its WHILE loop.")
flags.DEFINE_string("json", "", "Also write the results here.")


def build_models(length: int, features: int, units: int, proj_size: int = 0):
  """(tf_recurrent model, keras model) with the same weights; with a
  proj_size, the ProjectedLSTM model twice."""
  import keras  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)

  def model(layer):
    return keras.Sequential([keras.Input((length, features), batch_size=1),
                             layer])
  if proj_size:
    projected = model(tf_recurrent.ProjectedLSTM(
        units, proj_size=proj_size, return_sequences=True))
    return projected, projected
  ours = model(tf_recurrent.LSTM(units, return_sequences=True))
  theirs = model(keras.layers.LSTM(units, return_sequences=True,
                                   use_cudnn=False))
  theirs.set_weights(ours.get_weights())
  return ours, theirs


def convert(model, configure: Callable[[object], None] = lambda c: None,
            projections: bool = False) -> bytes:
  """The model's flatbuffer (with `projections`, by `tflite.convert`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_recurrent import tflite  # pylint: disable=g-import-not-at-top
  converter = tf.lite.TFLiteConverter.from_keras_model(model)
  configure(converter)
  with contextlib.redirect_stdout(io.StringIO()):  # Keras's export log.
    return tflite.convert(converter) if projections else converter.convert()


def interleaved_medians(invokers: Dict[str, Callable[[], None]], rounds: int,
                        invokes: int) -> Dict[str, float]:
  """Median seconds per call of each invoker over interleaved rounds."""
  for invoke in invokers.values():  # Warm up (allocation, caches).
    invoke()
  times: Dict[str, List[float]] = {name: [] for name in invokers}
  names = list(invokers)
  for r in range(rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      start = time.perf_counter()
      for _ in range(invokes):
        invokers[name]()
      times[name].append((time.perf_counter() - start) / invokes)
  return {name: statistics.median(t) for name, t in times.items()}


def main(argv):
  del argv
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_recurrent import tflite  # pylint: disable=g-import-not-at-top

  length, features, units = FLAGS.length, FLAGS.input, FLAGS.hidden
  ours, theirs = build_models(length, features, units, FLAGS.proj_size)
  rng = np.random.default_rng(0)
  x = rng.normal(size=[1, length, features]).astype(np.float32)
  data = rng.normal(size=[32, 1, length, features]).astype(np.float32)

  def dynamic_range(converter):
    converter.optimizations = [tf.lite.Optimize.DEFAULT]

  def int8(converter):
    dynamic_range(converter)
    converter.representative_dataset = lambda: ([d] for d in data)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]

  if FLAGS.proj_size:
    flatbuffers = {
        "tf_recurrent.ProjectedLSTM (fused, tflite.convert)": convert(
            ours, projections=True),
        "tf_recurrent.ProjectedLSTM (WHILE, converter.convert)": convert(
            theirs),
    }
    sizes = {}
  else:
    flatbuffers = {
        "tf_recurrent.LSTM (fused)": convert(ours),
        "keras.layers.LSTM (WHILE)": convert(theirs),
    }
    sizes = {"float": len(flatbuffers["tf_recurrent.LSTM (fused)"]),
             "dynamic range": len(convert(ours, dynamic_range)),
             "int8": len(convert(ours, int8))}

  invokers = {}
  errors = {}
  resolver = (tf.lite.experimental.OpResolverType.AUTO if FLAGS.xnnpack else
              tf.lite.experimental.OpResolverType
              .BUILTIN_WITHOUT_DEFAULT_DELEGATES)
  expected = ours(x).numpy()
  for name, flatbuffer in flatbuffers.items():
    interpreter = tf.lite.Interpreter(
        model_content=flatbuffer, num_threads=FLAGS.threads,
        experimental_op_resolver_type=resolver)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    invokers[name] = interpreter.invoke
    interpreter.invoke()
    got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    errors[name] = float(np.abs(got - expected).max())
  medians = interleaved_medians(invokers, FLAGS.rounds, FLAGS.invokes)

  env = environment()
  print(f"TFLite interpreter, B=1 T={length} D={features} H={units}"
        f"{f' P={FLAGS.proj_size}' if FLAGS.proj_size else ''}, "
        f"{FLAGS.threads} thread(s), XNNPack "
        f"{'on' if FLAGS.xnnpack else 'off'}, median of {FLAGS.rounds} "
        f"interleaved rounds x {FLAGS.invokes} calls; {env}")
  print("| model | ops | us per call | us per step | max error vs Keras |")
  print("|---|---|---|---|---|")
  rows = []
  for name, flatbuffer in flatbuffers.items():
    ops = sorted(set(tflite.op_names(flatbuffer)))
    us = medians[name] * 1e6
    rows.append({"name": name, "ops": ops, "us_per_call": us,
                 "max_error": errors[name]})
    print(f"| {name} | {', '.join(ops)} | {us:.0f} | {us / length:.1f} | "
          f"{errors[name]:.1e} |")
  first, second = (medians[n] for n in flatbuffers)
  print(f"fused speed-up: {second / first:.2f}x")
  if sizes:
    print("| fused model | bytes | vs float |")
    print("|---|---|---|")
    for kind, size in sizes.items():
      print(f"| {kind} | {size} | {sizes['float'] / size:.2f}x smaller |")
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump({"environment": env, "length": length, "input": features,
                 "hidden": units, "proj_size": FLAGS.proj_size,
                 "threads": FLAGS.threads,
                 "xnnpack": FLAGS.xnnpack, "rows": rows,
                 "speedup": second / first, "sizes": sizes}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
