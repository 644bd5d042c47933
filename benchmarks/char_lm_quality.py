r"""Bits per character of the char LM's cells at equal parameters, after
equal steps and after equal wall time.

`tpu_examples/train_char_lm.py`'s model (byte embedding, one recurrent
layer, logits of the next byte) with each `--cells` cell: the LSTM at
`--hidden` units, each other cell at the units that give its model the
LSTM model's parameter count (`train_char_lm.matched_hidden`; the counts
are printed). Every model starts from weights of the same seed and trains
on the same batches in the same order (Adam, global-norm clipping, XLA as
the job does). The cells' training calls (`--steps_per_call` steps each)
take turns, so a slow-down of the machine weighs on every cell alike; a
cell's wall time is the sum of its own calls. Its first call (tracing,
compiling) is not counted: it runs once, then the model's weights and the
optimizer's state are put back and the batches start again from the first.

Each cell trains until it has done `--steps` steps and `--seconds` of
training; held-out bits per character (on `--eval_windows` windows of the
held-out tenth) are measured when it reaches `--steps` steps and when its
wall time reaches `--seconds` (at the end of the call that crosses it; the
steps and seconds there are recorded).

Usage (the full run on a quiet machine, about 8 minutes):

    python -m benchmarks.char_lm_quality
    python -m benchmarks.char_lm_quality --steps=4 --seconds=1 --seq_len=12 \
        --hidden=8 --embedding=4 --batch=4 --eval_windows=4 \
        --steps_per_call=2 --corpus_bytes=20000 --out_dir=/tmp/q

Writes char_lm.json into --out_dir and renders LINEAR.md there
(`benchmarks/linear_report.py`).
"""

import math
import sys
import time
from typing import Dict, List

from absl import app
from absl import flags
import keras
import numpy as np
import tensorflow as tf

from benchmarks import linear_report
from benchmarks.common import environment
from benchmarks.common import load_note
from tpu_examples import strategy as strategy_lib
from tpu_examples import train_char_lm

FLAGS = flags.FLAGS
flags.DEFINE_list("cells", list(train_char_lm.CELLS),
                  "The cells to compare; the LSTM's parameters are the "
                  "others' target.")
flags.DEFINE_float("seconds", 100.0, "Training wall time of each cell.")
flags.DEFINE_string("out_dir", linear_report.DEFAULT_DIR,
                    "Where to write the results.")


class CellRun:
  """One cell's model, trainer and progress."""

  def __init__(self, cell: str, hidden: int, train_data: tf.Tensor,
               eval_batch: tf.Tensor):
    self.cell, self.hidden = cell, hidden
    keras.utils.set_random_seed(FLAGS.seed)
    strategy = tf.distribute.get_strategy()
    self.model = train_char_lm.make_model(cell, hidden, FLAGS.embedding)
    self.optimizer = keras.optimizers.Adam(FLAGS.learning_rate)
    model = self.model
    self.trainer = strategy_lib.Trainer(
        strategy, model.trainable_variables,
        lambda batch, training: train_char_lm.per_sequence_nats(
            model, batch, training),
        self.optimizer, FLAGS.batch, FLAGS.steps_per_call, FLAGS.jit_compile,
        clip_norm=1.0)
    self._evaluate = tf.function(lambda: tf.reduce_mean(
        train_char_lm.per_sequence_nats(model, eval_batch)) / math.log(2.0))
    self._batches = lambda: strategy_lib.distribute_steps(
        strategy, lambda i: train_char_lm.windows(
            train_data, FLAGS.seed, i, FLAGS.batch, FLAGS.seq_len),
        FLAGS.batch)
    self.steps, self.seconds, self.call_seconds = 0, 0.0, []
    self.results = {"cell": cell, "hidden": hidden,
                    "parameters": model.count_params()}
    self._compile()

  def _compile(self) -> None:
    """The first call (trace, compile), undone: the weights, the
    optimizer's state and the batches as they were."""
    weights = [v.numpy() for v in self.model.weights]
    slots = [v.numpy() for v in self.optimizer.variables]
    start = time.perf_counter()
    float(self.trainer.train(self._batches()))
    self.results["first_call_seconds"] = time.perf_counter() - start
    for variable, value in zip(self.model.weights + self.optimizer.variables,
                               weights + slots):
      variable.assign(value)
    self.batches = self._batches()

  def done(self) -> bool:
    return self.steps >= FLAGS.steps and self.seconds >= FLAGS.seconds

  def train_call(self) -> None:
    """One call of `--steps_per_call` steps; held-out bits per character
    when it reaches --steps steps or --seconds of training."""
    start = time.perf_counter()
    float(self.trainer.train(self.batches))
    self.call_seconds.append(time.perf_counter() - start)
    before = self.steps, self.seconds
    self.steps += FLAGS.steps_per_call
    self.seconds += self.call_seconds[-1]
    if before[0] < FLAGS.steps <= self.steps:
      self.results.update(bpc_at_steps=float(self._evaluate()),
                          seconds_at_steps=self.seconds)
    if before[1] < FLAGS.seconds <= self.seconds:
      self.results.update(bpc_at_seconds=float(self._evaluate()),
                          steps_in_seconds=self.steps,
                          seconds_at_seconds=self.seconds)

  def summary(self) -> Dict[str, object]:
    per_step = np.median(self.call_seconds) / FLAGS.steps_per_call
    return {**self.results, "ms_per_step": float(per_step * 1e3)}


def hidden_sizes(cells: List[str]) -> Dict[str, int]:
  """Each cell's units: the LSTM's --hidden, the others' matched to the
  LSTM model's parameter count."""
  target = train_char_lm.parameter_count("lstm", FLAGS.hidden,
                                         FLAGS.embedding)
  return {cell: FLAGS.hidden if cell == "lstm" else
          train_char_lm.matched_hidden(cell, target, FLAGS.embedding)
          for cell in cells}


def main(argv):
  del argv
  unknown = [c for c in FLAGS.cells if c not in train_char_lm.CELLS]
  if unknown:
    raise app.UsageError(f"--cells: unknown {unknown}; expected some of "
                         f"{list(train_char_lm.CELLS)}")
  if FLAGS.steps % FLAGS.steps_per_call:
    raise app.UsageError(f"--steps={FLAGS.steps} must be a multiple of "
                         f"--steps_per_call={FLAGS.steps_per_call}")
  started = time.perf_counter()
  print(f"{load_note()}", flush=True)
  train_data, held_out = train_char_lm.split_corpus(
      train_char_lm.read_corpus(FLAGS.corpus, FLAGS.corpus_bytes))
  eval_batch = train_char_lm.windows(held_out, FLAGS.seed + 1, 0,
                                     FLAGS.eval_windows, FLAGS.seq_len)
  sizes = hidden_sizes(FLAGS.cells)
  runs = []
  for cell, hidden in sizes.items():
    runs.append(CellRun(cell, hidden, train_data, eval_batch))
    print(f"{cell}: hidden {hidden}, {runs[-1].results['parameters']} "
          f"parameters, first call {runs[-1].results['first_call_seconds']:.1f}"
          " s", flush=True)
  turn = 0
  while not all(run.done() for run in runs):
    # Each round starts one cell later: none always runs after the same one.
    order = runs[turn % len(runs):] + runs[:turn % len(runs)]
    for run in order:
      if not run.done():
        run.train_call()
    turn += 1
  cells = [run.summary() for run in runs]
  print("| cell | hidden | parameters | ms/step | bpc @ steps | steps in "
        "seconds | bpc @ seconds |")
  for c in cells:
    print(f"| {c['cell']} | {c['hidden']} | {c['parameters']} | "
          f"{c['ms_per_step']:.1f} | {c['bpc_at_steps']:.3f} | "
          f"{c['steps_in_seconds']} | {c['bpc_at_seconds']:.3f} |")
  lstm_parameters = train_char_lm.parameter_count("lstm", FLAGS.hidden,
                                                  FLAGS.embedding)
  results = {
      "environment": environment(), "load": load_note(),
      "command": " ".join(["python -m benchmarks.char_lm_quality"] +
                          sys.argv[1:]),
      "corpus": FLAGS.corpus or "the Python standard library's sources",
      "corpus_bytes": FLAGS.corpus_bytes, "seq_len": FLAGS.seq_len,
      "batch": FLAGS.batch, "learning_rate": FLAGS.learning_rate,
      "jit_compile": FLAGS.jit_compile, "embedding": FLAGS.embedding,
      "steps_per_call": FLAGS.steps_per_call,
      "eval_windows": FLAGS.eval_windows, "steps": FLAGS.steps,
      "seconds": FLAGS.seconds, "parameters_target": lstm_parameters,
      "cells": cells, "wall_seconds": time.perf_counter() - started}
  linear_report.write(FLAGS.out_dir, linear_report.CHAR_LM, results)


if __name__ == "__main__":
  strategy_lib.set_job_defaults(seq_len=128, hidden=256, batch=32, steps=300,
                                learning_rate=2e-3, steps_per_call=10)
  FLAGS.set_default("eval_windows", 256)
  app.run(main)
