"""The samplers against their definitions, eagerly, in a tf.function and
compiled by XLA (each mode's cases in one function of it):

- scheduled sampling (Bengio et al. 2015): each example samples with
  probability p (a scalar, or one per example). The rate is measured over
  thousands of draws, enough to tell p from 1 - p (or p^2), and p = 0 and
  p = 1 must never and always sample. The next input is then the
  embedding of an id drawn from the step's logits
  (`ScheduledEmbeddingTrainingSampler`), or the step's output, through
  `next_inputs_fn` and beside the auxiliary inputs
  (`ScheduledOutputTrainingSampler`); else the given next input, read in
  the inputs' layout (`time_major`); `finished` from the lengths or mask;
- teacher forcing (`TrainingSampler`): lengths, masks, zero length, zero
  inputs once every sequence is finished;
- greedy and sampled decoding (`GreedyEmbeddingSampler`, argmax;
  `SampleEmbeddingSampler`, draws from softmax(logits / temperature),
  measured): their next inputs' embeddings and EOS.
"""

import numpy as np
import pytest
import tensorflow as tf

from conftest import MODES, once_per_mode, pairwise
import references as ref
from tf_recurrent import seq2seq

DRAWS = 3000  # The batch: one draw per example per call.
TIME, DEPTH, VOCAB, AUXILIARY_DEPTH = 3, 2, 5, 1
STEP = 1  # The step whose sample and next inputs are checked.
SIGMAS = 5  # A measured rate's tolerance, in standard deviations.
# A probability per example: three groups, never, always, sometimes.
GROUP_PROBABILITIES = np.array([0.0, 1.0, 0.3])
# A scalar probability's case runs at each of these, in one traced (and
# compiled) function; a vector gives each example one of
# GROUP_PROBABILITIES.
SCALARS = [np.float64(0.0), np.float64(0.3), np.float64(1.0)]
VECTOR = "vector"
PROBABILITIES = ["scalar", VECTOR]
LAYOUTS = [False, True]  # time_major
LENGTHS = ["none", "lengths", "mask"]
OUTPUT_EXTRAS = ["plain", "auxiliary", "next_inputs_fn_and_auxiliary"]
# The scheduled samplers' cases run each in one mode, every pair of option
# values (the mode one of the options) in some case: XLA compiles each
# sampler's gathers and scatters (of the examples sampled, and not) in
# about two seconds. Their lengths are random (lengths and masks are
# TrainingSampler's, tested below in every mode).
EMBEDDING_CASES = pairwise(PROBABILITIES, LAYOUTS, MODES)
OUTPUT_CASES = pairwise(PROBABILITIES, LAYOUTS, OUTPUT_EXTRAS, MODES)
TRAINING_CASES = pairwise(LAYOUTS, LENGTHS)
TEMPERATURES = [None, 0.5]


def case_id(case):
  return "-".join(f"time_major={v}" if isinstance(v, bool) else str(v)
                  for v in case)


class Data:
  """Random inputs, logits, outputs, embedding and lengths (float64)."""

  def __init__(self):
    rng = np.random.default_rng(61)
    self.inputs = rng.normal(size=[DRAWS, TIME, DEPTH])
    self.auxiliary = rng.normal(size=[DRAWS, TIME, AUXILIARY_DEPTH])
    self.logits = 1.5 * rng.normal(size=[DRAWS, VOCAB])
    self.outputs = rng.normal(size=[DRAWS, DEPTH])
    self.embedding = rng.normal(size=[VOCAB, DEPTH])
    self.start_tokens = rng.integers(0, VOCAB, size=[DRAWS])
    # Lengths from 0 (finished before the first step) to TIME.
    self.lengths = rng.integers(0, TIME + 1, size=[DRAWS])
    self.probabilities = GROUP_PROBABILITIES[np.arange(DRAWS) % 3]
    # One row of logits for every example of the sampled decoding, so that
    # the draws' frequencies estimate its softmax.
    self.shared_logits = np.array([1.2, -0.4, 0.3, -1.5, 0.8])

  def layout(self, x, time_major):
    return np.swapaxes(x, 0, 1) if time_major else x

  def lengths_of(self, kind):
    return np.full([DRAWS], TIME) if kind == "none" else self.lengths


def initialize_kwargs(data, kind, time_major):
  if kind == "lengths":
    return {"sequence_length": tf.constant(data.lengths, tf.int32)}
  if kind == "mask":
    mask = np.arange(TIME)[None, :] < data.lengths[:, None]
    return {"mask": tf.constant(data.layout(mask, time_major))}
  return {}


def next_input_fn(outputs):
  return 2 * tf.tanh(outputs)


@pytest.fixture(scope="module")
def data():
  return Data()


@pytest.fixture(scope="module")
def sampled(data):
  """(mode, scalar probability) -> every case's sampler results, from one
  function of the mode given the scalar (the samplers created inside it:
  `initialize` keeps tensors)."""

  def run(mode, scalar):
    vector = tf.constant(data.probabilities)
    logits = tf.constant(data.logits)
    results = {}
    for case in EMBEDDING_CASES:
      p, time_major, case_mode = case
      if case_mode != mode:
        continue
      sampler = seq2seq.ScheduledEmbeddingTrainingSampler(
          vector if p == VECTOR else scalar, time_major=time_major,
          seed=1, scheduling_seed=2)
      sampler.initialize(tf.constant(data.layout(data.inputs, time_major)),
                         embedding=tf.constant(data.embedding),
                         sequence_length=tf.constant(data.lengths, tf.int32))
      ids = sampler.sample(STEP, logits, None)
      finished, next_inputs, _ = sampler.next_inputs(STEP, logits, None, ids)
      results["embedding-" + case_id(case)] = (ids, finished, next_inputs)
    for case in OUTPUT_CASES:
      p, time_major, extras, case_mode = case
      if case_mode != mode:
        continue
      auxiliary = extras != "plain"
      sampler = seq2seq.ScheduledOutputTrainingSampler(
          vector if p == VECTOR else scalar, time_major=time_major,
          seed=3,
          next_inputs_fn=(next_input_fn
                          if extras == "next_inputs_fn_and_auxiliary"
                          else None))
      sampler.initialize(
          tf.constant(data.layout(data.inputs, time_major)),
          sequence_length=tf.constant(data.lengths, tf.int32),
          auxiliary_inputs=(tf.constant(data.layout(data.auxiliary,
                                                    time_major))
                            if auxiliary else None))
      outputs = tf.constant(data.outputs)
      ids = sampler.sample(STEP, outputs, None)
      finished, next_inputs, _ = sampler.next_inputs(STEP, outputs, None, ids)
      results["output-" + case_id(case)] = (ids, finished, next_inputs)
    for case in TRAINING_CASES:
      time_major, kind = case
      sampler = seq2seq.TrainingSampler(time_major=time_major)
      first = sampler.initialize(
          tf.constant(data.layout(data.inputs, time_major)),
          **initialize_kwargs(data, kind, time_major))
      steps = [sampler.next_inputs(t, None, None, None)[:2]
               for t in range(TIME)]
      results["training-" + case_id(case)] = (first, steps)
    for temperature in TEMPERATURES:
      sampler = seq2seq.SampleEmbeddingSampler(softmax_temperature=temperature,
                                               seed=4)
      start = sampler.initialize(tf.constant(data.embedding),
                                 tf.constant(data.start_tokens, tf.int32), 2)
      shared = tf.constant(np.tile(data.shared_logits, [DRAWS, 1]))
      ids = sampler.sample(STEP, shared, None)
      results[f"sample-{temperature}"] = (
          start, ids, sampler.next_inputs(STEP, shared, None, ids)[:2])
    for end_token in (2, "every"):
      sampler = seq2seq.GreedyEmbeddingSampler()
      start = sampler.initialize(tf.constant(data.embedding),
                                 tf.constant(data.start_tokens, tf.int32),
                                 2 if end_token == 2 else 4)
      greedy_logits = logits if end_token == 2 else tf.one_hot(
          tf.fill([DRAWS], 4), VOCAB, dtype=tf.float64)
      ids = sampler.sample(STEP, greedy_logits, None)
      results[f"greedy-{end_token}"] = (
          start, ids, sampler.next_inputs(STEP, greedy_logits, None, ids)[:2])
    return results

  tf.random.set_seed(58)
  return once_per_mode(run)


def assert_rate(selected, p, what):
  """`selected` (bools) at rate p: never at 0, always at 1, else within
  SIGMAS standard deviations."""
  rate = selected.mean()
  if p in (0.0, 1.0):
    assert rate == p, f"{what}: rate {rate}, probability {p}"
    return
  sigma = np.sqrt(p * (1 - p) / selected.size)
  assert abs(rate - p) < SIGMAS * sigma, (
      f"{what}: rate {rate} over {selected.size} draws, probability {p}")


def assert_rates(selected, p):
  if p != VECTOR:
    assert_rate(selected, p, "sampling")
    return
  for group, probability in enumerate(GROUP_PROBABILITIES):
    assert_rate(selected[group::3], probability, f"group {group}")


def probabilities_of(case):
  """The probabilities a case runs at."""
  return [VECTOR] if case[0] == VECTOR else SCALARS


def assert_frequencies(ids, probabilities, what):
  """Draws `ids`, one per row of `probabilities`, against them, within
  SIGMAS standard deviations: each id's frequency against its mean
  probability, and (each draw from its own row) the mean probability of
  the drawn ids against its expectation, the mean of sum_c p_c^2."""
  frequencies = np.eye(VOCAB)[ids].mean(0)
  expected = probabilities.mean(0)
  sigma = np.sqrt(expected * (1 - expected) / len(ids))
  assert np.all(np.abs(frequencies - expected) < SIGMAS * sigma + 1e-12), (
      f"{what}: frequencies {frequencies}, expected {expected}")
  drawn = probabilities[np.arange(len(ids)), ids]
  squares, cubes = (probabilities**2).sum(1), (probabilities**3).sum(1)
  sigma = np.sqrt((cubes - squares**2).sum()) / len(ids)
  assert abs(drawn.mean() - squares.mean()) < SIGMAS * sigma + 1e-12, (
      f"{what}: the drawn ids' mean probability {drawn.mean()}, expected "
      f"{squares.mean()}")


@pytest.mark.parametrize("case", EMBEDDING_CASES, ids=case_id)
def test_scheduled_embedding_sampling(case, data, sampled):
  mode = case[-1]
  for p in probabilities_of(case):
    ids, finished, next_inputs = sampled(
        mode, SCALARS[1] if p == VECTOR else p)["embedding-" + case_id(case)]
    selected = ids > -1
    assert np.all((ids == -1) | ((ids >= 0) & (ids < VOCAB)))
    assert_rates(selected, p)
    if selected.sum() > DRAWS / 2:
      assert_frequencies(ids[selected], ref.softmax(data.logits[selected]),
                         "the sampled ids")
    np.testing.assert_array_equal(finished, STEP + 1 >= data.lengths)
    expected = np.where(selected[:, None],
                        data.embedding[np.maximum(ids, 0)],
                        data.inputs[:, STEP + 1])
    np.testing.assert_array_equal(next_inputs, expected)


@pytest.mark.parametrize("case", OUTPUT_CASES, ids=case_id)
def test_scheduled_output_sampling(case, data, sampled):
  _, _, extras, mode = case
  outputs, given = data.outputs, data.inputs[:, STEP + 1]
  if extras == "next_inputs_fn_and_auxiliary":
    outputs = 2 * np.tanh(outputs)
  if extras != "plain":
    auxiliary = data.auxiliary[:, STEP + 1]
    outputs = np.concatenate([outputs, auxiliary], 1)
    given = np.concatenate([given, auxiliary], 1)
  for p in probabilities_of(case):
    ids, finished, next_inputs = sampled(
        mode, SCALARS[1] if p == VECTOR else p)["output-" + case_id(case)]
    assert set(np.unique(ids)) <= {0, 1}
    selected = ids == 1
    assert_rates(selected, p)
    np.testing.assert_array_equal(finished, STEP + 1 >= data.lengths)
    np.testing.assert_allclose(next_inputs,
                               np.where(selected[:, None], outputs, given),
                               rtol=1e-15, atol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", TRAINING_CASES, ids=case_id)
def test_teacher_forcing(case, mode, data, sampled):
  _, kind = case
  results = sampled(mode, SCALARS[1])
  (finished, first), steps = results["training-" + case_id(case)]
  lengths = data.lengths_of(kind)
  np.testing.assert_array_equal(finished, lengths == 0)
  np.testing.assert_array_equal(first, data.inputs[:, 0])
  for t, (finished, next_inputs) in enumerate(steps):
    np.testing.assert_array_equal(finished, t + 1 >= lengths)
    # Once every sequence is finished, the next inputs are zeros.
    expected = (np.zeros([DRAWS, DEPTH]) if t + 1 >= TIME
                else data.inputs[:, t + 1])
    np.testing.assert_array_equal(next_inputs, expected)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sample_embedding_draws_from_the_tempered_softmax(temperature, mode,
                                                          data, sampled):
  results = sampled(mode, SCALARS[1])
  (finished, start), ids, (next_finished, next_inputs) = results[
      f"sample-{temperature}"]
  assert not finished.any()
  np.testing.assert_array_equal(start, data.embedding[data.start_tokens])
  logits = data.shared_logits / (temperature or 1.0)
  assert_frequencies(ids, np.tile(ref.softmax(logits), [DRAWS, 1]),
                     f"temperature {temperature}")
  np.testing.assert_array_equal(next_finished, ids == 2)
  np.testing.assert_array_equal(next_inputs, data.embedding[ids])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("end_token", [2, "every"])
def test_greedy_embedding(end_token, mode, data, sampled):
  results = sampled(mode, SCALARS[1])
  (finished, start), ids, (next_finished, next_inputs) = results[
      f"greedy-{end_token}"]
  assert not finished.any()
  np.testing.assert_array_equal(start, data.embedding[data.start_tokens])
  if end_token == 2:
    np.testing.assert_array_equal(ids, data.logits.argmax(1))
    np.testing.assert_array_equal(next_finished, ids == 2)
    assert 0 < next_finished.sum() < DRAWS
    np.testing.assert_array_equal(next_inputs, data.embedding[ids])
  else:  # Every sequence emits EOS: the next inputs are the start inputs.
    assert next_finished.all()
    np.testing.assert_array_equal(next_inputs,
                                  data.embedding[data.start_tokens])


@pytest.mark.parametrize("sampler_class", [
    seq2seq.ScheduledEmbeddingTrainingSampler,
    seq2seq.ScheduledOutputTrainingSampler])
def test_a_probability_per_example_must_match_the_batch(sampler_class):
  sampler = sampler_class([0.5, 0.5])
  kwargs = ({"embedding": tf.ones([VOCAB, DEPTH])}
            if sampler_class is seq2seq.ScheduledEmbeddingTrainingSampler
            else {})
  sampler.initialize(tf.ones([3, TIME, DEPTH]), **kwargs)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="sampling_probability, a vector, must have one "
                     "probability per example"):
    sampler.sample(0, tf.ones([3, VOCAB]), None)
