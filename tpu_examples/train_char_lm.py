r"""A character-level (byte-level) language model trained through tf_recurrent.

The corpus is any text file given with --corpus, or by default the Python
standard library's own source files, which every machine with Python has.
The last tenth is held out; the job reports held-out bits per character,
keeps resumable checkpoints and TensorBoard logs in --model_dir, samples
text from the trained model one step at a time, and exports a SavedModel
(whole-sequence and one-step signatures) with --export_dir.

Example:

    python -m tpu_examples.train_char_lm --steps=2000 --model_dir=/tmp/lm \
        --export_dir=/tmp/lm/export
"""

import math
import os
import sysconfig
import time

from absl import app
from absl import flags
import keras
import numpy as np
import tensorflow as tf

import tf_recurrent
from tpu_examples import strategy as strategy_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("corpus", "", "A text file; empty: the Python standard "
                    "library's source files.")
flags.DEFINE_integer("corpus_bytes", 4 << 20, "Read at most this many bytes.")
flags.DEFINE_integer("embedding", 64, "Byte embedding size.")
flags.DEFINE_integer("eval_windows", 64, "Held-out windows per evaluation.")
flags.DEFINE_integer("sample_chars", 200, "Characters sampled at the end.")
flags.DEFINE_float("temperature", 0.7, "Sampling temperature.")
flags.DEFINE_string("prompt", "def ", "Text the sample continues.")

VOCAB = 256  # Bytes.


def read_corpus(path: str, limit: int) -> bytes:
  """The training text: `path`, or the standard library's .py files.

  Example:

  >>> len(read_corpus("", 1000))
  1000
  """
  if path:
    with open(path, "rb") as f:
      return f.read(limit)
  root = sysconfig.get_paths()["stdlib"]
  chunks, size = [], 0
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs
                        if d not in ("site-packages", "test", "tests"))
    for name in sorted(files):
      if name.endswith(".py") and size < limit:
        with open(os.path.join(directory, name), "rb") as f:
          chunks.append(f.read())
        size += len(chunks[-1])
  return b"".join(chunks)[:limit]


def split_corpus(text: bytes):
  """Train and held-out byte tensors: the first nine tenths, the last."""
  data = np.frombuffer(text, np.uint8).astype(np.int32)
  cut = len(data) * 9 // 10
  return tf.constant(data[:cut]), tf.constant(data[cut:])


def windows(data: tf.Tensor, seed, step, count: int, length: int):
  """`count` random windows of `length` + 1 bytes, a stateless function of
  (seed, step)."""
  key = tf.stack([tf.cast(seed, tf.int64), tf.cast(step, tf.int64)])
  starts = tf.random.stateless_uniform(
      [count], key, 0, tf.shape(data)[0] - length - 1, tf.int32)
  return tf.gather(data, starts[:, None] + tf.range(length + 1)[None, :])


def make_model() -> keras.Sequential:
  """Embedding -> tf_recurrent.LSTM -> logits over the next byte."""
  return keras.Sequential([
      keras.Input((None,), dtype="int32"),
      keras.layers.Embedding(VOCAB, FLAGS.embedding),
      tf_recurrent.LSTM(FLAGS.hidden, return_sequences=True),
      keras.layers.Dense(VOCAB),
  ])


def per_sequence_nats(model, batch, training=False):
  """Mean next-byte cross-entropy (nats) per sequence: `[B]`."""
  logits = model(batch[:, :-1], training=training)
  nats = tf.nn.sparse_softmax_cross_entropy_with_logits(
      batch[:, 1:], tf.cast(logits, tf.float32))
  return tf.reduce_mean(nats, axis=1)


def sample(module: tf_recurrent.StreamingModule, prompt: bytes, count: int,
           temperature: float, seed: int) -> bytes:
  """Feeds `prompt` through `module.step`, then samples `count` bytes."""
  rng = np.random.default_rng(seed)
  state = module.initial_state(tf.constant(1))
  state = [state[f"state_{i}"] for i in range(len(state))]
  out, logits = [], None
  for token in list(prompt) + [None] * count:
    if token is None:
      probs = tf.nn.softmax(logits / temperature).numpy().astype(np.float64)
      token = int(rng.choice(VOCAB, p=probs / probs.sum()))
      out.append(token)
    result = module.step(tf.constant([token], tf.int32), *state)
    logits = tf.cast(result["output"][0], tf.float32)
    state = [result[f"state_{i}"] for i in range(len(state))]
  return bytes(out)


def main(argv):
  del argv
  strategy = strategy_lib.strategy_from_flags()
  train_data, held_out = split_corpus(read_corpus(FLAGS.corpus,
                                                  FLAGS.corpus_bytes))
  with strategy.scope():
    model = make_model()
    optimizer = keras.optimizers.Adam(FLAGS.learning_rate)
    step = tf.Variable(0, dtype=tf.int64, name="step")
  trainer = strategy_lib.Trainer(
      strategy, model.trainable_variables,
      lambda batch, training: per_sequence_nats(model, batch, training),
      optimizer, FLAGS.batch, FLAGS.steps_per_call, FLAGS.jit_compile,
      clip_norm=1.0)
  progress = strategy_lib.Progress(
      FLAGS.model_dir,
      tf.train.Checkpoint(model=model, optimizer=optimizer, step=step),
      step, FLAGS.checkpoint_every)
  batches = strategy_lib.distribute_steps(
      strategy, lambda i: windows(train_data, FLAGS.seed, i, FLAGS.batch,
                                  FLAGS.seq_len),
      FLAGS.batch, first_step=progress.start_step)
  eval_batch = windows(held_out, FLAGS.seed + 1, 0, FLAGS.eval_windows,
                       FLAGS.seq_len)
  evaluate = tf.function(
      lambda: tf.reduce_mean(per_sequence_nats(model, eval_batch)) /
      math.log(2.0))
  print(f"char LM: {len(train_data.numpy())} training bytes, "
        f"{len(held_out.numpy())} held out; T={FLAGS.seq_len}, hidden "
        f"{FLAGS.hidden}, global batch {FLAGS.batch} over "
        f"{strategy.num_replicas_in_sync} replica(s), XLA "
        f"{'on' if trainer.jit_compile else 'off'}; uniform bytes: 8 bits/char",
        flush=True)
  start, losses = time.time(), []
  while int(step.numpy()) < FLAGS.steps:
    losses.append(float(trainer.train(batches)))
    step.assign_add(FLAGS.steps_per_call)
    done = int(step.numpy())
    if done % FLAGS.log_every < FLAGS.steps_per_call or done >= FLAGS.steps:
      progress.report({"train_bpc": np.mean(losses) / math.log(2.0),
                       "held_out_bpc": float(evaluate())})
      losses = []
    progress.maybe_save(force=done >= FLAGS.steps)
  print(f"held-out bits per character {float(evaluate()):.3f} after "
        f"{int(step.numpy())} steps ({time.time() - start:.0f} s this run)")
  if FLAGS.export_dir:
    module = tf_recurrent.export_saved_model(model, FLAGS.export_dir)
    print(f"exported to {FLAGS.export_dir}")
  else:
    module = tf_recurrent.StreamingModule(model)
  if FLAGS.sample_chars:
    text = sample(module, FLAGS.prompt.encode(), FLAGS.sample_chars,
                  FLAGS.temperature, FLAGS.seed)
    print("sample:\n" + (FLAGS.prompt.encode() + text).decode(
        "utf-8", errors="replace"))


if __name__ == "__main__":
  strategy_lib.set_job_defaults(seq_len=128, hidden=256, batch=32, steps=1000,
                                learning_rate=2e-3, log_every=100)
  app.run(main)
