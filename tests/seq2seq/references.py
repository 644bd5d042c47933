"""Float64 NumPy references of `tf_recurrent.seq2seq`'s formulas, written
from their published definitions, not from the package's code:

- Luong et al. 2015 (multiplicative score), Bahdanau et al. 2015 (additive
  score) with Salimans & Kingma 2016's weight normalization;
- Raffel et al. 2017 (monotonic attention's expected alignments);
- Wu et al. 2016, GNMT (the beam search's length and coverage penalties);
- the cross-entropy of `sequence_loss` and its reductions;
- the Elman cell the decoder tests run.

Where a definition leaves a choice, the reference makes TF Addons' (each
place says which): the package must equal Addons. The tests compare the
package, eagerly, in a tf.function and compiled by XLA, with these, on
random weights and inputs.
"""

import numpy as np


def softmax(x, axis=-1):
  z = np.exp(x - x.max(axis=axis, keepdims=True))
  return z / z.sum(axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
  shifted = x - x.max(axis=axis, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def sigmoid(x):
  # The tanh form: no overflow at a masked score (the dtype's minimum).
  return 0.5 * (1 + np.tanh(0.5 * x))


def hardmax(x):
  """One-hot at each row's largest entry."""
  return np.eye(x.shape[-1])[x.argmax(-1)]


# Attention.


def masked(score, mask, dtype=np.float64):
  """Addons' masking of the scores: a masked entry gets the dtype's most
  negative number (not -inf), so that a softmax stays finite."""
  if mask is None:
    return score
  return np.where(mask, score, np.finfo(dtype).min)


def luong_score(query, keys, scale=None):
  """score_j = g * (query . key_j) (Luong's "general" score, the keys the
  projected memory; g the learned scale, or 1)."""
  score = np.einsum("bd,btd->bt", query, keys)
  return score if scale is None else scale * score


def bahdanau_score(processed_query, keys, v, g=None, b=None):
  """score_j = v . tanh(key_j + W q); weight-normalized, v is g v / ||v||_2
  and a bias b is added inside the tanh."""
  if g is None:
    return np.tanh(keys + processed_query[:, None, :]) @ v
  normed_v = g * v / np.sqrt(np.sum(v * v))
  return np.tanh(keys + processed_query[:, None, :] + b) @ normed_v


def monotonic_alignments(p_choose, previous):
  """Raffel et al. 2017, eq. 12 in closed form:
  a_i = p_i * sum_{k <= i} previous_k * prod_{k <= l < i} (1 - p_l),
  the probability of stopping at i, having started at k and passed k..i-1.
  With 0/1 `p_choose` and a one-hot `previous` it is the hard mode's
  one-hot at the first chosen entry at or after the previous one."""
  batch, length = p_choose.shape
  out = np.zeros([batch, length])
  for b in range(batch):
    for i in range(length):
      total = 0.0
      for k in range(i + 1):
        total += previous[b, k] * np.prod(1 - p_choose[b, k:i])
      out[b, i] = p_choose[b, i] * total
  return out


# Beam search.


def length_penalty(lengths, weight):
  """GNMT's lp(Y) = ((5 + |Y|) / (5 + 1)) ** alpha; 1 when alpha is 0."""
  if weight == 0:
    return np.ones(np.shape(lengths))
  return ((5.0 + lengths) / 6.0) ** weight


def coverage_penalty(accumulated, weight):
  """GNMT's cp = beta * sum_j log(min(sum_t p_tj, 1)) over the source
  positions j; Addons sums only the positions with some attention (a zero
  sum is a masked source position, its log left out)."""
  positions = np.where(accumulated == 0, 1.0, np.minimum(accumulated, 1.0))
  return weight * np.log(positions).sum(-1)


def beam_search_step(logits, log_probs, finished, lengths, end_token,
                     length_penalty_weight=0.0, coverage_penalty_weight=0.0,
                     accumulated_attention=None, attention_probs=None,
                     finished_log_prob=np.finfo(np.float32).min):
  """One step of beam search (GNMT's scoring, Addons' bookkeeping).

  Scores: s(Y) = log P(Y) / lp(Y) + cp(X; Y), over every beam's every
  continuation, the `beam_width` best kept per batch entry (ties to the
  lower index). Addons' bookkeeping: a finished beam's only continuation
  is EOS at no cost (its other tokens get `finished_log_prob`, the dtype's
  most negative number), and its length and attention stop growing; the
  length in lp counts the new token unless it is EOS; the coverage
  penalty is added to the beams finished before this step only.

  Args:
    logits: `[batch, beam, vocab]` this step's logits.
    log_probs: `[batch, beam]` the beams' log probabilities so far.
    finished: `[batch, beam]` bools.
    lengths: `[batch, beam]` ints.
    end_token: The EOS id.
    length_penalty_weight: alpha.
    coverage_penalty_weight: beta.
    accumulated_attention: `[batch, beam, source]`, the attention summed
      over the steps before this one (with coverage).
    attention_probs: `[batch, beam, source]`, this step's (with coverage).
    finished_log_prob: What a finished beam's non-EOS tokens get.

  Returns:
    A dict: `scores` (all, `[batch, beam, vocab]`), `top_scores`,
    `word_ids`, `parent_ids`, `log_probs`, `finished`, `lengths` (the next
    beams', `[batch, beam]`) and `accumulated_attention` (the next beams').
  """
  batch, beam_width, vocab = logits.shape
  step_log_probs = log_softmax(logits)
  eos_row = np.full(vocab, finished_log_prob)
  eos_row[end_token] = 0.0
  step_log_probs = np.where(finished[..., None], eos_row, step_log_probs)
  total = log_probs[..., None] + step_log_probs
  not_eos = np.arange(vocab) != end_token
  new_lengths = lengths[..., None] + (~finished)[..., None] * not_eos
  scores = total / length_penalty(new_lengths, length_penalty_weight)
  accumulated = None
  if coverage_penalty_weight != 0:
    accumulated = accumulated_attention + attention_probs * (~finished)[
        ..., None]
    scores = scores + (coverage_penalty(accumulated, coverage_penalty_weight) *
                       finished)[..., None]
  flat = scores.reshape(batch, -1)
  top = np.argsort(-flat, axis=1, kind="stable")[:, :beam_width]
  parents, words = top // vocab, top % vocab
  rows = np.arange(batch)[:, None]
  parent_finished = finished[rows, parents]
  result = {
      "scores": scores,
      "top_scores": flat[rows, top],
      "word_ids": words,
      "parent_ids": parents,
      "log_probs": total.reshape(batch, -1)[rows, top],
      "finished": parent_finished | (words == end_token),
      "lengths": lengths[rows, parents] + ~parent_finished,
  }
  if accumulated is not None:
    result["accumulated_attention"] = accumulated[rows, parents]
  return result


def gather_tree(step_ids, parent_ids, max_sequence_lengths, end_token):
  """Back-tracks `[time, batch, beam]` ids through their parents, from each
  batch entry's last step; end_token after the first end_token and past
  the entry's length (Addons' gather_tree)."""
  max_time, batch, beam_width = step_ids.shape
  beams = np.full_like(step_ids, end_token)
  for b in range(batch):
    length = min(max_time, max_sequence_lengths[b])
    for k in range(beam_width):
      parent = k
      for t in reversed(range(length)):
        beams[t, b, k] = step_ids[t, b, parent]
        parent = parent_ids[t, b, parent]
      ended = False
      for t in range(length):
        if ended:
          beams[t, b, k] = end_token
        ended = ended or beams[t, b, k] == end_token
  return beams


# Loss.


def cross_entropy(logits, targets):
  """-sum_c q_c log softmax(logits)_c per entry: q the one-hot of `targets`
  (ids, `[batch, time]`) or `targets` themselves (distributions,
  `[batch, time, classes]`)."""
  if targets.ndim == logits.ndim - 1:
    targets = np.eye(logits.shape[-1])[targets]
  return -(targets * log_softmax(logits)).sum(-1)


def sequence_loss(losses, weights, average_across_timesteps=True,
                  average_across_batch=True, sum_over_timesteps=False,
                  sum_over_batch=False):
  """The weighted per-entry `[batch, time]` losses w_bt * l_bt, reduced as
  Addons defines: an average divides the weighted sum by the sum of the
  weights, a "sum over" divides it by the count of non-zero weights; 0/0
  is 0."""
  weighted = losses * weights
  nonzero = (weights != 0).astype(np.float64)

  def divide(total, count):
    return np.where(count == 0, 0.0, total / np.where(count == 0, 1, count))

  if average_across_timesteps and average_across_batch:
    return divide(weighted.sum(), weights.sum())
  if sum_over_timesteps and sum_over_batch:
    return divide(weighted.sum(), nonzero.sum())
  if average_across_timesteps or average_across_batch:
    axis = 0 if average_across_batch else 1
    return divide(weighted.sum(axis), weights.sum(axis))
  if sum_over_timesteps or sum_over_batch:
    axis = 0 if sum_over_batch else 1
    return divide(weighted.sum(axis), nonzero.sum(axis))
  return weighted


# The decoders' cell.


def elman_step(x, h, kernel, recurrent_kernel, bias):
  """Keras's SimpleRNNCell: h' = tanh(x W + h U + b), its output h'."""
  return np.tanh(x @ kernel + h @ recurrent_kernel + bias)


# Random weights for the package's layers.


def randomize(layer, rng):
  """Gives each of `layer`'s weights random values: normal for a tensor, a
  scalar of magnitude in [0.4, 1.6] and random sign (a learned scale or
  bias: never 1 or 0, where a missing or doubled scale hides)."""
  for variable in layer.weights:
    shape = tuple(variable.shape)
    if not shape:
      value = rng.choice([-1.0, 1.0]) * rng.uniform(0.4, 1.6)
    else:
      value = rng.normal(size=shape) * 0.8
    variable.assign(np.asarray(value, np.asarray(variable).dtype))
