r"""Attention decoder training step: tf_recurrent.RNN against keras.layers.RNN.

One teacher-forced training step (forward over T target steps, a loss over
every step's output, the gradients of all weights) of the same decoder,
`seq2seq.AttentionWrapper(keras.layers.LSTMCell(H), BahdanauAttention(H),
attention_layer_size=H)` over a memory of T_src source steps:

* `tf_recurrent.RNN(wrapper, return_sequences=True)`: the op, whose backward
  pass keeps the wrapper's state per step and recomputes each step;
* `keras.layers.RNN(wrapper, return_sequences=True)`: TensorFlow's autodiff
  of the loop, which keeps every step's intermediates (for Bahdanau
  attention a [B, T_src, H] tensor or two per target step).

TF Addons' own `dynamic_decode` needs TensorFlow <= 2.15 and its Keras 2,
in a venv of its own (tensorflow-addons 0.23.0 has a CPython 3.11 wheel);
that row is not measured yet.

With and without XLA. Reported:

* time: per T (T_src = T_tgt = T), the steps of both implementations run in
  turn, round after round, and the median per implementation, in
  milliseconds per target step; each step first runs once alone in a fresh
  process, for its peak RSS and to leave out a step that does not fit in
  memory;
* memory: per T_src, the peak RSS of one step at two target lengths, each
  in its own subprocess; the slope between them is what each extra target
  step costs, also as a multiple of the decoder's state per step (cell
  state h and c, attention, alignments: 4 * B * (2H + H + T_src) bytes);
* beam search: `BeamSearchDecoder` decoding (when this package has it), with
  and without XLA.

Usage:

    python -m benchmarks.bench_seq2seq               # full run (~25 min)
    python -m benchmarks.bench_seq2seq --lengths=6,12 --batch=2 --hidden=4 \
        --input=3 --memory_sources=6 --memory_lengths=4,8 --rounds=1 \
        --out_dir=/tmp/b

Writes SEQ2SEQ.md and seq2seq.json into --out_dir.
"""

import os
from typing import Callable, Dict, List

from absl import app
from absl import flags

from benchmarks.common import environment
from benchmarks.common import interleaved_medians
from benchmarks.common import peak_rss_of_child
from benchmarks.common import peak_rss_slope
from benchmarks.common import run_child
from benchmarks.common import write_results

FLAGS = flags.FLAGS
flags.DEFINE_list("lengths", ["100", "400", "800"],
                  "Lengths T (source and target) of the timed steps.")
flags.DEFINE_list("memory_sources", ["100", "400", "800"],
                  "Source lengths T_src of the memory slopes.")
flags.DEFINE_list("memory_lengths", ["50", "100"],
                  "Two target lengths for each memory slope.")
flags.DEFINE_integer("memory_repeats", 1, "Processes per memory length "
                     "(the median peak is kept).")
flags.DEFINE_integer("batch", 32, "Batch size B.")
flags.DEFINE_integer("input", 128, "Decoder input features D.")
flags.DEFINE_integer("hidden", 256, "LSTM units, attention depth and "
                     "attention layer size H.")
flags.DEFINE_integer("rounds", 3, "Interleaved timed rounds (median kept).")
flags.DEFINE_integer("beam_width", 4, "Beam width of the beam-search rows.")
flags.DEFINE_list("only", [], "Run only these implementations.")
flags.DEFINE_list("modes", ["tf", "xla"], "TF executor, XLA, or both.")
flags.DEFINE_string("out_dir", os.path.dirname(os.path.abspath(__file__)),
                    "Where to write the results.")
flags.DEFINE_integer("source", 0, "Internal: T_src of a memory child (0: "
                     "the target length).")
flags.DEFINE_string("child", "", "Internal: measure one case and exit.")

OURS = "tf_recurrent.RNN(AttentionWrapper)"
KERAS = "keras.layers.RNN(AttentionWrapper)"
IMPLS = [OURS, KERAS]


def _decoder(source_steps: int):
  """The wrapper over a fixed random memory, and its mechanism."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_recurrent import seq2seq  # pylint: disable=g-import-not-at-top

  memory = tf.random.stateless_normal(
      (FLAGS.batch, source_steps, FLAGS.hidden), seed=[3, 4])
  mechanism = seq2seq.BahdanauAttention(FLAGS.hidden, memory=memory)
  cell = seq2seq.AttentionWrapper(keras.layers.LSTMCell(FLAGS.hidden),
                                  mechanism, attention_layer_size=FLAGS.hidden)
  return cell, mechanism, memory


def build_step(name: str, steps: int, jit: bool) -> Callable[[], object]:
  """One training step of `name` over `steps` target steps, as a callable;
  the memory has FLAGS.source steps (or `steps`)."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top

  cell, mechanism, memory = _decoder(FLAGS.source or steps)
  x = tf.random.stateless_normal((FLAGS.batch, steps, FLAGS.input),
                                 seed=[1, 2])
  rnn = tf_recurrent.RNN if name == OURS else keras.layers.RNN
  layer = rnn(cell, return_sequences=True)
  layer(x[:, :1])  # Builds every weight, outside the traced step.

  @tf.function(jit_compile=jit)
  def step():
    with tf.GradientTape() as tape:
      # As in training, where the memory is the encoder's output: its keys
      # are computed inside the differentiated step.
      mechanism.setup_memory(memory)
      loss = tf.reduce_mean(tf.square(layer(x)))
    return tape.gradient(loss, layer.trainable_weights)

  return lambda: [g.numpy() for g in step()]


def build_beam_search(steps: int, jit: bool) -> Callable[[], object]:
  """Beam-search decoding of `steps` target steps over a memory of `steps`
  source steps (tiled per beam), as a callable."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_recurrent import seq2seq  # pylint: disable=g-import-not-at-top

  width, vocab = FLAGS.beam_width, 64
  cell, mechanism, memory = _decoder(steps)
  embedding = keras.layers.Embedding(vocab, FLAGS.input)
  project = keras.layers.Dense(vocab)
  decoder = seq2seq.BeamSearchDecoder(cell, width, embedding_fn=embedding,
                                      output_layer=project,
                                      maximum_iterations=steps)
  start = tf.fill([FLAGS.batch], 1)

  @tf.function(jit_compile=jit)
  def decode():
    mechanism.setup_memory(seq2seq.tile_batch(memory, width))
    state = cell.get_initial_state(batch_size=FLAGS.batch * width,
                                   dtype=tf.float32)
    outputs = decoder(None, start_tokens=start, end_token=0,
                      initial_state=state)[0]
    return outputs.predicted_ids

  return lambda: decode().numpy()


def memory_slope(name: str, jit: bool, source: int) -> Dict[str, object]:
  hidden = FLAGS.hidden
  return peak_rss_slope(
      "benchmarks.bench_seq2seq", name, jit,
      [int(t) for t in FLAGS.memory_lengths],
      [f"--batch={FLAGS.batch}", f"--input={FLAGS.input}",
       f"--hidden={hidden}", f"--source={source}"],
      4 * FLAGS.batch * (3 * hidden + source), repeats=FLAGS.memory_repeats)


def report(results: dict) -> List[str]:
  """SEQ2SEQ.md: the tables, then ours against Keras per mode."""
  env, lengths, rows = (results["environment"], results["lengths"],
                        results["rows"])
  sources = results["memory_sources"]

  def fmt(value, pattern="{:.1f}"):
    return "failed" if value is None else pattern.format(value)

  def find(name, xla):
    return next((r for r in rows if r["name"] == name and r["xla"] == xla),
                None)

  hidden = FLAGS.hidden
  lines = [
      "# Attention decoder training step: tf_recurrent.RNN vs "
      "keras.layers.RNN", "",
      f"One run of `python -m benchmarks.bench_seq2seq` on {env['cpu']}, "
      f"TensorFlow {env['tensorflow']}, Keras {env['keras']}. "
      f"`AttentionWrapper(LSTMCell({hidden}), BahdanauAttention({hidden}), "
      f"attention_layer_size={hidden})`, B={FLAGS.batch}, D={FLAGS.input}, "
      "float32; a teacher-forced training step (forward, loss over every "
      "step's output, gradients of all weights). Time: median of "
      f"{FLAGS.rounds} interleaved rounds, milliseconds per target step, "
      "T_src = T_tgt = T (failed: the step did not fit in memory). Peak GB: "
      "one step's peak RSS in a fresh process. Memory: slope of the peak RSS between T_tgt=" +
      " and T_tgt=".join(FLAGS.memory_lengths) + " at each T_src, per "
      "target step, and as a multiple of the decoder's state per step "
      "(h, c, attention, alignments).", "",
      "| implementation | mode | " + " | ".join(f"T={t}" for t in lengths) +
      " | " + " | ".join(f"peak GB T={t}" for t in lengths) +
      " | " + " | ".join(f"bytes/step T_src={s}" for s in sources) +
      " | " + " | ".join(f"x state T_src={s}" for s in sources) + " |",
      "|---|---|" + "---|" * (2 * len(lengths) + 2 * len(sources))]
  for r in rows:
    memory = [r["memory"][str(s)] for s in sources]
    lines.append(
        f"| {r['name']} | {'XLA' if r['xla'] else 'TF'} | " +
        " | ".join(fmt(r["ms_per_step"].get(str(t))) for t in lengths) +
        " | " + " | ".join(
            fmt(None if r["peak_rss"].get(str(t)) is None else
                r["peak_rss"][str(t)] / 2**30, "{:.2f}") for t in lengths) +
        " | " + " | ".join(fmt(m["bytes_per_step"], "{:.0f}")
                           for m in memory) +
        " | " + " | ".join(fmt(m["vs_state"], "{:.2f}x") for m in memory) +
        " |")
  lines += ["", "## Ratios (keras.layers.RNN / tf_recurrent.RNN, same mode: "
            "speed-up and memory saving)", ""]
  for xla in (False, True):
    ours, peer = find(OURS, xla), find(KERAS, xla)
    if ours is None or peer is None:
      continue

    def ratio(a, b):
      return "failed" if a is None or b is None else f"{a / b:.2f}x"

    times = [f"T={t}: {ratio(peer['ms_per_step'].get(str(t)), ours['ms_per_step'].get(str(t)))}"
             for t in lengths]
    memory = [f"T_src={s}: {ratio(peer['memory'][str(s)]['bytes_per_step'], ours['memory'][str(s)]['bytes_per_step'])}"
              for s in sources]
    lines.append(f"- {'XLA' if xla else 'TF'}: time {', '.join(times)}; "
                 f"memory per target step {', '.join(memory)}.")
  if results.get("beam_search"):
    lines += ["", f"## Beam search (width {FLAGS.beam_width}), "
              "milliseconds per decoded step", "",
              "| mode | " + " | ".join(f"T={t}" for t in lengths) + " |",
              "|---|" + "---|" * len(lengths)]
    for mode, times in results["beam_search"].items():
      lines.append(f"| {mode} | " + " | ".join(
          fmt(times.get(str(t))) for t in lengths) + " |")
  return lines


def _timed(builders: Dict[str, Callable[[], Callable[[], object]]]
           ) -> Dict[str, object]:
  """Interleaved medians of the steps that build and run; None for a step
  that fails (out of memory at long lengths, say)."""
  steps, failed = {}, {}
  for name, build in builders.items():
    try:
      step = build()
      step()
      steps[name] = step
    except Exception as e:  # pylint: disable=broad-except
      failed[name] = None
      print(f"  {name}: failed: {type(e).__name__}: {str(e)[:200]}",
            flush=True)
  medians = (interleaved_medians(steps, FLAGS.rounds, warmup=0) if steps
             else {})
  return {**medians, **failed}


def main(argv):
  del argv
  if FLAGS.child:
    run_child(build_step, FLAGS.child)
    return
  names = [n for n in IMPLS if not FLAGS.only or n in FLAGS.only]
  lengths = [int(t) for t in FLAGS.lengths]
  sources = [int(s) for s in FLAGS.memory_sources]
  results = {"environment": environment(), "lengths": lengths,
             "memory_sources": sources, "rows": [], "beam_search": {}}
  from tf_recurrent import seq2seq  # pylint: disable=g-import-not-at-top
  beam = hasattr(seq2seq, "BeamSearchDecoder")
  peaks = {}
  for jit in [mode == "xla" for mode in FLAGS.modes]:
    mode = "XLA" if jit else "TF"
    times = {name: {} for name in names}
    for steps in lengths:
      # One step in a child first, alone: its peak RSS, and whether it fits
      # in memory at all (an autodiff decoder at long lengths keeps tens of
      # GB; in this process the OOM killer would end the whole run).
      fits = []
      for name in names:
        peak = peak_rss_of_child("benchmarks.bench_seq2seq", [
            f"--child={name}|{int(jit)}|{steps}", f"--batch={FLAGS.batch}",
            f"--input={FLAGS.input}", f"--hidden={FLAGS.hidden}"])
        peaks.setdefault((name, jit), {})[str(steps)] = peak
        if peak is not None:
          fits.append(name)
      medians = _timed({name: (lambda n=name: build_step(n, steps, jit))
                        for name in fits})
      medians.update({name: None for name in names if name not in fits})
      for name, seconds in medians.items():
        times[name][str(steps)] = (None if seconds is None else
                                   seconds / steps * 1e3)
        print(f"  {name:40s} {mode:3s} T={steps:5d} "
              f"{times[name][str(steps)]} ms/step", flush=True)
      if beam:
        seconds = _timed({"beam": lambda: build_beam_search(steps, jit)})
        results["beam_search"].setdefault(mode, {})[str(steps)] = (
            None if seconds["beam"] is None else seconds["beam"] / steps * 1e3)
        print(f"  beam search {mode:3s} T={steps:5d} "
              f"{results['beam_search'][mode][str(steps)]} ms/step", flush=True)
    for name in names:
      memory = {}
      for source in sources:
        memory[str(source)] = memory_slope(name, jit, source)
        print(f"  {name:40s} {mode:3s} memory T_src={source} "
              f"{memory[str(source)]['vs_state']} x state", flush=True)
      results["rows"].append({"name": name, "xla": jit,
                              "ms_per_step": times[name],
                              "peak_rss": peaks[(name, jit)],
                              "memory": memory})
  write_results(FLAGS.out_dir, "seq2seq", results, report(results))


if __name__ == "__main__":
  app.run(main)
