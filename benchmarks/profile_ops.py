r"""Where a training step's time goes, per TensorFlow op type, ours vs Keras.

Builds one training step (forward over T steps, a loss over every output,
the gradients of the inputs and all weights) of `tf_recurrent.<Layer>` or
`keras.layers.<Layer>` in a TF1 graph, runs it a few times, then once with
full tracing, and sums the traced kernel times per op type (and per op
name). The traced times include the tracer's own overhead and overlap
across the two cores, so compare shares and counts between the two layers,
not absolute times; the untraced wall time is printed beside them.

Usage:

    python -m benchmarks.profile_ops --layer=LSTM --batch=256 --steps=120 \
        --input=8 --hidden=128            # ours, then Keras's
"""

import collections
import time

from absl import app
from absl import flags

from benchmarks.common import define_layer_flags
from benchmarks.common import layer_module

FLAGS = flags.FLAGS
define_layer_flags(hidden=128)
flags.DEFINE_integer("top", 15, "Rows per table.")


def profile(impl: str) -> str:
  """The op-type table of one layer's training step, as markdown."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  graph = tf.Graph()
  with graph.as_default():
    shape = [FLAGS.batch, FLAGS.steps, FLAGS.input]
    x = tf.compat.v1.placeholder(tf.float32, shape)
    module_name, module = layer_module(impl)
    layer = getattr(module, FLAGS.layer)(FLAGS.hidden, return_sequences=True)
    loss = tf.reduce_sum(tf.square(layer(x, training=True)))
    grads = tf.gradients(loss, [x] + layer.trainable_weights)
    init = tf.compat.v1.global_variables_initializer()
  feed = {x: np.random.default_rng(0).normal(size=shape).astype("float32")}
  with tf.compat.v1.Session(graph=graph) as sess:
    sess.run(init)
    for _ in range(3):  # Warm-up: graph optimization, kernel caches.
      sess.run(grads, feed)
    seconds = []
    for _ in range(5):
      start = time.perf_counter()
      sess.run(grads, feed)
      seconds.append(time.perf_counter() - start)
    metadata = tf.compat.v1.RunMetadata()
    sess.run(grads, feed, run_metadata=metadata, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
  by_type, count = collections.Counter(), collections.Counter()
  for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
      name = node.node_name.split(":")[0]
      try:
        op_type = graph.get_operation_by_name(name).type
      except KeyError:  # A node inside a loop body: its label names the op.
        op_type = node.timeline_label.split("=")[-1].split("(")[0].strip()
      by_type[op_type] += node.op_end_rel_micros - node.op_start_rel_micros
      count[op_type] += 1
  total = sum(by_type.values())
  lines = [f"### {impl}: {module_name}.{FLAGS.layer}, wall "
           f"{np.median(seconds) * 1e3:.1f} ms (median of 5, untraced); "
           f"traced kernel time {total / 1e3:.1f} ms",
           "", "| op type | traced ms | share | calls | us per call |",
           "|---|---:|---:|---:|---:|"]
  for op_type, micros in by_type.most_common(FLAGS.top):
    lines.append(f"| {op_type} | {micros / 1e3:.2f} | {micros / total:.0%} | "
                 f"{count[op_type]} | {micros / count[op_type]:.1f} |")
  return "\n".join(lines)


def main(argv):
  del argv
  print(f"{FLAGS.layer}, B={FLAGS.batch} T={FLAGS.steps} D={FLAGS.input} "
        f"H={FLAGS.hidden}, TF1 graph, float32\n")
  for impl in FLAGS.impls:
    print(profile(impl) + "\n")


if __name__ == "__main__":
  app.run(main)
