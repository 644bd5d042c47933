"""Beam search's scores against GNMT's definitions (Wu et al. 2016), in
float64 NumPy (references.py), eagerly, in a tf.function and compiled by
XLA:

- one step (`_beam_search_step`) from a random beam state (log
  probabilities, finished beams, lengths, accumulated attention with
  masked source positions and sums above 1): every continuation's score
  log P / lp + cp, the length penalty lp = ((5 + |Y|) / 6)^alpha, the
  coverage penalty cp = beta * sum_j log(min(sum_t p_tj, 1)) (on the beams
  finished before the step, as Addons applies it), a finished beam's only
  continuation EOS at no cost, the top beams, their parents, log
  probabilities, lengths, finished flags and gathered states;
- a whole decode by `BeamSearchDecoder` over an `AttentionWrapper`
  (random weights), with both penalties, against the same search run in
  NumPy over the wrapper's definition, back-tracked by `gather_tree`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import MODES, in_mode, once_per_mode
import references as ref
from tf_recurrent import seq2seq
from tf_recurrent.seq2seq import beam_search_decoder

BATCH, BEAM, VOCAB, SOURCE, UNITS = 3, 4, 6, 5, 3
END_TOKEN = 2
SOURCE_LENGTHS = [5, 3, 4]
# (length_penalty_weight, coverage_penalty_weight, output_all_scores).
STEP_CASES = [(0.0, 0.0, True), (0.8, 0.0, False), (0.0, 0.45, True),
              (0.8, 0.45, False), (0.8, 0.45, True)]


def step_id(case):
  lp, cp, all_scores = case
  return f"lp={lp}-cp={cp}-{'all_scores' if all_scores else 'top_scores'}"


class StepData:
  """A random beam state and step (float64)."""

  def __init__(self):
    rng = np.random.default_rng(62)
    self.logits = 2 * rng.normal(size=[BATCH, BEAM, VOCAB])
    self.log_probs = -rng.uniform(0.5, 6, size=[BATCH, BEAM])
    # Finished and running beams in every batch entry.
    self.finished = np.array([[True, False, False, True],
                              [False, True, False, False],
                              [False, False, True, True]])
    self.lengths = rng.integers(1, 8, size=[BATCH, BEAM])
    valid = np.arange(SOURCE) < np.array(SOURCE_LENGTHS)[:, None, None]
    # Sums of attention up to 1.6: min(., 1) clips some.
    self.accumulated = rng.uniform(0.05, 1.6, [BATCH, BEAM, SOURCE]) * valid
    self.attention = ref.softmax(rng.normal(size=[BATCH, BEAM, SOURCE])) * valid
    self.hidden = rng.normal(size=[BATCH, BEAM, UNITS])


@pytest.fixture(scope="module")
def step_data():
  return StepData()


@pytest.fixture(scope="module")
def stepped(step_data):
  """mode -> every step case's (output, next state), from one function."""
  data = step_data

  def run(mode, logits, log_probs, finished, lengths, accumulated, attention,
          hidden):
    del mode
    results = {}
    for case in STEP_CASES:
      lp, cp, all_scores = case
      cell_state = seq2seq.AttentionWrapperState(
          cell_state=[hidden], attention=hidden, alignments=attention,
          attention_state=attention, alignment_history=())
      state = beam_search_decoder.BeamSearchDecoderState(
          cell_state=cell_state, log_probs=log_probs, finished=finished,
          lengths=lengths, accumulated_attention_probs=accumulated)
      results[step_id(case)] = beam_search_decoder._beam_search_step(  # pylint: disable=protected-access
          time=1, logits=logits, next_cell_state=cell_state,
          beam_state=state, batch_size=BATCH, beam_width=BEAM,
          end_token=END_TOKEN, length_penalty_weight=lp,
          coverage_penalty_weight=cp, output_all_scores=all_scores)
    return results

  return once_per_mode(
      run, tf.constant(data.logits), tf.constant(data.log_probs),
      tf.constant(data.finished), tf.constant(data.lengths, tf.int64),
      tf.constant(data.accumulated), tf.constant(data.attention),
      tf.constant(data.hidden))


def assert_scores_close(actual, expected, length_penalty_weight):
  """Scores equal up to the length penalty's precision (Addons computes
  it in float32 whatever the dtype). A finished beam's impossible
  continuations score about the dtype's minimum, or -inf: in a graph the
  penalty's constant (6^alpha) is folded at another precision than the
  tensor it divides, a penalty of 1 becomes 1 - 6e-8, and the minimum
  divided by it overflows (as in Addons)."""
  impossible = expected < np.finfo(np.float64).min / 2
  assert np.all(actual[impossible] < np.finfo(np.float64).min / 2)
  np.testing.assert_allclose(actual[~impossible], expected[~impossible],
                             rtol=1e-6 if length_penalty_weight else 1e-12,
                             atol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", STEP_CASES, ids=step_id)
def test_step_matches_the_definition(case, mode, step_data, stepped):
  lp, cp, all_scores = case
  data = step_data
  output, state = stepped(mode)[step_id(case)]
  expected = ref.beam_search_step(
      data.logits, data.log_probs, data.finished, data.lengths, END_TOKEN,
      length_penalty_weight=lp, coverage_penalty_weight=cp,
      accumulated_attention=data.accumulated, attention_probs=data.attention,
      finished_log_prob=np.finfo(np.float64).min)

  def close(actual, wanted):
    np.testing.assert_allclose(actual, wanted, rtol=1e-12, atol=0)

  assert_scores_close(output.scores,
                      expected["scores" if all_scores else "top_scores"], lp)
  np.testing.assert_array_equal(output.predicted_ids, expected["word_ids"])
  np.testing.assert_array_equal(output.parent_ids, expected["parent_ids"])
  close(state.log_probs, expected["log_probs"])
  np.testing.assert_array_equal(state.finished, expected["finished"])
  np.testing.assert_array_equal(state.lengths, expected["lengths"])
  rows = np.arange(BATCH)[:, None]
  close(state.cell_state.cell_state[0],
        data.hidden[rows, expected["parent_ids"]])
  close(state.cell_state.alignments,
        data.attention[rows, expected["parent_ids"]])
  if cp:
    close(state.accumulated_attention_probs,
          expected["accumulated_attention"])


def test_step_data_exercise_the_scores(step_data):
  """The chosen beams include finished beams' EOS and running beams'
  tokens, EOS among them, and the penalties change the choice."""
  data = step_data
  chosen = {}
  for lp, cp, _ in STEP_CASES:
    step = ref.beam_search_step(
        data.logits, data.log_probs, data.finished, data.lengths, END_TOKEN,
        lp, cp, data.accumulated, data.attention,
        np.finfo(np.float64).min)
    chosen[lp, cp] = (step["parent_ids"], step["word_ids"])
    parent_finished = np.take_along_axis(data.finished, step["parent_ids"], 1)
    assert parent_finished.any() and (~parent_finished).any()
  assert len({(p.tobytes(), w.tobytes()) for p, w in chosen.values()}) > 2
  words = np.concatenate([w for _, w in chosen.values()])
  parents = np.concatenate([p for p, _ in chosen.values()])
  running_eos = (words == END_TOKEN) & ~np.take_along_axis(
      np.tile(data.finished, [len(chosen), 1]), parents, 1)
  assert running_eos.any()


# A whole decode: BeamSearchDecoder over AttentionWrapper(SimpleRNNCell,
# LuongAttention), both penalties, float64.

DECODE_BATCH, DECODE_BEAM, DECODE_VOCAB = 2, 3, 7
EMBEDDING_DEPTH, ATTENTION_DEPTH, MEMORY_DEPTH = 3, 4, 5
DECODE_SOURCE_LENGTHS = [5, 3]
STEPS = 6  # maximum_iterations: beams finish, not all of them.
LENGTH_PENALTY, COVERAGE_PENALTY = 0.7, 0.4


class Search:
  """The decoder with random weights, its data, and the search in NumPy."""

  def __init__(self):
    rng = np.random.default_rng(63)
    f64 = "float64"
    self.memory = rng.normal(size=[DECODE_BATCH, SOURCE, MEMORY_DEPTH])
    self.embedding = rng.normal(size=[DECODE_VOCAB, EMBEDDING_DEPTH])
    self.start_tokens = np.array([1, 4])
    self.mechanism = seq2seq.LuongAttention(UNITS, dtype=f64)
    self.set_up()
    self.rnn_cell = keras.layers.SimpleRNNCell(UNITS, dtype=f64)
    self.cell = seq2seq.AttentionWrapper(
        self.rnn_cell, self.mechanism,
        attention_layer_size=ATTENTION_DEPTH, dtype=f64)
    self.output_layer = keras.layers.Dense(DECODE_VOCAB, dtype=f64)
    self.decoder = seq2seq.BeamSearchDecoder(
        self.cell, DECODE_BEAM, output_layer=self.output_layer,
        length_penalty_weight=LENGTH_PENALTY,
        coverage_penalty_weight=COVERAGE_PENALTY, maximum_iterations=STEPS,
        dtype=f64)
    self.decode()  # Builds the weights,
    ref.randomize(self.cell, rng)
    ref.randomize(self.output_layer, rng)
    # and favours EOS enough for beams to finish at different steps.
    bias = self.output_layer.bias.numpy()
    bias[END_TOKEN] += 1.5
    self.output_layer.bias.assign(bias)
    self.set_up()  # The keys of the new memory layer.

  def set_up(self):
    self.mechanism.setup_memory(
        seq2seq.tile_batch(tf.constant(self.memory), DECODE_BEAM),
        memory_sequence_length=seq2seq.tile_batch(
            tf.constant(DECODE_SOURCE_LENGTHS), DECODE_BEAM))

  def decode(self):
    initial_state = self.cell.get_initial_state(
        batch_size=DECODE_BATCH * DECODE_BEAM, dtype=tf.float64)
    return self.decoder(tf.constant(self.embedding),
                        start_tokens=tf.constant(self.start_tokens, tf.int32),
                        end_token=END_TOKEN, initial_state=initial_state)

  def reference(self):
    """The search in NumPy: the wrapper's step from its definition, the
    scores from GNMT's, back-tracked at the end."""
    kernel, recurrent, bias = (w.numpy() for w in (
        self.rnn_cell.kernel, self.rnn_cell.recurrent_kernel,
        self.rnn_cell.bias))
    attention_kernel, = [v.numpy() for v in self.cell.weights
                         if v.path.endswith("attention_layer/kernel")]
    output_kernel = self.output_layer.kernel.numpy()
    output_bias = self.output_layer.bias.numpy()
    n = DECODE_BATCH * DECODE_BEAM
    # tile_batch repeats each batch entry beam_width times.
    mask = np.repeat(np.arange(SOURCE) < np.array(DECODE_SOURCE_LENGTHS)[
        :, None], DECODE_BEAM, 0)
    values = np.repeat(self.memory, DECODE_BEAM, 0) * mask[..., None]
    keys = values @ self.mechanism.memory_layer.kernel.numpy()
    h, attention = np.zeros([n, UNITS]), np.zeros([n, ATTENTION_DEPTH])
    log_probs = np.where(np.arange(DECODE_BEAM) == 0, 0.0, -np.inf)
    log_probs = np.tile(log_probs, [DECODE_BATCH, 1])
    finished = np.tile(np.arange(DECODE_BEAM) > 0, [DECODE_BATCH, 1])
    lengths = np.zeros([DECODE_BATCH, DECODE_BEAM], np.int64)
    accumulated = np.zeros([DECODE_BATCH, DECODE_BEAM, SOURCE])
    inputs = self.embedding[np.repeat(self.start_tokens, DECODE_BEAM)]
    steps = []
    for _ in range(STEPS):
      h = ref.elman_step(np.concatenate([inputs, attention], 1), h, kernel,
                         recurrent, bias)
      alignments = ref.softmax(ref.masked(ref.luong_score(h, keys), mask))
      context = np.einsum("bt,btd->bd", alignments, values)
      attention = np.concatenate([h, context], 1) @ attention_kernel
      logits = attention @ output_kernel + output_bias

      def split(x):
        return x.reshape([DECODE_BATCH, DECODE_BEAM] + list(x.shape[1:]))

      step = ref.beam_search_step(
          split(logits), log_probs, finished, lengths, END_TOKEN,
          LENGTH_PENALTY, COVERAGE_PENALTY, accumulated, split(alignments),
          finished_log_prob=np.finfo(np.float64).min)
      steps.append(step)
      rows = np.arange(DECODE_BATCH)[:, None]

      def gather(x):
        return split(x)[rows, step["parent_ids"]].reshape(x.shape)

      h, attention = gather(h), gather(attention)
      log_probs, finished = step["log_probs"], step["finished"]
      lengths = step["lengths"]
      accumulated = step["accumulated_attention"]
      inputs = self.embedding[step["word_ids"].reshape(-1)]
      if finished.all():
        break
    stack = lambda key: np.stack([s[key] for s in steps])  # [time, batch, beam]
    predicted = ref.gather_tree(stack("word_ids"), stack("parent_ids"),
                                lengths.max(1), END_TOKEN)
    return {"predicted_ids": predicted, "word_ids": stack("word_ids"),
            "scores": stack("top_scores"),
            "parent_ids": stack("parent_ids"), "log_probs": log_probs,
            "lengths": lengths, "finished": finished}


@pytest.fixture(scope="module")
def search():
  return Search()


@pytest.fixture(scope="module")
def reference_search(search):
  return search.reference()


@pytest.mark.parametrize("mode", MODES)
def test_decode_matches_the_definition(mode, search, reference_search):
  expected = reference_search
  outputs, state, lengths = in_mode(mode, search.decode)()

  def time_major(x):
    return np.swapaxes(np.asarray(x), 0, 1)

  np.testing.assert_array_equal(time_major(outputs.predicted_ids),
                                expected["predicted_ids"])
  step_outputs = outputs.beam_search_decoder_output
  np.testing.assert_array_equal(time_major(step_outputs.parent_ids),
                                expected["parent_ids"])
  assert_scores_close(time_major(step_outputs.scores), expected["scores"],
                      LENGTH_PENALTY)
  np.testing.assert_allclose(state.log_probs, expected["log_probs"],
                             rtol=1e-12)
  np.testing.assert_array_equal(state.finished, expected["finished"])
  np.testing.assert_array_equal(state.lengths, expected["lengths"])
  np.testing.assert_array_equal(lengths, expected["lengths"])


def test_decode_exercises_the_search(reference_search):
  """Beams finish at different steps (EOS handled mid-search), not all of
  them, and the back-tracked beams differ from the steps' own ids."""
  expected = reference_search
  assert expected["finished"].any() and not expected["finished"].all()
  assert len(np.unique(expected["lengths"])) > 2
  assert (expected["predicted_ids"] != expected["word_ids"]).any()
