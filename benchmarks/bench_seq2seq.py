r"""Attention decoder training step: tf_recurrent.RNN against keras.layers.RNN
and TF Addons' dynamic_decode.

One teacher-forced training step (forward over T target steps, a loss over
every step's output, the gradients of all weights) of the same decoder,
`seq2seq.AttentionWrapper(keras.layers.LSTMCell(H), BahdanauAttention(H),
attention_layer_size=H)` over a memory of T_src source steps:

* `tf_recurrent.RNN(wrapper, return_sequences=True)`: the op, whose backward
  pass keeps the wrapper's state per step and recomputes each step;
* `keras.layers.RNN(wrapper, return_sequences=True)`: TensorFlow's autodiff
  of the loop, which keeps every step's intermediates (for Bahdanau
  attention a [B, T_src, H] tensor or two per target step);
* with `--addons_python`, TF Addons' own `tfa.seq2seq.dynamic_decode`, as
  Addons' NMT tutorial trains: `BasicDecoder(AttentionWrapper(
  tf.keras.layers.LSTMCell(H), tfa.seq2seq.BahdanauAttention(H),
  attention_layer_size=H), sampler=TrainingSampler())` called on the
  inputs, autodiff of its `tf.while_loop`. Under XLA its decoder is given
  `maximum_iterations=T` (without it, dynamic_decode raises
  "maximum_iterations is required for XLA compilation.").

Addons needs TensorFlow <= 2.15 and its Keras 2, so its row runs in
processes of another venv's Python (`--addons_python`; see
`benchmarks/addons_seq2seq_child.py`): the same shapes, the same random
memory and inputs, but another TensorFlow than the other rows', and weights
initialized in another process. For the interleaved rounds a child serves
steps, one per call of an `AddonsStep` here; the call is what is timed, so
its time includes the pipe's round trip (two short lines: 0.2-0.4 ms on a
busy 2-core machine, against 1.5 s for a step at T=100). Its peak RSS is
that of its own fresh process, over TensorFlow 2.15's footprint instead of
TensorFlow 2.21 and tf_recurrent's. Its memory per target step is about
keras.layers.RNN's, which peaks at 21 GB at T=800 without XLA: when its
peak and the in-process steps' add up to more than the memory at hand, it
is timed in a group of its own with ours, before the others' group, and
its ratio to ours is to ours' time in that group.

With and without XLA. Reported:

* time: per T (T_src = T_tgt = T), the steps of all implementations run in
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
    python -m benchmarks.bench_seq2seq \
        --addons_python=/path/to/tf215/bin/python    # and the Addons row
    python -m benchmarks.bench_seq2seq --lengths=6,12 --batch=2 --hidden=4 \
        --input=3 --memory_sources=6 --memory_lengths=4,8 --rounds=1 \
        --out_dir=/tmp/b

Without `--addons_python` the Addons row is skipped (a note says so). Its
venv is CPython 3.11's (tensorflow-addons 0.23.0 has a cp311 wheel):

    python3.11 -m venv /path/to/tf215
    /path/to/tf215/bin/pip install tensorflow-cpu==2.15.1 \
        tensorflow-addons==0.23.0

Writes SEQ2SEQ.md and seq2seq.json into --out_dir.
"""

import os
import subprocess
import tempfile
from typing import Callable, Dict, List, Optional, Tuple

from absl import app
from absl import flags

from benchmarks.common import environment
from benchmarks.common import interleaved_medians
from benchmarks.common import json_of_child
from benchmarks.common import memory_at_hand
from benchmarks.common import peak_rss_of_child
from benchmarks.common import peak_rss_slope
from benchmarks.common import ROOT
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
flags.DEFINE_string("addons_python", "", "A Python with tensorflow-addons "
                    "(and TensorFlow <= 2.15) for the TF Addons row; empty: "
                    "no Addons row.")
flags.DEFINE_integer("source", 0, "Internal: T_src of a memory child (0: "
                     "the target length).")
flags.DEFINE_string("child", "", "Internal: measure one case and exit.")

OURS = "tf_recurrent.RNN(AttentionWrapper)"
KERAS = "keras.layers.RNN(AttentionWrapper)"
ADDONS = "tfa.seq2seq.dynamic_decode(BasicDecoder)"
IMPLS = [OURS, KERAS, ADDONS]
# What `--addons_python` runs the Addons row's steps in.
ADDONS_MODULE = "benchmarks.addons_seq2seq_child"


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


def _shape_args() -> List[str]:
  return [f"--batch={FLAGS.batch}", f"--input={FLAGS.input}",
          f"--hidden={FLAGS.hidden}"]


def addons_peak(jit: bool, steps: int) -> Tuple[Optional[int], Optional[str]]:
  """One Addons step alone in a fresh process of --addons_python: its peak
  RSS, or None and why (the error's first line, as the child prints it)."""
  proc = subprocess.run(
      [FLAGS.addons_python, "-m", ADDONS_MODULE,
       f"--child={ADDONS}|{int(jit)}|{steps}"] + _shape_args(),
      capture_output=True, text=True, check=False, cwd=ROOT)
  lines = proc.stdout.splitlines()
  peaks = [l for l in lines if l.startswith("PEAK_RSS ")]
  if proc.returncode == 0 and peaks:
    return int(peaks[0].split()[1]), None
  errors = [l[len("ERROR "):] for l in lines if l.startswith("ERROR ")]
  last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  return None, errors[0] if errors else f"exit {proc.returncode}: {last}"


class AddonsStep:
  """The Addons row's step as a callable: a `--serve` child of
  --addons_python (started, built and warmed up here) runs one step per
  call, which waits for the child's answer.

  A call's time as `interleaved_medians` takes it is the child's step plus
  the pipe's round trip; the child's own measure of each step is kept in
  `seconds`. A child that dies (out of memory, say) leaves its reason in
  `error` and its later calls return at once: `_timed` reports it failed.
  """

  def __init__(self, jit: bool, steps: int):
    self.seconds, self.error = [], None
    self._stderr = tempfile.TemporaryFile(mode="w+")
    self._proc = subprocess.Popen(
        [FLAGS.addons_python, "-m", ADDONS_MODULE,
         f"--serve={ADDONS}|{int(jit)}|{steps}"] + _shape_args(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
        text=True, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
      self._answer("READY")
    except RuntimeError:
      self.close()
      raise

  def _answer(self, word: str) -> str:
    """The child's next line that starts with `word` (other lines skipped);
    RuntimeError with its reason if it reports an error or exits."""
    for line in iter(self._proc.stdout.readline, ""):
      if line.startswith(word):
        return line
      if line.startswith("ERROR "):
        raise RuntimeError(line[len("ERROR "):].strip())
    self._stderr.seek(0)
    last = (self._stderr.read().strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"the Addons child exited ({self._proc.wait()}): "
                       f"{last}")

  def __call__(self) -> None:
    if self.error is not None:
      return
    try:
      self._proc.stdin.write("run\n")
      self._proc.stdin.flush()
      self.seconds.append(float(self._answer("SECONDS").split()[1]))
    except (OSError, RuntimeError) as e:  # A broken pipe is an OSError.
      self.error = str(e)

  def close(self) -> None:
    """Ends the child (its loop ends at EOF on stdin)."""
    try:
      self._proc.stdin.close()
    except OSError:
      pass
    try:
      self._proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()
    self._stderr.close()


def memory_slope(name: str, jit: bool, source: int) -> Dict[str, object]:
  hidden = FLAGS.hidden
  addons = name == ADDONS
  return peak_rss_slope(
      ADDONS_MODULE if addons else "benchmarks.bench_seq2seq", name, jit,
      [int(t) for t in FLAGS.memory_lengths],
      _shape_args() + [f"--source={source}"],
      4 * FLAGS.batch * (3 * hidden + source), repeats=FLAGS.memory_repeats,
      python=FLAGS.addons_python if addons else None)


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
  addons = [r for r in rows if r["name"] == ADDONS]
  lines = [
      "# Attention decoder training step: tf_recurrent.RNN vs "
      "keras.layers.RNN" + (" and tfa.seq2seq.dynamic_decode" if addons
                            else ""), "",
      f"One run of `python -m benchmarks.bench_seq2seq` on {env['cpu']}, "
      f"TensorFlow {env['tensorflow']}, Keras {env['keras']}" + (
          "; the Addons row in processes of its own with TensorFlow "
          f"{env['addons']['tensorflow']}, TF Addons "
          f"{env['addons']['tensorflow_addons']}, Keras "
          f"{env['addons']['keras']}, Python {env['addons']['python']}"
          if "addons" in env else "") + ". "
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
  if addons:
    lines += ["", f"{ADDONS}: Addons' NMT tutorial's training decoder "
              "(`BasicDecoder(wrapper, sampler=TrainingSampler())` on the "
              "inputs), autodiff of its while loop; under XLA with "
              "`maximum_iterations=T`, which dynamic_decode requires there. "
              "It runs in processes of the Addons venv (its peaks over "
              f"TensorFlow {env['addons']['tensorflow']}'s footprint, not "
              f"{env['tensorflow']}'s), its steps timed in turn with the "
              "others'."]
    for r in addons:
      mode = "XLA" if r["xla"] else "TF"
      for t, error in sorted(r["errors"].items(), key=lambda e: int(e[0])):
        lines.append(f"- {mode}, T={t}: failed: {error}")
      if r["timed_apart"]:
        lines.append(
            f"- {mode}, T={', '.join(map(str, r['timed_apart']))}: its peak "
            "and the in-process steps' exceeded the memory at hand, so it "
            "was timed with ours alone, before the others; its ratio below "
            "is to ours' time there (" + ", ".join(
                f"T={t}: {fmt(r['ours_ms_per_step'].get(str(t)))} ms/step"
                for t in r["timed_apart"]) + ").")

  def ratio(a, b):
    return "failed" if a is None or b is None else f"{a / b:.2f}x"

  lines += ["", "## Ratios (the other implementation / tf_recurrent.RNN, "
            "same mode: speed-up and memory saving)", ""]
  for name in (KERAS, ADDONS):
    for xla in (False, True):
      ours, peer = find(OURS, xla), find(name, xla)
      if ours is None or peer is None:
        continue
      # The Addons row against ours' time in the group it was timed in.
      ours_ms = peer.get("ours_ms_per_step", ours["ms_per_step"])
      times = [f"T={t}: {ratio(peer['ms_per_step'].get(str(t)), ours_ms.get(str(t)))}"
               for t in lengths]
      memory = [f"T_src={s}: {ratio(peer['memory'][str(s)]['bytes_per_step'], ours['memory'][str(s)]['bytes_per_step'])}"
                for s in sources]
      lines.append(f"- {name}, {'XLA' if xla else 'TF'}: time "
                   f"{', '.join(times)}; memory per target step "
                   f"{', '.join(memory)}.")
  if results.get("beam_search"):
    lines += ["", f"## Beam search (width {FLAGS.beam_width}), "
              "milliseconds per decoded step", "",
              "| mode | " + " | ".join(f"T={t}" for t in lengths) + " |",
              "|---|" + "---|" * len(lengths)]
    for mode, times in results["beam_search"].items():
      lines.append(f"| {mode} | " + " | ".join(
          fmt(times.get(str(t))) for t in lengths) + " |")
  return lines


def _timed(builders: Dict[str, Callable[[], Callable[[], object]]],
           errors: Optional[Dict[str, str]] = None) -> Dict[str, object]:
  """Interleaved medians of the steps that build and run; None for a step
  that fails (out of memory at long lengths, say), and why in `errors`.
  The Addons children end here."""
  steps, failed = {}, {}

  def fail(name, reason):
    failed[name] = None
    if errors is not None:
      errors[name] = reason
    print(f"  {name}: failed: {reason[:200]}", flush=True)

  try:
    for name, build in builders.items():
      try:
        step = build()
        steps[name] = step
        step()
      except Exception as e:  # pylint: disable=broad-except
        steps.pop(name, None)
        fail(name, f"{type(e).__name__}: {e}")
    medians = (interleaved_medians(steps, FLAGS.rounds, warmup=0) if steps
               else {})
  finally:
    for step in steps.values():
      if isinstance(step, AddonsStep):
        step.close()
  for name, step in steps.items():
    if getattr(step, "error", None) is not None:
      del medians[name]
      fail(name, step.error)
  return {**medians, **failed}


def _groups(fits: List[str], peaks: Dict[str, int]) -> List[List[str]]:
  """The interleaved groups in which the steps that fit at one length are
  timed, in turn: all of them in one, unless the Addons child's peak and
  the in-process steps' add up to more than `memory_at_hand`; then the
  Addons row with ours first (the child ends after it), then the others."""
  if ADDONS not in fits:
    return [fits]
  need, have = sum(peaks[name] for name in fits), memory_at_hand()
  first = [name for name in (OURS, ADDONS) if name in fits]
  rest = [name for name in fits if name != ADDONS]
  if need <= have or set(rest) <= set(first):
    return [fits]
  print(f"  peaks {need / 2**30:.1f} GB > {have / 2**30:.1f} GB at hand: "
        f"{' and '.join(first)} timed apart first", flush=True)
  return [first, rest]


def main(argv):
  del argv
  if FLAGS.child:
    run_child(build_step, FLAGS.child)
    return
  names = [n for n in IMPLS if not FLAGS.only or n in FLAGS.only]
  if ADDONS in names and not FLAGS.addons_python:
    print(f"No --addons_python: the {ADDONS} row is skipped (it runs in a "
          "Python with tensorflow-addons: --addons_python=/path/to/tf215/"
          "bin/python).", flush=True)
    names.remove(ADDONS)
  lengths = [int(t) for t in FLAGS.lengths]
  sources = [int(s) for s in FLAGS.memory_sources]
  results = {"environment": environment(), "lengths": lengths,
             "memory_sources": sources, "rows": [], "beam_search": {}}
  if ADDONS in names:
    versions = json_of_child(ADDONS_MODULE, ["--versions"],
                             python=FLAGS.addons_python)
    if versions is None:
      raise app.UsageError(f"--addons_python={FLAGS.addons_python} cannot "
                           f"run {ADDONS_MODULE} (its error is above)")
    results["environment"]["addons"] = versions
  from tf_recurrent import seq2seq  # pylint: disable=g-import-not-at-top
  beam = hasattr(seq2seq, "BeamSearchDecoder")
  peaks = {}
  # The Addons row's failures, its groups timed apart and ours' time in
  # them (the ratio's denominator), per mode and length.
  addons = {jit: {"errors": {}, "apart": [], "ours": {}}
            for jit in (False, True)}
  for jit in [mode == "xla" for mode in FLAGS.modes]:
    mode = "XLA" if jit else "TF"
    times = {name: {} for name in names}
    for steps in lengths:
      # One step in a child first, alone: its peak RSS, and whether it fits
      # in memory at all (an autodiff decoder at long lengths keeps tens of
      # GB; in this process the OOM killer would end the whole run).
      fits = []
      for name in names:
        if name == ADDONS:
          peak, error = addons_peak(jit, steps)
          if error is not None:
            addons[jit]["errors"][str(steps)] = error
            print(f"  {name}: failed: {error}", flush=True)
        else:
          peak = peak_rss_of_child("benchmarks.bench_seq2seq", [
              f"--child={name}|{int(jit)}|{steps}"] + _shape_args())
        peaks.setdefault((name, jit), {})[str(steps)] = peak
        if peak is not None:
          fits.append(name)
      builders = {name: (lambda n=name: AddonsStep(jit, steps) if n == ADDONS
                         else build_step(n, steps, jit)) for name in fits}
      groups = _groups(fits, {n: peaks[(n, jit)][str(steps)] for n in fits})
      medians = {}
      for group in groups:
        errors = {}
        group_medians = _timed({name: builders[name] for name in group},
                               errors)
        if ADDONS in group:
          if ADDONS in errors:
            addons[jit]["errors"][str(steps)] = errors[ADDONS]
          if group_medians.get(OURS) is not None:
            addons[jit]["ours"][str(steps)] = (group_medians[OURS] / steps *
                                               1e3)
          if len(groups) > 1:
            addons[jit]["apart"].append(steps)
        medians.update(group_medians)
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
      row = {"name": name, "xla": jit, "ms_per_step": times[name],
             "peak_rss": peaks[(name, jit)], "memory": memory}
      if name == ADDONS:
        row.update(errors=addons[jit]["errors"],
                   timed_apart=addons[jit]["apart"],
                   ours_ms_per_step=addons[jit]["ours"])
      results["rows"].append(row)
  write_results(FLAGS.out_dir, "seq2seq", results, report(results))


if __name__ == "__main__":
  app.run(main)
