r"""The TF Addons row of `bench_seq2seq`, in a process of its own.

TF Addons' `tfa.seq2seq` needs TensorFlow <= 2.15 and its Keras 2, so this
runs under another Python (e.g. a venv with tensorflow-cpu 2.15.1 and
tensorflow-addons 0.23.0) than the rest of the benchmark, which starts it
with `--addons_python`. It imports tensorflow, tensorflow_addons, absl and
`benchmarks.common` (the standard library only at import), not
tf_recurrent or Keras 3.

The step is the one Addons' NMT tutorial trains: `BasicDecoder(
AttentionWrapper(tf.keras.layers.LSTMCell(H), BahdanauAttention(H),
attention_layer_size=H), sampler=TrainingSampler())` called on the [B, T, D]
decoder inputs (the embeddings), which runs `tfa.seq2seq.dynamic_decode`;
the loss is reduce_mean(square(rnn_output)) and the gradients are those of
all trainable weights, in `tf.function(jit_compile=jit)`; under XLA the
decoder has `maximum_iterations=T`, which dynamic_decode requires there (it
raises "maximum_iterations is required for XLA compilation." without). The
memory and the inputs are `bench_seq2seq`'s (the same stateless_normal
seeds), and the memory's keys are computed inside the differentiated step.

Modes (a case is `name|jit|length`, as `bench_seq2seq`'s children):

* `--child=case`: one step, then `PEAK_RSS <bytes>` (`common.run_child`);
  a step that raises prints `ERROR <type>: <its message's first line>` (see
  `error_line`) and exits non-zero;
* `--serve=case`: builds the step and runs it once (trace, compile), prints
  `READY`, then for each line `run` on stdin runs one step and prints
  `SECONDS <its time.perf_counter() seconds>`; ends at EOF;
* `--versions`: TensorFlow's, TF Addons', Keras's and Python's versions, as
  `common.print_result` JSON.

From the repository's root:

    /path/to/tf215/bin/python -m benchmarks.addons_seq2seq_child \
        --child="tfa.seq2seq.dynamic_decode(BasicDecoder)|0|100"
"""

import platform
import re
import sys
import time
from typing import Callable

from absl import app
from absl import flags

from benchmarks.common import print_result
from benchmarks.common import run_child

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 32, "Batch size B.")
flags.DEFINE_integer("input", 128, "Decoder input features D.")
flags.DEFINE_integer("hidden", 256, "LSTM units, attention depth and "
                     "attention layer size H.")
flags.DEFINE_integer("source", 0, "T_src of the memory (0: the target "
                     "length).")
flags.DEFINE_string("child", "", "One step of the case `name|jit|length`, "
                    "then its peak RSS.")
flags.DEFINE_string("serve", "", "Steps of the case `name|jit|length`, one "
                    "per `run` line on stdin.")
flags.DEFINE_bool("versions", False, "Print the versions and exit.")


def build_step(name: str, steps: int, jit: bool) -> Callable[[], object]:
  """One training step over `steps` target steps, as a callable; the memory
  has FLAGS.source steps (or `steps`). `name` is the row's (one here)."""
  del name
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_addons as tfa  # pylint: disable=g-import-not-at-top

  batch, hidden = FLAGS.batch, FLAGS.hidden
  memory = tf.random.stateless_normal(
      (batch, FLAGS.source or steps, hidden), seed=[3, 4])
  mechanism = tfa.seq2seq.BahdanauAttention(hidden, memory=memory)
  cell = tfa.seq2seq.AttentionWrapper(tf.keras.layers.LSTMCell(hidden),
                                      mechanism, attention_layer_size=hidden)
  # XLA needs the decoding loop's bound: without it dynamic_decode raises
  # "maximum_iterations is required for XLA compilation."
  decoder = tfa.seq2seq.BasicDecoder(
      cell, sampler=tfa.seq2seq.TrainingSampler(),
      maximum_iterations=steps if jit else None)
  x = tf.random.stateless_normal((batch, steps, FLAGS.input), seed=[1, 2])

  def decode(inputs):
    # As the tutorial's decoder: every sequence full length.
    state = cell.get_initial_state(batch_size=batch, dtype=tf.float32)
    return decoder(inputs, initial_state=state,
                   sequence_length=batch * [int(inputs.shape[1])])[0]

  decode(x[:, :1])  # Builds every weight, outside the traced step.

  @tf.function(jit_compile=jit)
  def step():
    with tf.GradientTape() as tape:
      # As in training, where the memory is the encoder's output: its keys
      # are computed inside the differentiated step.
      mechanism.setup_memory(memory)
      loss = tf.reduce_mean(tf.square(decode(x).rnn_output))
    return tape.gradient(loss, decoder.trainable_weights)

  return lambda: [g.numpy() for g in step()]


def error_line(e: Exception) -> str:
  """`type: message`'s first line; for an error in a traced function
  (whose message opens with "in user code:" and the traced frames), its
  last `...Error: ` line, the original error."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip()] or [""]
  causes = [l for l in lines if re.match(r"\w+(Error|Exception): ", l)]
  if lines[0] == "in user code:" and causes:
    return causes[-1]
  return f"{type(e).__name__}: {lines[0]}"


def serve(spec: str) -> None:
  """`--serve`: READY once built and warm, then one step per `run` line."""
  name, jit, length = spec.rsplit("|", 2)
  step = build_step(name, int(length), jit == "1")
  step()
  print("READY", flush=True)
  for line in sys.stdin:
    if line.strip() != "run":
      raise ValueError(f"expected `run`, got {line!r}")
    start = time.perf_counter()
    step()
    print(f"SECONDS {time.perf_counter() - start!r}", flush=True)


def main(argv):
  del argv
  if FLAGS.versions:
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_addons as tfa  # pylint: disable=g-import-not-at-top
    print_result({"tensorflow": tf.__version__,
                  "tensorflow_addons": tfa.__version__,
                  "keras": keras.__version__,
                  "python": platform.python_version()})
    return
  try:
    if FLAGS.serve:
      serve(FLAGS.serve)
    elif FLAGS.child:
      run_child(build_step, FLAGS.child)
    else:
      raise app.UsageError("one of --child, --serve or --versions")
  except Exception as e:  # pylint: disable=broad-except
    print(f"ERROR {error_line(e)}", flush=True)
    raise


if __name__ == "__main__":
  app.run(main)
