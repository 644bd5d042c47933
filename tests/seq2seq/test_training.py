"""Teacher-forced training of an AttentionWrapper on the op, and bad input.

A BahdanauAttention AttentionWrapper(LSTMCell) decoder in
`tf_recurrent.RNN` (the engine's generic path: the wrapper's call on
`tf_recurrent.recurrent`, each step recomputed in the backward pass) against
a static Python unroll of the same wrapper differentiated by
tf.GradientTape, float64, in every mode; the same cell in
`keras.layers.RNN`; and the errors naming the argument at fault.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import MODES, assert_all_close, pairwise, values_and_grads
import tf_recurrent
from tf_recurrent import seq2seq

BATCH, DECODER_STEPS, INPUT_DEPTH = 3, 4, 3
MEMORY_STEPS, MEMORY_DEPTH = 5, 4
MEMORY_LENGTHS = [5, 3, 2]


class Decoder:
  """The shared model: its mechanism, wrapper, layer and fixed data."""

  def __init__(self):
    rng = np.random.default_rng(7)
    f64 = tf.float64
    self.memory = tf.constant(
        rng.normal(size=[BATCH, MEMORY_STEPS, MEMORY_DEPTH]), f64)
    self.x = tf.constant(rng.normal(size=[BATCH, DECODER_STEPS, INPUT_DEPTH]),
                         f64)
    self.weights = tf.constant(rng.normal(size=[BATCH, DECODER_STEPS, 5]), f64)
    self.mechanism = seq2seq.BahdanauAttention(
        6, memory=self.memory, memory_sequence_length=MEMORY_LENGTHS,
        normalize=True, dtype="float64")
    self.cell = seq2seq.AttentionWrapper(
        keras.layers.LSTMCell(7, dtype="float64"), self.mechanism,
        attention_layer_size=5, dtype="float64")
    self.layer = tf_recurrent.RNN(self.cell, return_sequences=True,
                                  dtype="float64")
    self.layer(self.x)  # Builds every weight, outside any trace.
    self.variables = self.layer.trainable_variables

  def setup(self, memory):
    self.mechanism.setup_memory(memory, memory_sequence_length=MEMORY_LENGTHS)

  def loss(self, outputs):
    return tf.reduce_sum(outputs * self.weights)

  def on_the_op(self, watch):
    memory, x = tf.identity(self.memory), tf.identity(self.x)
    watch([memory, x])
    self.setup(memory)
    outputs = self.layer(x)
    return outputs, self.loss(outputs), self.variables + [memory, x]

  def unrolled(self, watch):
    memory, x = tf.identity(self.memory), tf.identity(self.x)
    watch([memory, x])
    self.setup(memory)
    state = self.cell.get_initial_state(batch_size=BATCH, dtype=tf.float64)
    outputs = []
    for t in range(DECODER_STEPS):
      output, state = self.cell(x[:, t], state)
      outputs.append(output)
    outputs = tf.stack(outputs, 1)
    return outputs, self.loss(outputs), self.variables + [memory, x]


@pytest.fixture(scope="module")
def decoder():
  return Decoder()


@pytest.fixture(scope="module")
def reference(decoder):
  return values_and_grads("eager", decoder.unrolled)


@pytest.mark.parametrize("mode", MODES)
def test_rnn_matches_unrolled_wrapper(decoder, reference, mode):
  got = values_and_grads(mode, decoder.on_the_op)
  assert len(got[1]) == len(decoder.variables) + 2
  # The memory (an encoder's output) and every weight get gradients.
  assert all(float(tf.reduce_max(tf.abs(g))) > 0 for g in got[1])
  assert_all_close(got, reference, tol=1e-10)


def test_runs_on_the_op_recomputing_steps(decoder, monkeypatch):
  # The engine's generic path: the op, whose default gradient keeps only
  # the state per step and recomputes each step (the attention included).
  from tf_recurrent.engine import generic  # pylint: disable=g-import-not-at-top
  from tf_recurrent.op import op  # pylint: disable=g-import-not-at-top
  calls = []
  recurrent = op.recurrent

  def recording(*args, **kwargs):
    calls.append(kwargs)
    return recurrent(*args, **kwargs)

  monkeypatch.setattr(op, "recurrent", recording)
  decoder.setup(decoder.memory)
  decoder.layer(decoder.x)
  assert len(calls) == 1
  assert generic.op.recurrent is recording
  assert "cell_grad" not in calls[0]  # The default: recompute each step.


def test_keras_rnn_and_masks(decoder):
  # The same cell in Keras's own RNN computes the same; a Keras mask on
  # the decoder's inputs carries the state through masked steps in both.
  decoder.setup(decoder.memory)
  keras_layer = keras.layers.RNN(decoder.cell, return_sequences=True,
                                 return_state=True, dtype="float64")
  ours = tf_recurrent.RNN(decoder.cell, return_sequences=True,
                          return_state=True, dtype="float64")
  mask = tf.sequence_mask([4, 2, 1], DECODER_STEPS)
  want = keras_layer(decoder.x, mask=mask)
  got = ours(decoder.x, mask=mask)
  assert len(got) == 1 + len(tf.nest.flatten(decoder.cell.state_size))
  assert_all_close(got, want, tol=1e-10)
  initial = decoder.cell.get_initial_state(batch_size=BATCH)
  assert isinstance(initial, seq2seq.AttentionWrapperState)
  assert_all_close(ours(decoder.x, initial_state=initial)[0],
                   decoder.layer(decoder.x), tol=1e-10)


def test_greedy_inference_decodes(decoder):
  # Inference: dynamic_decode's tf.while_loop feeding back argmax ids.
  decoder.setup(decoder.memory)
  vocab = 5  # The attention layer's size: its outputs are the logits.
  embeddings = tf.constant(np.eye(vocab, INPUT_DEPTH), tf.float64)
  basic = seq2seq.BasicDecoder(decoder.cell, seq2seq.GreedyEmbeddingSampler(),
                               maximum_iterations=6)
  outputs, state, lengths = basic(
      embeddings, initial_state=decoder.cell.get_initial_state(
          batch_size=BATCH, dtype=tf.float64),
      start_tokens=[0] * BATCH, end_token=vocab + 1)
  assert outputs.rnn_output.shape == (BATCH, 6, vocab)
  np.testing.assert_array_equal(outputs.sample_id,
                                np.argmax(outputs.rnn_output, -1))
  np.testing.assert_array_equal(lengths, [6] * BATCH)
  assert isinstance(state, seq2seq.AttentionWrapperState)


class LoopOnly(seq2seq.BasicDecoder):
  """BasicDecoder that always runs dynamic_decode's tf.while_loop: the
  reference for its teacher-forced run on the op."""

  def decode_teacher_forced(self, *args, **kwargs):
    return None


@pytest.mark.parametrize(
    "mode,impute,output_time_major,sampler_time_major,lengths,maximum",
    pairwise(MODES, [False, True], [False, True], [False, True],
             [None, (4, 2, 1), (0, 3, 2)], [None, 3, 6],
             # XLA needs maximum_iterations (the loop's own error).
             where=lambda mode, *rest: mode != "xla" or rest[-1] is not None))
def test_training_sampler_decodes_on_the_op_as_the_loop(
    decoder, monkeypatch, mode, impute, output_time_major, sampler_time_major,
    lengths, maximum):
  """BasicDecoder with a TrainingSampler (the NMT tutorial's training)
  runs its cell over the sequence on the op, whose gradient keeps the
  state per step: outputs, sample ids, final state, lengths and gradients
  are dynamic_decode's loop's."""
  from tf_recurrent.op import op  # pylint: disable=g-import-not-at-top
  project = keras.layers.Dense(5, dtype="float64")
  project.build((None, 5))
  calls = []
  recurrent = op.recurrent
  monkeypatch.setattr(op, "recurrent",
                      lambda *a, **k: calls.append(1) or recurrent(*a, **k))
  results = []
  # The reference, dynamic_decode's tf.while_loop, runs eagerly (tracing it
  # too cost as much as the op's run; compiling it, twice that). Under XLA
  # the op's outputs have maximum_iterations steps, as the loop's fixed-size
  # arrays have there: the eager loop's outputs get the compiled loop's
  # zeros past its last step (the loop under XLA: test_decoder_formulas).
  for kind, kind_mode in ((seq2seq.BasicDecoder, mode), (LoopOnly, "eager")):
    basic = kind(decoder.cell,
                 seq2seq.TrainingSampler(time_major=sampler_time_major),
                 output_layer=project, impute_finished=impute,
                 output_time_major=output_time_major,
                 maximum_iterations=maximum)

    def build(watch, basic=basic):
      memory, x = tf.identity(decoder.memory), tf.identity(decoder.x)
      watch([memory, x])
      decoder.setup(memory)
      inputs = tf.transpose(x, [1, 0, 2]) if sampler_time_major else x
      outputs, state, final_lengths = basic(
          inputs, initial_state=decoder.cell.get_initial_state(
              batch_size=BATCH, dtype=tf.float64),
          sequence_length=lengths)
      loss = tf.add_n([tf.reduce_sum(tf.sin(t)) for t in
                       [outputs.rnn_output] + tf.nest.flatten(state)])
      return ((outputs, state, final_lengths), loss,
              decoder.variables + project.trainable_variables + [memory, x])

    results.append(values_and_grads(kind_mode, build))
  if mode == "xla":
    values, grads = results[1]
    time_axis = 0 if output_time_major else 1
    for i in range(2):  # rnn_output and sample_id.
      pad = [[0, 0]] * values[i].shape.rank
      pad[time_axis] = [0, maximum - values[i].shape[time_axis]]
      values[i] = tf.pad(values[i], pad)
    results[1] = (values, grads)
  assert calls, "the teacher-forced decode did not run on the op"
  assert_all_close(results[0], results[1], tol=1e-10)


class NoisyWrapper:
  """A monotonic mechanism with sigmoid_noise in an AttentionWrapper on the
  op, built once for every mode, with its twin without noise (the same
  weights) and a static unroll drawing the noise as the op hands it out."""

  def __init__(self):
    self.base_seed = [7, 8]
    self.memory = tf.random.stateless_normal([2, 5, 4], seed=[1, 2],
                                             dtype=tf.float64)
    self.x = tf.random.stateless_normal([2, 3, 3], seed=[3, 4],
                                        dtype=tf.float64)
    self.mechanism, self.cell = self.wrapper(1.0)
    self.layer = tf_recurrent.RNN(self.cell, return_sequences=True,
                                  dtype="float64")
    quiet_mechanism, quiet_cell = self.wrapper(0.0)
    quiet = tf_recurrent.RNN(quiet_cell, return_sequences=True,
                             dtype="float64")
    self.layer(self.x), quiet(self.x)
    quiet.set_weights(self.layer.get_weights())
    # The keys anew, from the memory layer's new weights (the construction's
    # are the initial weights' keys: without this the outputs differed
    # without any noise).
    quiet_mechanism.setup_memory(self.memory)
    self.quiet_outputs = quiet(self.x)
    self.unrolled_results = {}

  def wrapper(self, noise):
    mechanism = seq2seq.BahdanauMonotonicAttention(
        6, memory=self.memory, sigmoid_noise=noise, sigmoid_noise_seed=5,
        dtype="float64")
    return mechanism, seq2seq.AttentionWrapper(
        keras.layers.LSTMCell(7, dtype="float64"), mechanism,
        attention_layer_size=5, dtype="float64")

  def on_the_op(self, watch):
    del watch
    self.mechanism.setup_memory(self.memory)  # In the step, as an encoder's.
    outputs = self.layer(self.x)
    return (outputs, tf.reduce_sum(tf.sin(outputs)),
            self.layer.trainable_variables)

  def unrolled(self, watch):
    # Step t's first seed, as the op hands it out (op/seeds.py).
    from tf_recurrent.op import seeds  # pylint: disable=g-import-not-at-top
    del watch
    self.mechanism.setup_memory(self.memory)
    state = self.cell.get_initial_state(batch_size=2, dtype=tf.float64)
    outputs = []
    for t in range(3):
      step = tf.random.experimental.stateless_fold_in(self.base_seed, t)
      with pytest.MonkeyPatch.context() as patch:
        patch.setattr(seeds, "in_step", lambda: True)
        patch.setattr(seeds, "step_seed", lambda step=step: (
            tf.random.experimental.stateless_fold_in(step, 0)))
        output, state = self.cell(self.x[:, t], state)
      outputs.append(output)
    outputs = tf.stack(outputs, 1)
    return (outputs, tf.reduce_sum(tf.sin(outputs)),
            self.layer.trainable_variables)

  def unrolled_in(self, mode):
    if mode not in self.unrolled_results:
      self.unrolled_results[mode] = values_and_grads(mode, self.unrolled)
    return self.unrolled_results[mode]


@pytest.fixture(scope="module")
def noisy_wrapper():
  return NoisyWrapper()


@pytest.mark.parametrize("mode", MODES)
def test_sigmoid_noise_on_the_op(noisy_wrapper, mode, monkeypatch):
  """A monotonic mechanism's sigmoid_noise is a stateful draw, which the
  op refused ("cell_fn uses stateful random ops"); on the op it is drawn
  from the step's seed, so each recomputed step sees the noise its forward
  pass saw: values and gradients are a static unroll's drawing the same
  noise (the op's base seed fixed), and the noise changes the outputs."""
  from tf_recurrent.op import op  # pylint: disable=g-import-not-at-top
  recurrent = op.recurrent
  monkeypatch.setattr(op, "recurrent", lambda *args, **kwargs: recurrent(
      *args, **dict(kwargs, seed=noisy_wrapper.base_seed)))
  got = values_and_grads(mode, noisy_wrapper.on_the_op)
  # XLA's stateless normal draws other numbers than TensorFlow's kernel:
  # the unroll is compiled too.
  want = noisy_wrapper.unrolled_in("xla" if mode == "xla" else "eager")
  assert_all_close(got, want, tol=1e-10)
  assert float(tf.reduce_max(tf.abs(got[0][0] - noisy_wrapper.quiet_outputs))
               ) > 1e-3


def teacher_forced_model(x_dtype=tf.float32):
  """A small float32 (or policy) teacher-forced decoder: a Luong mechanism
  over a memory set up in the step, AttentionWrapper(LSTMCell) and a
  projection in a BasicDecoder with a TrainingSampler, and its loss."""
  keras.utils.set_random_seed(5)
  memory = tf.random.stateless_normal([4, 6, 5], seed=[1, 2])
  x = tf.cast(tf.random.stateless_normal([4, 5, 3], seed=[3, 4]), x_dtype)
  mechanism = seq2seq.LuongAttention(5, scale=True)
  cell = seq2seq.AttentionWrapper(keras.layers.LSTMCell(5), mechanism,
                                  attention_layer_size=4)
  project = keras.layers.Dense(7)

  def loss(decoder_class=seq2seq.BasicDecoder):
    mechanism.setup_memory(memory, memory_sequence_length=[6, 4, 2, 5])
    basic = decoder_class(cell, seq2seq.TrainingSampler(), output_layer=project)
    outputs, _, _ = basic(x, initial_state=cell.get_initial_state(
        batch_size=4, dtype=x_dtype), sequence_length=[5, 3, 4, 1])
    logits = tf.cast(outputs.rnn_output, tf.float32)
    return tf.reduce_sum(logits * logits)

  return loss, lambda: cell.trainable_variables + project.trainable_variables


def test_teacher_forced_decoder_in_mirrored_strategy():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
  strategy = tf.distribute.MirroredStrategy(devices)
  with strategy.scope():
    loss, variables = teacher_forced_model()
    loss()  # Builds every weight as a mirrored variable.

  def step():
    with tf.GradientTape() as tape:
      value = loss()
    return tape.gradient(value, variables())

  results = strategy.experimental_local_results(
      strategy.run(tf.function(step, autograph=False)))
  want = step()
  assert len(results) == len(devices)
  for grads in results:
    assert_all_close(grads, want, tol=1e-5)


@pytest.mark.parametrize("policy,tol", [("mixed_float16", 1e-2),
                                        ("mixed_bfloat16", 3e-2)])
def test_teacher_forced_decoder_under_mixed_precision(policy, tol):
  """Float32 weights, the policy's compute dtype in the loop: the op's
  teacher-forced decode and gradients equal dynamic_decode's loop's, to
  the compute dtype's precision (relative norms: sums of 8-bit mantissas
  differ by their order)."""
  keras.mixed_precision.set_global_policy(policy)
  try:
    loss, variables = teacher_forced_model(
        keras.mixed_precision.global_policy().compute_dtype)
    loss()
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert {v.dtype for v in variables()} == {"float32"}
  got, want = [], []
  for decoder_class, results in ((seq2seq.BasicDecoder, got),
                                 (LoopOnly, want)):
    with tf.GradientTape() as tape:
      value = loss(decoder_class)
    results += [value] + tape.gradient(value, variables())
  assert all(g.dtype == tf.float32 for g in got[1:])
  # The loss, then all gradients as one vector (a scalar weight's gradient,
  # a sum that nearly cancels, has no precision of its own to compare).
  flat = [np.concatenate([np.ravel(t) for t in ts[1:]]) for ts in (got, want)]
  for g, w in ((got[0], want[0]), flat):
    assert np.linalg.norm(g - w) <= tol * np.linalg.norm(w)


# Bad input: a clear error naming the argument.


def test_memory_without_batch_dimension():
  with pytest.raises(ValueError, match=r"memory must be a \[batch_size"):
    seq2seq.BahdanauAttention(4, memory=tf.ones([5, 3]))


def test_mismatched_memory_sequence_length():
  with pytest.raises(ValueError, match="memory_sequence_length has 3 entries"):
    seq2seq.LuongAttention(3, memory=tf.ones([2, 5, 3]),
                           memory_sequence_length=[5, 5, 5])
  with pytest.raises(ValueError, match="memory_sequence_length must be"):
    seq2seq.LuongAttention(3, memory=tf.ones([2, 5, 3]),
                           memory_sequence_length=[[5, 5]])


def test_attention_depth_mismatch():
  mechanism = seq2seq.LuongAttention(4, memory=tf.ones([2, 5, 3]))
  cell = seq2seq.AttentionWrapper(keras.layers.LSTMCell(3), mechanism)
  with pytest.raises(ValueError, match="keys of depth 4 .* has depth 3"):
    tf_recurrent.RNN(cell)(tf.ones([2, 4, 2]))
  bahdanau = seq2seq.BahdanauAttention(
      4, memory=tf.ones([2, 5, 3]), query_layer=keras.layers.Dense(2))
  with pytest.raises(ValueError, match="query_layer and the memory_layer"):
    bahdanau([tf.ones([2, 3]), None])


def test_batch_mismatch_with_memory():
  mechanism = seq2seq.LuongAttention(3, memory=tf.ones([2, 5, 3]))
  cell = seq2seq.AttentionWrapper(keras.layers.LSTMCell(3), mechanism)
  with pytest.raises(ValueError, match="Non-matching batch sizes"):
    cell.get_initial_state(batch_size=4, dtype=tf.float32)


@pytest.mark.parametrize("layer", [tf_recurrent.RNN, keras.layers.RNN])
def test_alignment_history_in_a_recurrent_layer(layer):
  mechanism = seq2seq.LuongAttention(3, memory=tf.ones([2, 5, 3]))
  cell = seq2seq.AttentionWrapper(keras.layers.LSTMCell(3), mechanism,
                                  alignment_history=True)
  with pytest.raises(ValueError, match="alignment_history=True keeps a "
                     "TensorArray"):
    layer(cell)(tf.ones([2, 4, 2]))


def test_several_mechanisms_and_options():
  # Two mechanisms, the cell's output as the output, a custom cell input
  # and initial cell state: tf_recurrent.RNN computes what Keras's RNN
  # does, and dynamic_decode keeps both alignment histories.
  memory = tf.random.stateless_normal([2, 5, 3], seed=[1, 2])
  mechanisms = [seq2seq.LuongAttention(4, memory, memory_sequence_length=[5, 2]),
                seq2seq.BahdanauMonotonicAttention(3, memory)]
  initial_cell_state = [tf.ones([2, 4]), tf.zeros([2, 4])]

  def wrap(**kwargs):
    return seq2seq.AttentionWrapper(
        keras.layers.LSTMCell(4), mechanisms, attention_layer_size=[2, 3],
        cell_input_fn=lambda inputs, attention: inputs * 2.0,
        initial_cell_state=initial_cell_state, **kwargs)

  cell = wrap(output_attention=False)
  assert cell.output_size == 4
  assert cell.state_size.alignments == (5, 5)
  x = tf.random.stateless_normal([2, 6, 4], seed=[3, 4])
  want = keras.layers.RNN(cell, return_sequences=True)(x)
  got = tf_recurrent.RNN(cell, return_sequences=True)(x)
  assert got.shape == (2, 6, 4)
  assert_all_close(got, want, tol=1e-6)

  cell = wrap(alignment_history=True)
  basic = seq2seq.BasicDecoder(cell, seq2seq.TrainingSampler())
  outputs, state, _ = basic(
      x, initial_state=cell.get_initial_state(batch_size=2, dtype=tf.float32))
  assert outputs.rnn_output.shape == (2, 6, 5)  # The two attentions.
  assert [h.stack().shape for h in state.alignment_history] == [(6, 2, 5)] * 2
  np.testing.assert_allclose(tf.reduce_sum(state.alignments[0], -1), [1, 1],
                             rtol=1e-6)
  np.testing.assert_array_equal(state.alignments[0][1, 2:], [0, 0, 0])
