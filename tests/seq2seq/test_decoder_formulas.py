"""`dynamic_decode`'s numbers against its definition in NumPy
(references.py's Elman cell), eagerly, in a tf.function and compiled by
XLA, with random weights, inputs and initial states:

- teacher forcing (`BasicDecoder` with a `TrainingSampler`, on the op, and
  with a subclass of it, which the loop runs): the steps run until every
  sequence's length (or `maximum_iterations`); `impute_finished` zeroes a
  finished sequence's outputs and sample ids and keeps its state (a
  length-0 sequence keeps its initial state), else the cell runs on; the
  lengths returned; `output_time_major`; under XLA the outputs padded to
  `maximum_iterations`;
- greedy decoding (`GreedyEmbeddingSampler`): each step's input the
  embedding of the previous step's argmax, a sequence finished at its EOS
  (its length counting the EOS), the same imputation.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import MODES, once_per_mode, pairwise
import references as ref
from tf_recurrent import seq2seq

BATCH, TIME, INPUT_DEPTH, UNITS, VOCAB = 5, 6, 3, 4, 6
LENGTHS = np.array([6, 0, 3, 1, 4])
END_TOKEN = 3
# maximum_iterations: none, fewer steps than the longest sequence, more.
MAXIMA = [None, 4, 8]
PATHS = ["op", "loop"]


def allowed(path, impute, maximum, time_major, mode):
  del path, impute, time_major
  return mode != "xla" or maximum is not None  # XLA needs a maximum.


TEACHER_CASES = pairwise(PATHS, [False, True], MAXIMA, [False, True], MODES,
                         where=allowed)
# Greedy decoding ends by itself (every sequence's EOS) within 8 steps
# (test_greedy_data_exercise_the_loop); the maximum bounds it all the same,
# so that a wrong loop fails rather than runs forever.
GREEDY_CASES = pairwise([False, True], MAXIMA[1:], MODES)


def teacher_id(case):
  path, impute, maximum, time_major, mode = case
  return (f"{path}-impute={impute}-maximum={maximum}-"
          f"time_major={time_major}-{mode}")


def greedy_id(case):
  impute, maximum, mode = case
  return f"impute={impute}-maximum={maximum}-{mode}"


class LoopTrainingSampler(seq2seq.TrainingSampler):
  """Teacher forcing that `BasicDecoder` runs in `dynamic_decode`'s loop
  (the op runs a `TrainingSampler` itself)."""


class Model:
  """A SimpleRNNCell and output layer with random weights, the data."""

  def __init__(self):
    rng = np.random.default_rng(64)
    self.inputs = rng.normal(size=[BATCH, TIME, INPUT_DEPTH])
    self.state = rng.normal(size=[BATCH, UNITS])
    self.embedding = rng.normal(size=[VOCAB, INPUT_DEPTH])
    self.start_tokens = rng.integers(0, VOCAB, size=[BATCH])
    self.cell = keras.layers.SimpleRNNCell(UNITS, dtype="float64")
    self.output_layer = keras.layers.Dense(VOCAB, dtype="float64")
    self.output_layer(self.cell(tf.constant(self.inputs[:, 0]),
                                [tf.constant(self.state)])[0])
    ref.randomize(self.cell, rng)
    ref.randomize(self.output_layer, rng)

  def step(self, x, h):
    return ref.elman_step(x, h, self.cell.kernel.numpy(),
                          self.cell.recurrent_kernel.numpy(),
                          self.cell.bias.numpy())

  def logits(self, h):
    return h @ self.output_layer.kernel.numpy() + self.output_layer.bias.numpy()


def reference_loop(model, first_inputs, next_inputs, finished_now, impute,
                   maximum, initially_finished):
  """dynamic_decode's loop: runs while a sequence is unfinished (at most
  `maximum` steps); `next_inputs(t, ids)` and `finished_now(t, ids)` are
  the sampler's. Returns outputs `[batch, steps, units]`, ids, the final
  state and the lengths."""
  h, inputs = model.state, first_inputs
  finished = initially_finished
  lengths = np.zeros(BATCH, int)
  outputs, ids = [], []
  t = 0
  while not finished.all() and (maximum is None or t < maximum):
    new_h = model.step(inputs, h)
    out, step_ids = model.output(new_h)
    lengths = np.where(finished, lengths, t + 1)
    if impute:
      out = np.where(finished[:, None], 0.0, out)
      step_ids = np.where(finished, 0, step_ids)
      new_h = np.where(finished[:, None], h, new_h)
    outputs.append(out)
    ids.append(step_ids)
    finished = finished | finished_now(t, step_ids)
    h, inputs = new_h, next_inputs(t, step_ids)
    t += 1
  return np.stack(outputs, 1), np.stack(ids, 1), h, lengths


def reference_teacher_forcing(model, impute, maximum):
  model.output = lambda h: (h, h.argmax(1))
  return reference_loop(
      model, model.inputs[:, 0],
      lambda t, _: model.inputs[:, min(t + 1, TIME - 1)],
      lambda t, _: t + 1 >= LENGTHS, impute, maximum, LENGTHS == 0)


def reference_greedy(model, impute, maximum):
  model.output = lambda h: (model.logits(h), model.logits(h).argmax(1))
  return reference_loop(
      model, model.embedding[model.start_tokens],
      lambda _, ids: model.embedding[ids], lambda _, ids: ids == END_TOKEN,
      impute, maximum, np.zeros(BATCH, bool))


@pytest.fixture(scope="module")
def model():
  return Model()


@pytest.fixture(scope="module")
def decoded(model):
  """mode -> every case of the mode decoded, in one function of it."""

  def run(mode):
    results = {}
    for case in TEACHER_CASES:
      path, impute, maximum, time_major, case_mode = case
      if case_mode != mode:
        continue
      sampler = (seq2seq.TrainingSampler() if path == "op"
                 else LoopTrainingSampler())
      decoder = seq2seq.BasicDecoder(
          model.cell, sampler, impute_finished=impute,
          maximum_iterations=maximum, output_time_major=time_major)
      results[teacher_id(case)] = decoder(
          tf.constant(model.inputs), initial_state=[tf.constant(model.state)],
          sequence_length=tf.constant(LENGTHS, tf.int32))
    for case in GREEDY_CASES:
      impute, maximum, case_mode = case
      if case_mode != mode:
        continue
      decoder = seq2seq.BasicDecoder(
          model.cell, seq2seq.GreedyEmbeddingSampler(),
          output_layer=model.output_layer, impute_finished=impute,
          maximum_iterations=maximum)
      results[greedy_id(case)] = decoder(
          tf.constant(model.embedding),
          initial_state=[tf.constant(model.state)],
          start_tokens=tf.constant(model.start_tokens, tf.int32),
          end_token=END_TOKEN)
    return results

  return once_per_mode(run)


def check(result, expected, mode, maximum, time_major=False):
  (outputs, ids), (state,), lengths = result
  expected_outputs, expected_ids, expected_state, expected_lengths = expected
  if mode == "xla":  # The loop's arrays have maximum_iterations steps.
    pad = [(0, 0), (0, maximum - expected_ids.shape[1])]
    expected_outputs = np.pad(expected_outputs, pad + [(0, 0)])
    expected_ids = np.pad(expected_ids, pad)
  if time_major:
    outputs, ids = np.swapaxes(outputs, 0, 1), np.swapaxes(ids, 0, 1)
  np.testing.assert_allclose(outputs, expected_outputs, rtol=1e-12,
                             atol=1e-15)
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_allclose(state, expected_state, rtol=1e-12, atol=1e-15)
  np.testing.assert_array_equal(lengths, expected_lengths)


@pytest.mark.parametrize("case", TEACHER_CASES, ids=teacher_id)
def test_teacher_forcing_matches_the_definition(case, model, decoded):
  _, impute, maximum, time_major, mode = case
  check(decoded(mode)[teacher_id(case)],
        reference_teacher_forcing(model, impute, maximum), mode, maximum,
        time_major)


@pytest.mark.parametrize("case", GREEDY_CASES, ids=greedy_id)
def test_greedy_decoding_matches_the_definition(case, model, decoded):
  impute, maximum, mode = case
  check(decoded(mode)[greedy_id(case)],
        reference_greedy(model, impute, maximum), mode, maximum)


def test_greedy_data_exercise_the_loop(model):
  """Sequences end at different steps, so that the loop runs past
  finished ones; every one before 8 steps (the loop stops by itself), not
  every one within 4 (maximum_iterations stops it)."""
  _, _, _, lengths = reference_greedy(model, True, None)
  assert len(np.unique(lengths)) >= 3 and lengths.min() < 4
  assert 4 < lengths.max() < 8
