"""TF Addons' NMT tutorial's models through `tf.train.Checkpoint`.

The tutorial (tpu_examples/train_nmt.py, at toy sizes) trains an `Encoder`
and a `Decoder` (an `AttentionWrapper` in a `BasicDecoder`), saves
`tf.train.Checkpoint(optimizer=..., encoder=..., decoder=...)` with a
`tf.train.CheckpointManager`, and restores it into fresh models to translate
(greedy `BasicDecoder`, `BeamSearchDecoder`). Each restore here gives back
every weight exactly, the same decodes and, with the optimizer's slots, the
same next optimizer step:

- into models built by a call, the optimizer built too (`assert_consumed`);
- into the models alone (no optimizer: an inference job);
- before the first call (deferred: each weight restored as it is created,
  in an eager call or a tf.function's trace), the optimizer unbuilt, as the
  tutorial restores;
- from a checkpoint the previous release wrote (its wrapper's attention
  layers and mechanisms reached only through the optimizer), once the
  optimizer is built (docs/export.md);
- and Keras's `save_weights`/`load_weights` (`.weights.h5`).

Two decoders: the tutorial's (one `LuongAttention`, the mechanism and the
cell also the model's attributes) and one whose wrapper holds the three
other mechanisms, reachable only through it. A `BeamSearchDecoder` that an
inference model alone holds, over all four mechanisms, restores from its
own checkpoint.

The next step is an optimizer step on fixed gradients: every variable the
checkpoint holds (Adam's slots too) takes part, and the decodes check the
forward pass with the restored weights, without a trace of the tutorial's
training step (the op with its XLA step clusters, 4-5 s a model; a real
training step resumes in tests/layers/test_saving.py, and the tutorial
trains in tests/test_tpu_examples.py).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tf_recurrent import seq2seq
from tf_recurrent.engine import tracking

VOCAB, EMBEDDING, UNITS, BATCH, SOURCE_STEPS, TARGET_STEPS = 7, 3, 4, 2, 5, 4
BEAM_WIDTH, START, END = 2, 1, 2
KINDS = ["luong", "several"]


class BuildsInItsCall:
  """A subclassed model whose layers build in its first call itself.

  Keras 3 builds an unbuilt subclassed model that has no `build` by first
  tracing its call symbolically; a restore pending then fails inside Keras
  (it reads the new variable in its stateless scope), leaving the first
  weight created in the trace at its initial value and a second one in its
  place (`test_keras_symbolic_build_loses_a_deferred_restore`). A `build`
  that builds nothing skips that trace.
  """

  def build(self, *shapes, **named_shapes):
    del shapes, named_shapes


class Encoder(BuildsInItsCall, keras.Model):
  """The tutorial's encoder."""

  def __init__(self):
    super().__init__()
    self.embedding = keras.layers.Embedding(VOCAB, EMBEDDING)
    self.lstm_layer = keras.layers.LSTM(UNITS, return_sequences=True,
                                        return_state=True)

  def call(self, x):
    return self.lstm_layer(self.embedding(x))


def several_mechanisms():
  return [seq2seq.LuongAttention(UNITS, scale=True),
          seq2seq.BahdanauAttention(UNITS, normalize=True),
          seq2seq.LuongMonotonicAttention(UNITS, score_bias_init=-1.0),
          seq2seq.BahdanauMonotonicAttention(UNITS, mode="hard")]


class Decoder(BuildsInItsCall, keras.Model):
  """The tutorial's decoder ("luong"), or one over the three other
  mechanisms ("several"), which only its wrapper holds."""

  def __init__(self, kind):
    super().__init__()
    self.embedding = keras.layers.Embedding(VOCAB, EMBEDDING)
    self.fc = keras.layers.Dense(VOCAB)
    self.sampler = seq2seq.TrainingSampler()
    if kind == "luong":
      self.decoder_rnn_cell = keras.layers.LSTMCell(UNITS)
      self.attention_mechanism = seq2seq.LuongAttention(
          UNITS, None, BATCH * [SOURCE_STEPS])
      self.rnn_cell = seq2seq.AttentionWrapper(
          self.decoder_rnn_cell, self.attention_mechanism,
          attention_layer_size=UNITS)
    else:
      self.rnn_cell = seq2seq.AttentionWrapper(
          keras.layers.LSTMCell(UNITS), several_mechanisms()[1:],
          attention_layer_size=[UNITS, 3, 2])
    self.decoder = seq2seq.BasicDecoder(self.rnn_cell, sampler=self.sampler,
                                        output_layer=self.fc)

  def setup_memory(self, memory):
    for mechanism in self.rnn_cell.attention_mechanisms:
      mechanism.setup_memory(memory)

  def initial_state(self, batch, encoder_state):
    return self.rnn_cell.get_initial_state(
        batch_size=batch, dtype=tf.float32).clone(cell_state=encoder_state)

  def call(self, inputs, initial_state):
    outputs, _, _ = self.decoder(self.embedding(inputs),
                                 initial_state=initial_state,
                                 sequence_length=BATCH * [TARGET_STEPS - 1])
    return outputs


def source_tokens():
  rng = np.random.default_rng(5)
  return tf.constant(rng.integers(3, VOCAB, [BATCH, SOURCE_STEPS]),
                     tf.int32)


class Job:
  """The tutorial's models, optimizer and checkpoint, fresh."""

  def __init__(self, kind):
    self.encoder, self.decoder = Encoder(), Decoder(kind)
    self.optimizer = keras.optimizers.Adam(0.05)
    self.checkpoint = tf.train.Checkpoint(
        optimizer=self.optimizer, encoder=self.encoder, decoder=self.decoder)

  @property
  def variables(self):
    return self.encoder.trainable_variables + self.decoder.trainable_variables

  @property
  def weights(self):
    return [w.numpy() for w in self.encoder.weights + self.decoder.weights]

  @property
  def optimizer_variables(self):
    return [v.numpy() for v in self.optimizer.variables]

  def encode(self, source):
    memory, h, c = self.encoder(source)
    return memory, [h, c]

  def fixed_step(self):
    """An optimizer step on fixed gradients: the weights and the slots."""
    variables = self.variables
    self.optimizer.apply_gradients(
        (tf.random.stateless_normal(v.shape, seed=[i, 7]), v)
        for i, v in enumerate(variables))

  def build(self, source):
    """Builds every weight: a greedy translation, as after a restore (the
    decoder model's own call, teacher-forced training, is not needed)."""
    self.decoder.embedding(source)
    decodes = self.greedy(source)
    self.decoder.build()  # Its layers are: Keras's save_weights asks.
    return decodes

  def build_optimizer(self):
    self.optimizer.build(self.variables)

  def greedy(self, source):
    memory, state = self.encode(source)
    self.decoder.setup_memory(memory)
    decoder = seq2seq.BasicDecoder(
        cell=self.decoder.rnn_cell, sampler=seq2seq.GreedyEmbeddingSampler(),
        output_layer=self.decoder.fc, maximum_iterations=TARGET_STEPS)
    outputs, _, _ = decoder(
        self.decoder.embedding.variables[0],
        start_tokens=tf.fill([BATCH], START), end_token=END,
        initial_state=self.decoder.initial_state(BATCH, state))
    return outputs.rnn_output, outputs.sample_id

  def beam(self, source):
    memory, state = self.encode(source)
    self.decoder.setup_memory(seq2seq.tile_batch(memory, BEAM_WIDTH))
    decoder = seq2seq.BeamSearchDecoder(
        self.decoder.rnn_cell, beam_width=BEAM_WIDTH,
        output_layer=self.decoder.fc, maximum_iterations=TARGET_STEPS)
    outputs, _, lengths = decoder(
        self.decoder.embedding.variables[0],
        start_tokens=tf.fill([BATCH], START), end_token=END,
        initial_state=self.decoder.initial_state(
            BATCH * BEAM_WIDTH, seq2seq.tile_batch(state, BEAM_WIDTH)))
    return (outputs.predicted_ids, outputs.beam_search_decoder_output.scores,
            lengths)

  def decodes(self):
    source = source_tokens()
    return [t.numpy() for t in self.greedy(source) + self.beam(source)]


class Trained:
  """A job two optimizer steps in, saved by a CheckpointManager, with what
  it computes next: its decodes and its next step."""

  def __init__(self, kind, directory):
    self.kind = kind
    keras.utils.set_random_seed(11)
    job = Job(kind)
    job.build(source_tokens())
    for _ in range(2):
      job.fixed_step()
    self.path = tf.train.CheckpointManager(job.checkpoint, directory,
                                           max_to_keep=1).save()
    self.weights = job.weights
    self.decodes = job.decodes()
    job.fixed_step()
    self.weights_after_next_step = job.weights
    self.optimizer_variables_after_next_step = job.optimizer_variables


@pytest.fixture(scope="module", params=KINDS)
def trained(request, tmp_path_factory):
  return Trained(request.param, str(tmp_path_factory.mktemp(request.param)))


def assert_weights_equal(got, want):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


def assert_next_step_equal(job, trained):
  job.fixed_step()
  assert_weights_equal(job.weights, trained.weights_after_next_step)
  assert_weights_equal(job.optimizer_variables,
                       trained.optimizer_variables_after_next_step)


def object_paths(path):
  """Every path from the root to a variable in a checkpoint's object graph
  (`tf.train.list_variables` names each variable by its shortest path only:
  here the optimizer's)."""
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(tf.train.load_checkpoint(path).get_tensor(
      "_CHECKPOINTABLE_OBJECT_GRAPH"))
  found, stack = set(), [(0, "")]
  while stack:
    node, prefix = stack.pop()
    if graph.nodes[node].attributes:
      found.add(prefix.rstrip("/"))
    for child in graph.nodes[node].children:
      stack.append((child.node_id, f"{prefix}{child.local_name}/"))
  return found


def test_checkpoint_names_the_wrappers_layers_and_mechanisms(trained):
  # Addons' paths (on Keras 3 a Dense layer's kernel is `_kernel`).
  paths = object_paths(trained.path)
  wrapper = "decoder/rnn_cell/"
  mechanisms = 1 if trained.kind == "luong" else 3
  for i in range(mechanisms):
    assert f"{wrapper}_attention_layers/{i}/_kernel" in paths
    assert f"{wrapper}_attention_mechanisms/{i}/memory_layer/_kernel" in paths


def test_restores_into_built_models_and_optimizer(trained):
  job = Job(trained.kind)
  job.build(source_tokens())
  job.build_optimizer()
  job.checkpoint.restore(trained.path).assert_consumed()
  assert_weights_equal(job.weights, trained.weights)
  assert_weights_equal(job.decodes(), trained.decodes)
  assert_next_step_equal(job, trained)


def test_restores_into_the_models_alone(trained):
  # An inference job: no optimizer.
  job = Job(trained.kind)
  job.build(source_tokens())
  status = tf.train.Checkpoint(encoder=job.encoder,
                               decoder=job.decoder).restore(trained.path)
  status.assert_existing_objects_matched().expect_partial()
  assert_weights_equal(job.weights, trained.weights)
  assert_weights_equal(job.decodes(), trained.decodes)


def restore_before_the_first_call(trained, build):
  job = Job(trained.kind)
  status = job.checkpoint.restore(trained.path)
  build(job)
  assert_weights_equal(job.weights, trained.weights)
  assert_weights_equal(job.decodes(), trained.decodes)
  assert_next_step_equal(job, trained)  # Builds the optimizer.
  status.assert_consumed()


def test_restores_before_the_first_call(trained):
  # The tutorial's restore: fresh models and optimizer, nothing built; each
  # weight (the optimizer's slots too) takes its value as it is created.
  restore_before_the_first_call(trained, lambda job: job.build(source_tokens()))


@pytest.mark.parametrize("trained", ["luong"], indirect=True)
def test_restores_before_a_traced_first_call(trained):
  # The same, each weight created in a tf.function's trace (the same for
  # every kind).
  restore_before_the_first_call(
      trained, lambda job: tf.function(job.build)(source_tokens()))


def test_weights_files_restore(trained, tmp_path):
  # Keras's own save_weights/load_weights (.weights.h5): Keras follows its
  # lists itself.
  job = Job(trained.kind)
  job.checkpoint.restore(trained.path).expect_partial()
  job.build(source_tokens())
  fresh = Job(trained.kind)
  fresh.build(source_tokens())
  for name in ("encoder", "decoder"):
    path = str(tmp_path / f"{name}.weights.h5")
    getattr(job, name).save_weights(path)
    getattr(fresh, name).load_weights(path)
  assert_weights_equal(fresh.weights, trained.weights)
  assert_weights_equal(fresh.decodes(), trained.decodes)


class BeamTranslator(BuildsInItsCall, keras.Model):
  """An inference model holding only a BeamSearchDecoder over an
  AttentionWrapper of all four mechanisms: every weight but the
  embedding's and the encoder's is reached through the decoder."""

  def __init__(self):
    super().__init__()
    self.embedding = keras.layers.Embedding(VOCAB, EMBEDDING)
    self.encoder = keras.layers.LSTM(UNITS, return_sequences=True,
                                     return_state=True)
    self.wrapper = lambda: cell  # Not an attribute the checkpoint follows.
    cell = seq2seq.AttentionWrapper(keras.layers.GRUCell(UNITS),
                                    several_mechanisms(),
                                    attention_layer_size=[3, 2, 2, 3])
    self.beam_decoder = seq2seq.BeamSearchDecoder(
        cell,
        beam_width=BEAM_WIDTH, embedding_fn=self.embedding,
        output_layer=keras.layers.Dense(VOCAB),
        maximum_iterations=TARGET_STEPS, length_penalty_weight=0.5)

  def call(self, source):
    memory, h, _ = self.encoder(self.embedding(source))
    cell = self.wrapper()
    for mechanism in cell.attention_mechanisms:
      mechanism.setup_memory(seq2seq.tile_batch(memory, BEAM_WIDTH))
    state = cell.get_initial_state(batch_size=BATCH * BEAM_WIDTH,
                                   dtype=tf.float32).clone(
                                       cell_state=seq2seq.tile_batch(
                                           [h], BEAM_WIDTH))
    outputs, _, lengths = self.beam_decoder(
        None, start_tokens=tf.fill([BATCH], START), end_token=END,
        initial_state=state)
    return outputs.predicted_ids, outputs.beam_search_decoder_output.scores, lengths


def test_beam_search_decoder_model_restores(tmp_path):
  source = source_tokens()
  model = BeamTranslator()
  model(source)
  for weight in model.weights:  # Not the initial weights.
    weight.assign(tf.random.stateless_normal(weight.shape, seed=[4, 2]))
  want = model(source)
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / "beam"))
  for built in (True, False):
    fresh = BeamTranslator()
    if built:
      fresh(source)
    status = tf.train.Checkpoint(model=fresh).restore(path)
    got = fresh(source)
    status.assert_consumed()
    assert_weights_equal([w.numpy() for w in fresh.weights],
                         [w.numpy() for w in model.weights])
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)


def test_restores_the_previous_releases_checkpoint(tmp_path, monkeypatch):
  # The previous release tracked no list of the wrapper's: its attention
  # layer's kernel (and the memory layers of mechanisms the model does not
  # also hold) reached the checkpoint only as the optimizer's variables.
  # Such a checkpoint restores once the optimizer is built, with the same
  # variables in the same order (docs/export.md).
  source = source_tokens()
  with monkeypatch.context() as patch:
    patch.setattr(tracking, "track_list", lambda *args, **kwargs: None)
    keras.utils.set_random_seed(11)
    old = Job("several")
  old.build(source)
  old.fixed_step()
  path = old.checkpoint.save(str(tmp_path / "old"))
  assert not any("_attention_" in name for name in object_paths(path))

  job = Job("several")
  job.build(source)
  job.build_optimizer()
  job.checkpoint.restore(path).assert_existing_objects_matched()
  assert_weights_equal(job.weights, old.weights)
  assert_weights_equal(job.optimizer_variables, old.optimizer_variables)


@pytest.mark.xfail(strict=True, reason="Keras 3 (3.15): a restore pending "
                   "when Keras traces an unbuilt model's first call to build "
                   "it is lost (BuildsInItsCall)")
def test_keras_symbolic_build_loses_a_deferred_restore(tmp_path):
  # Keras's own layers alone: what BuildsInItsCall steps around. Strict:
  # the day Keras restores here, this fails, and the workaround can go.
  class Model(keras.Model):

    def __init__(self):
      super().__init__()
      self.embedding = keras.layers.Embedding(VOCAB, EMBEDDING)

    def call(self, x):
      return self.embedding(x)

  source = source_tokens()
  model = Model()
  want = model(source)
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / "keras"))
  fresh = Model()
  tf.train.Checkpoint(model=fresh).restore(path)
  np.testing.assert_array_equal(fresh(source), want)
