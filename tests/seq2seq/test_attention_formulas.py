"""The attention mechanisms' and `AttentionWrapper`'s numbers against float64
NumPy references written from the papers (references.py): Luong's score
(`scale`), Bahdanau's (`normalize`: weight normalization), the monotonic
alignments of Raffel et al. 2017 in their three modes, the softmax and
hardmax probability functions, and the memory's masks (lengths, and a
Keras mask with holes), with random weights and inputs, eagerly, in a
tf.function and compiled by XLA.

Every case's mechanism is set up and queried inside one function per mode
(traced and compiled once for the module).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import MODES, once_per_mode, pairwise
import references as ref
from tf_recurrent import seq2seq

BATCH, MEMORY_STEPS, MEMORY_DEPTH = 3, 6, 5
UNITS = 4  # The keys' depth: a Luong query's, and the wrappers' cells'.
BAHDANAU_QUERY_DEPTH = 3
MEMORY_LENGTHS = [6, 4, 2]
# Holes, a masked first entry: a mask no lengths give.
MEMORY_MASK = np.array([[1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 0],
                        [1, 1, 0, 0, 0, 1]], bool)
MASKINGS = ["none", "lengths", "mask"]

# kind -> (class, its option's name, its probability functions or modes).
KINDS = {
    "luong": (seq2seq.LuongAttention, "scale", ["softmax", "hardmax"]),
    "bahdanau": (seq2seq.BahdanauAttention, "normalize",
                 ["softmax", "hardmax"]),
    "luong_monotonic": (seq2seq.LuongMonotonicAttention, "scale",
                        ["parallel", "recursive", "hard"]),
    "bahdanau_monotonic": (seq2seq.BahdanauMonotonicAttention, "normalize",
                           ["parallel", "recursive", "hard"]),
}
CASES = [(kind, option, fn, masking)
         for kind, (_, _, fns) in KINDS.items()
         for option, fn, masking in pairwise([False, True], fns, MASKINGS)]


def case_id(case):
  kind, option, fn, masking = case
  return f"{kind}-{KINDS[kind][1]}={option}-{fn}-{masking}"


def monotonic(kind):
  return kind.endswith("monotonic")


def make_mechanism(kind, option, fn, units=UNITS):
  cls, option_name, _ = KINDS[kind]
  kwargs = {option_name: option,
            ("mode" if monotonic(kind) else "probability_fn"): fn}
  return cls(units, dtype="float64", **kwargs)


def set_up(mechanism, masking, memory):
  mechanism.setup_memory(
      memory,
      memory_sequence_length=MEMORY_LENGTHS if masking == "lengths" else None,
      memory_mask=MEMORY_MASK if masking == "mask" else None)


def memory_mask(masking):
  if masking == "lengths":
    return np.arange(MEMORY_STEPS) < np.array(MEMORY_LENGTHS)[:, None]
  return MEMORY_MASK if masking == "mask" else None


def values_of(memory, masking):
  """The memory a mechanism attends over: its masked rows zeroed."""
  mask = memory_mask(masking)
  return memory if mask is None else memory * mask[..., None]


def reference_score(case, mechanism, memory, query):
  """The masked score from the definitions, `mechanism` giving its weights
  (with the monotonic mechanisms' score bias)."""
  kind, option, _, masking = case
  keys = values_of(memory, masking) @ mechanism.memory_layer.kernel.numpy()
  if kind.startswith("luong"):
    # The scale is LuongAttention's scale_weight, LuongMonotonic's g.
    scale = (mechanism.attention_g if kind == "luong_monotonic"
             else mechanism.scale_weight)
    score = ref.luong_score(query, keys,
                            float(scale.numpy()) if option else None)
  else:
    g = b = None
    if option:
      g, b = float(mechanism.attention_g.numpy()), mechanism.attention_b.numpy()
    score = ref.bahdanau_score(query @ mechanism.query_layer.kernel.numpy(),
                               keys, mechanism.attention_v.numpy(), g, b)
  if monotonic(kind):
    score = score + float(mechanism.attention_score_bias.numpy())
  return ref.masked(score, memory_mask(masking))


def reference_alignments(case, mechanism, memory, query, previous):
  fn = case[2]
  score = reference_score(case, mechanism, memory, query)
  if fn == "softmax":
    return ref.softmax(score)
  if fn == "hardmax":
    return ref.hardmax(score)
  p_choose = (score > 0).astype(float) if fn == "hard" else ref.sigmoid(score)
  return ref.monotonic_alignments(p_choose, previous)


class Data:
  """Random memory, queries and previous alignments (float64).

  Their scale keeps the scores within a few units: the parallel mode is
  exact only while the products of (1 - p) stay above its clip (1e-10),
  and a softmax of large scores is nearly one-hot."""

  def __init__(self, rng):
    self.memory = 0.5 * rng.normal(size=[BATCH, MEMORY_STEPS, MEMORY_DEPTH])
    self.queries = {"luong": 0.5 * rng.normal(size=[BATCH, UNITS]),
                    "bahdanau": rng.normal(size=[BATCH,
                                                 BAHDANAU_QUERY_DEPTH])}
    self.soft_previous = ref.softmax(rng.normal(size=[BATCH, MEMORY_STEPS]))
    # The hard mode's previous alignments are one-hot.
    self.hard_previous = np.eye(MEMORY_STEPS)[[0, 3, 1]]

  def query(self, kind):
    return self.queries["luong" if kind.startswith("luong") else "bahdanau"]

  def previous(self, fn):
    return self.hard_previous if fn == "hard" else self.soft_previous


@pytest.fixture(scope="module")
def mechanisms():
  """Each case's mechanism, built, with random weights, and the data."""
  rng = np.random.default_rng(58)
  data = Data(rng)
  built = {}
  for case in CASES:
    kind, option, fn, masking = case
    mechanism = make_mechanism(kind, option, fn)
    set_up(mechanism, masking, data.memory)
    mechanism([data.query(kind), data.previous(fn)])  # Builds the weights.
    ref.randomize(mechanism, rng)
    built[case_id(case)] = (case, mechanism)
  return data, built


@pytest.fixture(scope="module")
def query_all(mechanisms):
  """mode -> every case's (alignments, values), set up and queried inside
  one function of the mode."""
  data, built = mechanisms

  def run(mode, memory, luong_query, bahdanau_query, soft_previous,
          hard_previous):
    del mode
    queries = {"luong": luong_query, "bahdanau": bahdanau_query}
    results = {}
    for name, ((kind, _, fn, masking), mechanism) in built.items():
      set_up(mechanism, masking, memory)
      query = queries["luong" if kind.startswith("luong") else "bahdanau"]
      previous = hard_previous if fn == "hard" else soft_previous
      alignments, next_state = mechanism([query, previous])
      results[name] = (alignments, next_state, mechanism.values)
    return results

  return once_per_mode(
      run, tf.constant(data.memory), tf.constant(data.queries["luong"]),
      tf.constant(data.queries["bahdanau"]), tf.constant(data.soft_previous),
      tf.constant(data.hard_previous))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_alignments_match_the_definition(case, mode, mechanisms, query_all):
  data, built = mechanisms
  _, mechanism = built[case_id(case)]
  kind, _, fn, masking = case
  alignments, next_state, values = query_all(mode)[case_id(case)]
  expected = reference_alignments(case, mechanism, data.memory,
                                  data.query(kind), data.previous(fn))
  np.testing.assert_allclose(alignments, expected, rtol=1e-9, atol=1e-12)
  # A mechanism's state is its alignments.
  np.testing.assert_array_equal(next_state, alignments)
  np.testing.assert_array_equal(values, values_of(data.memory, masking))


def test_cases_exercise_the_formulas(mechanisms):
  """The random data reach each formula's every branch: soft alignments
  are not one-hot (where a wrong normalization could still agree), and
  the hard mode's rows include one that stays at its previous entry, one
  that moves on, one that stops nowhere, and a choice before the previous
  entry (which the mode must ignore)."""
  data, built = mechanisms
  starts = data.hard_previous.argmax(1)
  stays = moves = nowhere = earlier = False
  for case, mechanism in built.values():
    kind, _, fn, _ = case
    expected = reference_alignments(case, mechanism, data.memory,
                                    data.query(kind), data.previous(fn))
    if fn not in ("hardmax", "hard"):
      assert expected.max() < 0.99 and (expected > 1e-3).sum() > BATCH, case
    if fn == "hard":
      chosen = reference_score(case, mechanism, data.memory,
                               data.query(kind)) > 0
      stopped = expected.sum(1) == 1
      stays |= (stopped & (expected.argmax(1) == starts)).any()
      moves |= (stopped & (expected.argmax(1) > starts)).any()
      nowhere |= (~stopped).any()
      earlier |= (chosen & (np.arange(MEMORY_STEPS) < starts[:, None])).any()
  assert stays and moves and nowhere and earlier


# AttentionWrapper: one step against the definition (the cell reads its
# input and the previous attention; each mechanism aligns the cell's output
# with its memory; the attention is the context, or the attention layer on
# [cell output, context]; several mechanisms' attentions are concatenated).

WRAPPERS = {
    # name: ([(kind, option, fn, masking, units)], attention layers' sizes,
    #        given as layers (attention_layer) or by attention_layer_size,
    #        output_attention)
    "luong_layer_size": ([("luong", True, "softmax", "lengths", UNITS)], [3],
                         False, True),
    "two_mechanisms_layers": ([("bahdanau", True, "softmax", "mask", 5),
                               ("luong_monotonic", False, "recursive",
                                "lengths", UNITS)], [3, 2], True, False),
    "context_only": ([("bahdanau_monotonic", True, "parallel", "none", 5)],
                     None, False, True),
}
INPUT_DEPTH = 2


class Wrapper:
  """A wrapper of a random case, its parts, random input and state."""

  def __init__(self, name, memory, rng):
    specs, sizes, as_layers, self.output_attention = WRAPPERS[name]
    self.cases = [spec[:4] for spec in specs]
    self.mechanisms = []
    for kind, option, fn, masking, units in specs:
      mechanism = make_mechanism(kind, option, fn, units)
      set_up(mechanism, masking, memory)
      self.mechanisms.append(mechanism)
    self.cell = keras.layers.SimpleRNNCell(UNITS, dtype="float64")
    layers = None
    if as_layers:
      layers = [keras.layers.Dense(size, use_bias=False, dtype="float64")
                for size in sizes]
    multi = len(specs) > 1
    self.wrapper = seq2seq.AttentionWrapper(
        self.cell, self.mechanisms if multi else self.mechanisms[0],
        attention_layer_size=(None if as_layers or sizes is None else
                              sizes if multi else sizes[0]),
        attention_layer=layers, output_attention=self.output_attention,
        dtype="float64")
    previous = tuple(ref.softmax(rng.normal(size=[BATCH, MEMORY_STEPS]))
                     for _ in specs)
    depth = MEMORY_DEPTH * len(specs) if sizes is None else sum(sizes)
    self.state = seq2seq.AttentionWrapperState(
        cell_state=[rng.normal(size=[BATCH, UNITS])],
        attention=rng.normal(size=[BATCH, depth]),
        alignments=previous if multi else previous[0],
        attention_state=previous if multi else previous[0],
        alignment_history=((),) * len(specs) if multi else ())
    self.x = rng.normal(size=[BATCH, INPUT_DEPTH])
    self.step(memory)  # Builds the weights.
    ref.randomize(self.wrapper, rng)
    # The attention layers' kernels, in the mechanisms' order.
    self.attention_kernels = None
    if as_layers:
      self.attention_kernels = [layer.kernel.numpy() for layer in layers]
    elif sizes is not None:
      self.attention_kernels = [
          v.numpy() for v in self.wrapper.weights
          if v.path.endswith("attention_layer/kernel")]
      assert len(self.attention_kernels) == len(specs)

  def step(self, memory):
    for mechanism, case in zip(self.mechanisms, self.cases):
      set_up(mechanism, case[3], memory)
    return self.wrapper(tf.constant(self.x),
                        tf.nest.map_structure(tf.constant, self.state))

  def reference(self, memory):
    """One step from the definition: `(output, h, attention, alignments)`."""
    cell, state = self.cell, self.state
    h = ref.elman_step(np.concatenate([self.x, state.attention], 1),
                       state.cell_state[0], cell.kernel.numpy(),
                       cell.recurrent_kernel.numpy(), cell.bias.numpy())
    previous = (state.attention_state if len(self.cases) > 1
                else (state.attention_state,))
    attentions, alignments = [], []
    for i, (mechanism, case) in enumerate(zip(self.mechanisms, self.cases)):
      a = reference_alignments(case, mechanism, memory, h, previous[i])
      context = np.einsum("bt,btd->bd", a, values_of(memory, case[3]))
      if self.attention_kernels is not None:
        context = np.concatenate([h, context], 1) @ self.attention_kernels[i]
      attentions.append(context)
      alignments.append(a)
    attention = np.concatenate(attentions, 1)
    return (attention if self.output_attention else h, h, attention,
            alignments)


@pytest.fixture(scope="module")
def wrappers():
  """The memory, and name -> Wrapper."""
  rng = np.random.default_rng(59)
  memory = rng.normal(size=[BATCH, MEMORY_STEPS, MEMORY_DEPTH])
  return memory, {name: Wrapper(name, memory, rng) for name in WRAPPERS}


@pytest.fixture(scope="module")
def step_all(wrappers):
  memory, built = wrappers

  def run(mode, memory_tensor):
    del mode
    return {name: wrapper.step(memory_tensor)
            for name, wrapper in built.items()}

  return once_per_mode(run, tf.constant(memory))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(WRAPPERS))
def test_attention_wrapper_step_matches_the_definition(name, mode, wrappers,
                                                        step_all):
  memory, built = wrappers
  output, next_state = step_all(mode)[name]
  expected_output, h, attention, alignments = built[name].reference(memory)

  def close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-9,
                               atol=1e-12)

  close(output, expected_output)
  close(next_state.cell_state[0], h)
  close(next_state.attention, attention)
  got = (next_state.alignments if len(alignments) > 1
         else (next_state.alignments,))
  for actual, expected in zip(got, alignments):
    close(actual, expected)
