r"""Where an XLA-compiled training step's time goes, per HLO, ours vs Keras.

Builds one training step (forward over T steps, the mean square of the
layer's output as the loss, the gradients of all weights) of
`tf_recurrent.<Layer>` or `keras.layers.<Layer>` as a
`tf.function(jit_compile=True)`, runs it a few times, then captures a
TensorFlow profile of `--repeats` calls with XLA's CPU thunks traced
(`--xla_cpu_enable_xprof_traceme`), and sums each HLO's (a fusion, a dot, a
while loop's own bookkeeping) time per call. The two cores run thunks side
by side, so the sums may exceed the wall time; compare the layers' rows and
their per-step counts (`x` is launches per call: T for a per-step HLO).
TensorFlow 2.16 (the dependency floor) traces only the while loops and a few
ops of the old XLA CPU runtime, not each fusion.

By default the layer returns its last output only (`--nosequences` for every
step's), as the shape benchmark's model does.

Usage:

    python -m benchmarks.profile_xla --layer=LSTM --batch=256 --steps=120 \
        --input=8 --hidden=32           # ours, then Keras's
"""

import collections
import glob
import os
import tempfile
import time

from absl import app
from absl import flags

from benchmarks.common import define_layer_flags
from benchmarks.common import layer_module

FLAGS = flags.FLAGS
define_layer_flags(hidden=32)
flags.DEFINE_bool("sequences", False, "Return every step's output.")
flags.DEFINE_integer("repeats", 3, "Profiled calls.")
flags.DEFINE_integer("top", 20, "Rows per table.")

# Trace events that wrap the HLOs (the call, the executable, the thunk
# executor) rather than being one.
_WRAPPERS = ("step", "TFE_", "Eager", "__inference", "CpuExecutable",
             "BlockUntilReady", "ThunkExecutor", "$", "PjRt", "Xla", "xla")


def _xplane_module():
  """TensorFlow's XPlane protobuf module (its path moved between versions)."""
  try:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover - older TensorFlow.
    from tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  return xplane_pb2


def _hlo_times(logdir: str, calls: int):
  """`{event name: (ms per call, launches per call)}` from a profile."""
  xplane_pb2 = _xplane_module()
  micros, launches = collections.Counter(), collections.Counter()
  for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                        recursive=True):
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
      space.ParseFromString(f.read())
    for plane in space.planes:
      names = {k: v.name for k, v in plane.event_metadata.items()}
      for line in plane.lines:
        if line.name == "python":  # The host thread: wrappers only.
          continue
        for event in line.events:
          name = names.get(event.metadata_id, "?")
          if name.startswith(_WRAPPERS):
            continue
          micros[name] += event.duration_ps / 1e6
          launches[name] += 1
  return {name: (us / calls / 1e3, launches[name] / calls)
          for name, us in micros.items()}


def profile(impl: str) -> str:
  """The HLO table of one layer's XLA training step, as markdown."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  module_name, module = layer_module(impl)
  layer = getattr(module, FLAGS.layer)(FLAGS.hidden,
                                       return_sequences=FLAGS.sequences)
  shape = [FLAGS.batch, FLAGS.steps, FLAGS.input]
  layer.build(shape)
  x = tf.random.Generator.from_seed(0).normal(shape)

  @tf.function(jit_compile=True)
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(layer(x, training=True)))
    return tape.gradient(loss, layer.trainable_weights)

  def call():
    return [g.numpy() for g in step()]

  for _ in range(3):  # Compile and warm up.
    call()
  seconds = []
  for _ in range(5):
    start = time.perf_counter()
    call()
    seconds.append(time.perf_counter() - start)
  logdir = tempfile.mkdtemp()
  tf.profiler.experimental.start(logdir)
  for _ in range(FLAGS.repeats):
    call()
  tf.profiler.experimental.stop()
  times = _hlo_times(logdir, FLAGS.repeats)
  total = sum(ms for ms, _ in times.values())
  lines = [f"### {impl}: {module_name}.{FLAGS.layer}, wall "
           f"{np.median(seconds) * 1e3:.1f} ms (median of 5, untraced); "
           f"HLO time {total:.2f} ms per call",
           "", "| HLO | ms per call | share | x per call | us per launch |",
           "|---|---:|---:|---:|---:|"]
  ranked = sorted(times.items(), key=lambda item: -item[1][0])
  for name, (ms, count) in ranked[:FLAGS.top]:
    lines.append(f"| {name} | {ms:.2f} | {ms / total:.0%} | {count:g} | "
                 f"{ms * 1e3 / count:.1f} |")
  return "\n".join(lines)


def main(argv):
  del argv
  # Read when XLA starts, so set before TensorFlow is imported.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_cpu_enable_xprof_traceme=true").strip()
  print(f"{FLAGS.layer}, B={FLAGS.batch} T={FLAGS.steps} D={FLAGS.input} "
        f"H={FLAGS.hidden}, XLA, float32, "
        f"{'every output' if FLAGS.sequences else 'last output'}\n")
  for impl in FLAGS.impls:
    print(profile(impl) + "\n")


if __name__ == "__main__":
  app.run(main)
