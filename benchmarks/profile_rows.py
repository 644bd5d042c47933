r"""What keeping a row per step costs at large batches, and why rows are dense.

The chunked loops (`tf_recurrent/sequence.py`) keep an LSTM's gate
activations, one `[4, B, H]` row per step, in one dense `[T, 4, B, H]`
buffer written in place (`accumulators.InPlaceBlocks`); Keras's loop keeps
each step's tensors by reference in a TensorList. This times, in one
process, interleaved (median of `--repeats` rounds), a while loop of T steps
that makes one such row per step (a sigmoid of the step before, so nothing
can be hoisted) and keeps it:

* `nothing`: the loop alone;
* `one buffer`: one `[T, ...]` buffer, as the chunked loops keep it;
* `a buffer per chunk`: `--chunks` buffers of `T / chunks` rows each;
* `TensorList`: by reference, as Keras's loop keeps it, read as a list;
* `TensorList, stacked`: by reference, then stacked into one dense tensor.

Beside each: the buffer size and the minor page faults per call (the first
touch of memory the allocator took fresh from the kernel). glibc serves
allocations above its mmap threshold (at most 32 MiB) with fresh pages on
every call, so a buffer above it is faulted in anew each training step.

It then saves a custom gradient that captures a TensorList, and one that
captures a dense tensor, into SavedModels, and prints what each does: the
reason the kept rows are one dense tensor in every mode.

Usage:

    python -m benchmarks.profile_rows --batch=256 --hidden=128 --steps=120
"""

import tempfile
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 256, "Batch size B.")
flags.DEFINE_integer("hidden", 128, "Units H (a row is [4, B, H]).")
flags.DEFINE_integer("steps", 120, "Steps T.")
flags.DEFINE_integer("chunks", 3, "Buffers of the per-chunk variant.")
flags.DEFINE_integer("repeats", 11, "Timed rounds (median kept).")


def _minor_faults() -> int:
  """This process's minor page faults so far (/proc/self/stat field 10)."""
  with open("/proc/self/stat") as f:
    return int(f.read().rsplit(")", 1)[1].split()[7])


def _loops(batch: int, hidden: int, steps: int, chunks: int):
  """The variants above, as `{name: (tf.function, MB kept per buffer)}`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_recurrent.op import accumulators  # pylint: disable=g-import-not-at-top

  row_shape = [4, batch, hidden]
  template = tf.zeros(row_shape)

  def run(rows, keep, handle):
    """`rows` steps from `z`, each row passed to `keep(handle, t, row)`."""
    def body(t, z, handle):
      row = tf.sigmoid(z)
      return t + 1, row, keep(handle, t, row)
    return tf.while_loop(lambda t, *_: t < rows, body,
                         (0, tf.zeros(row_shape), handle))

  @tf.function
  def nothing():
    return run(steps, lambda h, t, row: h, tf.zeros([]))[1][0, 0, 0]

  def dense(buffers):
    rows = -(-steps // buffers)

    @tf.function
    def fn():
      total = 0.0
      for _ in range(buffers):
        acc = accumulators.InPlaceBlocks(template, rows, use_xla=False)
        _, _, handle = run(rows, acc.write, acc.empty())
        total += acc.stack(handle)[-1, 0, 0, 0]
      return total
    return fn, rows

  def tensor_list(stacked):
    acc = accumulators.RowAccumulator(template, steps, use_xla=False)

    @tf.function
    def fn():
      _, _, handle = run(steps, acc.write, acc.empty())
      if stacked:
        return acc.stack(handle)[-1, 0, 0, 0]
      return tf.raw_ops.TensorListGetItem(
          input_handle=handle, index=steps - 1, element_shape=row_shape,
          element_dtype=tf.float32)[0, 0, 0]
    return fn

  row_mb = 4 * batch * hidden * 4 / 2**20
  one, _ = dense(1)
  per_chunk, chunk_rows = dense(chunks)
  return {"nothing": (nothing, 0.0),
          "one buffer": (one, steps * row_mb),
          f"a buffer per chunk ({chunks})": (per_chunk, chunk_rows * row_mb),
          "TensorList": (tensor_list(False), 0.0),
          "TensorList, stacked": (tensor_list(True), steps * row_mb)}


def _saving(capture_list: bool) -> str:
  """What saving a custom gradient that captures a TensorList (or a dense
  tensor) into a SavedModel does: "saved", or the error's first line."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def kept_rows(x):
    handle = tf.raw_ops.TensorListFromTensor(tensor=x, element_shape=[2])
    return handle if capture_list else x * 1.0

  @tf.custom_gradient
  def double(x):
    kept = kept_rows(x)

    def grad(dy):
      if capture_list:
        rows = tf.raw_ops.TensorListStack(input_handle=kept,
                                          element_dtype=tf.float32,
                                          element_shape=[2])
      else:
        rows = kept
      return dy * 2.0 + 0.0 * rows
    return 2.0 * x, grad

  class Model(tf.Module):

    @tf.function(input_signature=[tf.TensorSpec([3, 2])])
    def train(self, x):
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(double(x))
      return tape.gradient(y, x)

  model = Model()
  model.train(tf.ones([3, 2]))
  try:
    tf.saved_model.save(model, tempfile.mkdtemp())
  except (KeyError, ValueError) as error:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
  return "saved"


def main(argv):
  del argv
  import numpy as np  # pylint: disable=g-import-not-at-top

  loops = _loops(FLAGS.batch, FLAGS.hidden, FLAGS.steps, FLAGS.chunks)
  for fn, _ in loops.values():
    fn()  # Trace and warm up.
  seconds = {name: [] for name in loops}
  faults = {name: [] for name in loops}
  names = list(loops)
  for round_ in range(FLAGS.repeats):
    for name in names if round_ % 2 == 0 else names[::-1]:
      before, start = _minor_faults(), time.perf_counter()
      loops[name][0]().numpy()
      seconds[name].append(time.perf_counter() - start)
      faults[name].append(_minor_faults() - before)
  print(f"One [4, B, H] row per step, B={FLAGS.batch} H={FLAGS.hidden} "
        f"T={FLAGS.steps}, median of {FLAGS.repeats} interleaved rounds\n")
  print("| kept | MB per buffer | ms per call | MB faulted per call |")
  print("|---|---:|---:|---:|")
  for name in names:
    print(f"| {name} | {loops[name][1]:.1f} | "
          f"{np.median(seconds[name]) * 1e3:.2f} | "
          f"{np.median(faults[name]) * 4096 / 2**20:.1f} |")
  print("\nSaving a custom gradient that captures the kept rows:")
  print(f"- as a TensorList: {_saving(True)}")
  print(f"- as a dense tensor: {_saving(False)}")


if __name__ == "__main__":
  app.run(main)
