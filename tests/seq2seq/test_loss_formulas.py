"""`sequence_loss` and `SequenceLoss` against a float64 NumPy reference of
their definition (references.py): the weighted cross-entropy, reduced by
every valid combination of the averaging and summing flags, with
fractional weights and zeros (scattered, a whole sequence, a whole step),
where dividing by the weights' sum, their count or the number of entries
gives different numbers; for ids, distributions and a custom
`softmax_loss_function`; eagerly, in a tf.function and compiled by XLA
(every case in one function per mode).
"""

import numpy as np
import pytest
import tensorflow as tf

from conftest import MODES, once_per_mode, pairwise
import references as ref
from tf_recurrent import seq2seq

BATCH, TIME, CLASSES = 4, 5, 6
FLAG_NAMES = ("average_across_timesteps", "average_across_batch",
              "sum_over_timesteps", "sum_over_batch")
# Every combination of the flags sequence_loss accepts.
FLAGS = [(True, True, False, False), (True, False, False, False),
         (False, True, False, False), (False, False, True, True),
         (False, False, True, False), (False, False, False, True),
         (False, False, False, False)]
TARGETS = ["ids", "distributions", "custom"]
CASES = pairwise(FLAGS, TARGETS)
# SequenceLoss: its defaults (sum over both), another reduction, and no
# sample_weight (ones).
LOSS_CASES = [({}, True), (dict(zip(FLAG_NAMES, FLAGS[0])), True),
              (dict(zip(FLAG_NAMES, FLAGS[4])), False)]


def flags_id(flags):
  short = ("avg_t", "avg_b", "sum_t", "sum_b")
  return "+".join(n for n, f in zip(short, flags) if f) or "no_reduction"


def case_id(case):
  flags, targets = case
  return f"{flags_id(flags)}-{targets}"


def custom_loss(labels, logits):
  """A loss depending on each entry's own label beyond its cross-entropy:
  a wrong pairing of the flattened labels and logits changes it."""
  return (tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                         logits=logits) +
          0.1 * tf.cast(labels, logits.dtype))


class Data:
  """Random logits, ids, distributions and weights (float64)."""

  def __init__(self):
    rng = np.random.default_rng(60)
    self.logits = 2 * rng.normal(size=[BATCH, TIME, CLASSES])
    self.ids = rng.integers(0, CLASSES, size=[BATCH, TIME])
    self.distributions = ref.softmax(rng.normal(size=[BATCH, TIME, CLASSES]))
    weights = rng.uniform(0.1, 1.9, size=[BATCH, TIME])
    weights[1, [0, 3]] = 0  # Scattered zeros,
    weights[2, :] = 0  # a sequence with no weight (0/0 is 0),
    weights[:, 4] = 0  # a step with none.
    self.weights = weights

  def targets(self, kind):
    return self.distributions if kind == "distributions" else self.ids

  def losses(self, kind):
    """The per-entry loss of the definition."""
    losses = ref.cross_entropy(self.logits, self.targets(kind))
    return losses + 0.1 * self.ids if kind == "custom" else losses


@pytest.fixture(scope="module")
def data():
  return Data()


@pytest.fixture(scope="module")
def losses_in(data):
  """mode -> every case's loss, computed in one function of the mode."""

  def run(mode, logits, ids, distributions, weights):
    del mode
    targets = {"ids": ids, "distributions": distributions, "custom": ids}
    results = {}
    for case in CASES:
      flags, kind = case
      results[case_id(case)] = seq2seq.sequence_loss(
          logits, targets[kind], weights,
          softmax_loss_function=custom_loss if kind == "custom" else None,
          **dict(zip(FLAG_NAMES, flags)))
    for i, (kwargs, weighted) in enumerate(LOSS_CASES):
      results[f"SequenceLoss{i}"] = seq2seq.SequenceLoss(**kwargs)(
          ids, logits, sample_weight=weights if weighted else None)
    return results

  return once_per_mode(run, tf.constant(data.logits),
                       tf.constant(data.ids, tf.int32),
                       tf.constant(data.distributions),
                       tf.constant(data.weights))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sequence_loss_matches_the_definition(case, mode, data, losses_in):
  flags, kind = case
  expected = ref.sequence_loss(data.losses(kind), data.weights, *flags)
  np.testing.assert_allclose(losses_in(mode)[case_id(case)], expected,
                             rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index", range(len(LOSS_CASES)),
                         ids=["defaults", "averages", "no_sample_weight"])
def test_sequence_loss_class_matches_the_definition(index, mode, data,
                                                     losses_in):
  kwargs, weighted = LOSS_CASES[index]
  flags = [kwargs.get(name, default) for name, default in
           zip(FLAG_NAMES, (False, False, True, True))]
  weights = data.weights if weighted else np.ones([BATCH, TIME])
  expected = ref.sequence_loss(data.losses("ids"), weights, *flags)
  np.testing.assert_allclose(losses_in(mode)[f"SequenceLoss{index}"],
                             expected, rtol=1e-12, atol=1e-12)


def test_the_weights_tell_the_denominators_apart(data):
  """The weights' sum, their non-zero count and the entries' count differ
  pairwise overall, per sequence and per step (but for the all-zero ones),
  so that no wrong denominator agrees with the right one."""
  weights = data.weights
  for axis in (None, 0, 1):
    denominators = [weights.sum(axis), (weights != 0).sum(axis),
                    np.ones_like(weights).sum(axis)]
    live = denominators[1] > 0
    for i in range(3):
      for j in range(i):
        assert np.all(np.abs(denominators[i] - denominators[j])[live] > 0.05)
