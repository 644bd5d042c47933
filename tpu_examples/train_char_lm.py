r"""A character-level (byte-level) language model trained through tf_recurrent.

The model: a byte embedding, one recurrent layer (`--cell`: an LSTM, or the
linear recurrences MinGRU, MinLSTM, RG-LRU) and the logits of the next
byte. The corpus is any text file given with --corpus, or by default the
Python standard library's own source files, which every machine with Python
has. The last tenth is held out; the job reports held-out bits per
character, keeps resumable checkpoints and TensorBoard logs in --model_dir,
samples text from the trained model one step at a time, and exports a
SavedModel (whole-sequence and one-step signatures) with --export_dir.
Beside the SavedModel it writes TFLite models converted with the builtin op
set alone (`--notflite` skips them): `step.tflite`, the SavedModel's `step`
signature (one token and the states in, logits and the new states out),
and for the LSTM `sequence.tflite`, `--seq_len` tokens in, logits out, the
LSTM as TFLite's fused UNIDIRECTIONAL_SEQUENCE_LSTM without its cell-state
clip (`tf_recurrent.tflite.without_cell_clip`); the linear layers' whole-
sequence loop (chunks written in place) has no builtin TFLite form, their
step does. It prints their sizes, how far their logits are from the Keras
model's, and their per-token latency against the SavedModel's `step` run by
TensorFlow.

`--hidden` is the recurrent layer's units. The RG-LRU's inputs have its
width, so with `--cell=rglru` the embedding is `--hidden` wide (not
`--embedding`). `matched_hidden` gives the units at which a cell's model has
an LSTM model's parameters (`benchmarks/char_lm_quality.py` compares the
cells so).

Example:

    python -m tpu_examples.train_char_lm --steps=2000 --model_dir=/tmp/lm \
        --export_dir=/tmp/lm/export
    python -m tpu_examples.train_char_lm --cell=mingru --hidden=1021
"""

import contextlib
import io
import math
import os
import statistics
import sysconfig
import time
from typing import Callable, Dict, NamedTuple, Optional
import warnings

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
flags.DEFINE_bool("tflite", True, "With --export_dir, also write and time "
                  "TFLite models (TensorFlow 2.16.1's converter aborts on "
                  "Keras 3 models: pass --notflite there).")
flags.DEFINE_integer("latency_calls", 200, "Timed calls of each model.")

VOCAB = 256  # Bytes.
# --cell: the recurrent layer of each.
CELLS = {"lstm": tf_recurrent.LSTM, "mingru": tf_recurrent.MinGRU,
         "minlstm": tf_recurrent.MinLSTM, "rglru": tf_recurrent.RGLRU}
flags.DEFINE_enum("cell", "lstm", list(CELLS), "The recurrent layer: an "
                  "LSTM or a linear recurrence (MinGRU, MinLSTM, RG-LRU).")


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


def embedding_width(cell: str, hidden: int, embedding: int) -> int:
  """The embedding's width: `embedding`, or `hidden` for the RG-LRU (whose
  inputs have its width)."""
  return hidden if cell == "rglru" else embedding


def make_model(cell: Optional[str] = None, hidden: Optional[int] = None,
               embedding: Optional[int] = None) -> keras.Sequential:
  """Embedding -> the recurrent layer -> logits over the next byte.

  Args:
    cell: A key of `CELLS` (default --cell).
    hidden: The layer's units (default --hidden).
    embedding: The embedding's width (default --embedding; the RG-LRU's is
      `hidden`).

  Example:

  >>> make_model("mingru", hidden=8, embedding=4).count_params()
  3408
  """
  cell = cell or FLAGS.cell
  hidden = hidden or FLAGS.hidden
  embedding = embedding_width(cell, hidden, embedding or FLAGS.embedding)
  return keras.Sequential([
      keras.Input((None,), dtype="int32"),
      keras.layers.Embedding(VOCAB, embedding),
      CELLS[cell](hidden, return_sequences=True),
      keras.layers.Dense(VOCAB),
  ])


def parameter_count(cell: str, hidden: int, embedding: int) -> int:
  """The number of weights of `make_model(cell, hidden, embedding)`."""
  return make_model(cell, hidden, embedding).count_params()


def matched_hidden(cell: str, parameters: int, embedding: int) -> int:
  """The units at which `cell`'s model has closest to `parameters` weights.

  Example (an LSTM of 256 units with a 64-wide embedding: 410,880):

  >>> hidden = matched_hidden("mingru", 410880, 64)
  >>> hidden, parameter_count("mingru", hidden, 64)
  (1021, 410746)
  """
  low, high = 1, 1
  while parameter_count(cell, high, embedding) < parameters:
    low, high = high, high * 2
  while high - low > 1:  # The count grows with the units.
    middle = (low + high) // 2
    if parameter_count(cell, middle, embedding) < parameters:
      low = middle
    else:
      high = middle
  return min((low, high), key=lambda h: abs(
      parameter_count(cell, h, embedding) - parameters))


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


def sequence_model(model: keras.Sequential, length: int) -> keras.Model:
  """`model` on one sequence of `length` tokens, sharing its weights.

  TFLite fuses an LSTM only with a static batch size, so the exported
  SavedModel's `serving_default` (dynamic batch and time) does not convert;
  this batch-1 model does, with its logits named "output" as there.
  """
  inputs = keras.Input((length,), batch_size=1, dtype="int32", name="inputs")
  hidden = inputs
  for layer in model.layers:
    hidden = layer(hidden)
  return keras.Model(inputs, {"output": hidden})


def convert(converter: tf.lite.TFLiteConverter, quantize: bool) -> bytes:
  """The flatbuffer, with the default builtin op set (no Select TF ops).

  Args:
    converter: A converter of one model.
    quantize: Whether to quantize its weights to int8 (dynamic range).

  Returns:
    The converted model.
  """
  if quantize:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
  with contextlib.redirect_stdout(io.StringIO()):  # Keras's export log.
    return converter.convert()


def has_sequence_tflite(model: keras.Sequential) -> bool:
  """Whether the whole-sequence model converts to builtin TFLite ops: an
  LSTM does (fused); the linear layers' chunked loop does not."""
  return any(isinstance(layer, tf_recurrent.LSTM) for layer in model.layers)


def convert_tflite(model: keras.Sequential, export_dir: str, length: int,
                   quantize: bool = False) -> Dict[str, bytes]:
  """The streaming step and the whole-sequence model as TFLite flatbuffers.

  Args:
    model: The trained model.
    export_dir: The SavedModel `tf_recurrent.export_saved_model` wrote; its
      `step` signature (no loop, dynamic batch) converts as it is.
    length: The sequence model's number of tokens.
    quantize: Whether to quantize the weights (dynamic range).

  Returns:
    {"step": ..., "sequence": ...}; no "sequence" where
    `has_sequence_tflite` says it does not convert.

  Raises:
    ValueError: If a model needs an op outside TFLite's builtin set.
  """
  flatbuffers = {"step": convert(tf.lite.TFLiteConverter.from_saved_model(
      export_dir, signature_keys=["step"]), quantize)}
  if has_sequence_tflite(model):
    sequence = convert(tf.lite.TFLiteConverter.from_keras_model(
        sequence_model(model, length)), quantize)
    # The fused LSTM would clamp the cell state to [-10, 10], which Keras
    # does not; this LM's cell states reach 66-75 within 128 bytes.
    flatbuffers["sequence"] = tf_recurrent.tflite.without_cell_clip(sequence)
  for name, flatbuffer in flatbuffers.items():
    flex = [op for op in tf_recurrent.tflite.op_names(flatbuffer)
            if op.startswith("Flex")]
    if flex:
      raise ValueError(f"{name}.tflite needs Select TF ops: {flex}")
  return flatbuffers


def tflite_runner(flatbuffer: bytes) -> Callable[..., Dict[str, np.ndarray]]:
  """The model's signature runner on one interpreter thread."""
  with warnings.catch_warnings():
    # TF 2.20+ warns that tf.lite.Interpreter moves to the ai_edge_litert
    # package, whose Interpreter runs the same flatbuffers unchanged.
    warnings.filterwarnings("ignore", "(?s).*tf.lite.Interpreter is deprecated")
    interpreter = tf.lite.Interpreter(model_content=flatbuffer, num_threads=1)
  return interpreter.get_signature_runner()


def zero_state(step) -> Dict[str, np.ndarray]:
  """The zero states of one sequence for step.tflite's signature runner."""
  return {name: np.zeros([1] + list(detail["shape"][1:]), detail["dtype"])
          for name, detail in step.get_input_details().items()
          if name.startswith("state_")}


def initial_state(export_dir: str) -> Dict[str, np.ndarray]:
  """One sequence's initial states, from the SavedModel's `initial_state`
  signature (each layer's own: zeros for an LSTM, g(0) = 0.5 for MinGRU)."""
  signature = tf.saved_model.load(export_dir).signatures["initial_state"]
  return {name: value.numpy()
          for name, value in signature(batch_size=tf.constant(1)).items()}


def step_through(step, tokens: np.ndarray,
                 state: Optional[Dict[str, np.ndarray]] = None) -> np.ndarray:
  """Logits `[T, VOCAB]` of step.tflite's signature runner fed `tokens`
  one at a time from `state` (default: the zero state), its states fed
  back."""
  state = zero_state(step) if state is None else dict(state)
  logits = []
  for token in tokens:
    result = step(inputs=np.array([token], np.int32), **state)
    logits.append(result["output"][0])
    state = {name: result[name] for name in state}
  return np.stack(logits)


def median_latencies(invokers: Dict[str, Callable[[], object]], calls: int,
                     rounds: int = 10) -> Dict[str, float]:
  """Median seconds per call of each invoker over `calls` timed calls.

  The invokers take turns in `rounds` rounds, so a burst of load from
  another process on a shared machine slows all of them alike; within a
  round each runs its calls back to back, as a server stepping one stream
  does (taking turns call by call would time each with a cache the others
  just filled: 3-4x slower for the 1.6 MB default step model).
  """
  for invoke in invokers.values():  # Allocation and caches.
    invoke()
  times = {name: [] for name in invokers}
  names = list(invokers)
  for r in range(rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      for _ in range(-(-calls // rounds)):
        start = time.perf_counter()
        invokers[name]()
        times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def tflite_errors(runners, model: keras.Sequential, window: np.ndarray,
                  state: Dict[str, np.ndarray]) -> Dict[str, str]:
  """Largest logit differences on `window` (tokens `[T]`), described: the
  sequence model against the Keras model, the step model stepped token by
  token from `state` against the sequence model (against the Keras model
  where there is no sequence model)."""
  tokens = window[None, :].astype(np.int32)
  keras_logits = model(tokens)[0]
  stepped = step_through(runners["step"], window, state)
  if "sequence" not in runners:
    return {"step": f"{np.abs(stepped - keras_logits).max():.1e} vs Keras"}
  whole = runners["sequence"](inputs=tokens)["output"][0]
  return {"sequence": f"{np.abs(whole - keras_logits).max():.1e} vs Keras",
          "step": f"{np.abs(stepped - whole).max():.1e} vs sequence"}


class Row(NamedTuple):
  """A line of the latency table: `invoke` reads `tokens` tokens a call."""
  size: str
  invoke: Callable[[], object]
  tokens: int
  error: str


def tflite_rows(flatbuffers: Dict[str, bytes], model: keras.Sequential,
                window: np.ndarray, kind: str,
                state: Dict[str, np.ndarray]) -> Dict[str, Row]:
  """The step (and sequence) models' rows: sizes, calls, errors on `window`,
  the step model stepped from `state`.

  A call is what a Python server pays: the signature runner copying the
  inputs in and the outputs out around the interpreter's invoke.
  """
  runners = {k: tflite_runner(v) for k, v in flatbuffers.items()}
  errors = tflite_errors(runners, model, window, state)
  feed = dict(state, inputs=np.ones([1], np.int32))
  rows = {f"step.tflite{kind}": Row(
      str(len(flatbuffers["step"])), lambda: runners["step"](**feed), 1,
      errors["step"])}
  if "sequence" in runners:
    tokens = np.ones([1, len(window)], np.int32)
    rows[f"sequence.tflite{kind} (T={len(window)})"] = Row(
        str(len(flatbuffers["sequence"])),
        lambda: runners["sequence"](inputs=tokens), len(window),
        errors["sequence"])
  return rows


def saved_model_row(export_dir: str) -> Row:
  """The SavedModel's `step` signature, run by TensorFlow, as a row."""
  signatures = tf.saved_model.load(export_dir).signatures
  feed = dict(signatures["initial_state"](batch_size=tf.constant(1)),
              inputs=tf.constant([1]))
  return Row("", lambda: signatures["step"](**feed), 1, "")


def report_tflite(model: keras.Sequential, export_dir: str,
                  window: np.ndarray, calls: int) -> None:
  """Writes step.tflite and, for an LSTM, sequence.tflite (`len(window)`
  tokens) into `export_dir`, checks them against the Keras model on
  `window` (step.tflite stepped from the SavedModel's initial state), and
  prints their ops, sizes and per-token latencies, and those of their
  dynamic-range quantized variants (not written), beside the SavedModel's
  `step` run by TensorFlow."""
  flatbuffers = convert_tflite(model, export_dir, len(window))
  for name, flatbuffer in flatbuffers.items():
    with open(os.path.join(export_dir, f"{name}.tflite"), "wb") as f:
      f.write(flatbuffer)
    ops = sorted(set(tf_recurrent.tflite.op_names(flatbuffer)))
    print(f"wrote {name}.tflite: {', '.join(ops)}")
  state = initial_state(export_dir)
  rows = tflite_rows(flatbuffers, model, window, "", state)
  try:
    quantized = convert_tflite(model, export_dir, len(window), quantize=True)
    rows.update(tflite_rows(quantized, model, window, ", dynamic range",
                            state))
  except Exception as e:  # pylint: disable=broad-except
    print(f"dynamic-range quantization failed: {str(e)[:200]}")
  rows["SavedModel step (TensorFlow)"] = saved_model_row(export_dir)
  seconds = median_latencies({k: r.invoke for k, r in rows.items()}, calls)
  print(f"median of {calls} calls each, in interleaved rounds; TFLite on 1 "
        "thread")
  print("| model | bytes | us per token | max logit error |")
  print("|---|---|---|---|")
  for name, row in rows.items():
    print(f"| {name} | {row.size} | {seconds[name] / row.tokens * 1e6:.1f} "
          f"| {row.error} |")


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
        f"{len(held_out.numpy())} held out; T={FLAGS.seq_len}, {FLAGS.cell} "
        f"hidden {FLAGS.hidden} ({model.count_params()} parameters), global "
        f"batch {FLAGS.batch} over "
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
    if FLAGS.tflite:
      report_tflite(model, FLAGS.export_dir,
                    eval_batch[0, :FLAGS.seq_len].numpy(),
                    FLAGS.latency_calls)
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
