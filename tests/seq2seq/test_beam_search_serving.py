"""An attention decoder's SavedModel serves beam search in a process that
never imports tf_recurrent (issue 50: a model with an attention decoder
exports a SavedModel whose serving signature runs beam search). The
serving process runs as a program: `--programs`."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_fresh
import tf_recurrent
from tf_recurrent import seq2seq

pytestmark = pytest.mark.programs

VOCAB, UNITS, BEAM_WIDTH, START, END, MAX_STEPS = 11, 8, 3, 1, 2, 7


class Translator(tf.Module):
  """An encoder (Embedding, LSTM) and a Bahdanau AttentionWrapper decoder
  whose `translate` signature runs beam search."""

  def __init__(self):
    super().__init__()
    keras.utils.set_random_seed(3)
    self.embedding = keras.layers.Embedding(VOCAB, 6)
    self.encoder = tf_recurrent.LSTM(UNITS, return_sequences=True,
                                     return_state=True)
    self.mechanism = seq2seq.BahdanauAttention(UNITS)
    self.cell = seq2seq.AttentionWrapper(
        keras.layers.LSTMCell(UNITS), self.mechanism,
        attention_layer_size=UNITS)
    self.decoder = seq2seq.BeamSearchDecoder(
        self.cell, BEAM_WIDTH, embedding_fn=self.embedding,
        output_layer=keras.layers.Dense(VOCAB), length_penalty_weight=0.5,
        maximum_iterations=MAX_STEPS)

  @tf.function(input_signature=[
      tf.TensorSpec([None, None], tf.int32, name="source"),
      tf.TensorSpec([None], tf.int32, name="source_length")])
  def translate(self, source, source_length):
    batch = tf.shape(source)[0]
    memory, h, c = self.encoder(
        self.embedding(source),
        mask=tf.sequence_mask(source_length, tf.shape(source)[1]))
    self.mechanism.setup_memory(
        seq2seq.tile_batch(memory, BEAM_WIDTH),
        memory_sequence_length=seq2seq.tile_batch(source_length, BEAM_WIDTH))
    state = self.cell.get_initial_state(batch_size=batch * BEAM_WIDTH,
                                        dtype=tf.float32)
    state = state.clone(cell_state=seq2seq.tile_batch([h, c], BEAM_WIDTH))
    outputs, _, lengths = self.decoder(
        None, start_tokens=tf.fill([batch], START), end_token=END,
        initial_state=state)
    return {"predicted_ids": outputs.predicted_ids, "lengths": lengths}


SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
source = np.array([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]], np.int32)
result = served(source=tf.constant(source),
                source_length=tf.constant([5, 3], tf.int32))
print("RESULT", json.dumps({k: v.numpy().tolist() for k, v in result.items()}))
"""


def test_saved_model_serves_beam_search_without_tf_recurrent(tmp_path):
  translator = Translator()
  source = tf.constant([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]], tf.int32)
  want = translator.translate(source, tf.constant([5, 3]))
  assert want["predicted_ids"].shape[::2] == (2, BEAM_WIDTH)
  assert want["predicted_ids"].shape[1] <= MAX_STEPS
  tf.saved_model.save(translator, str(tmp_path),
                      signatures=translator.translate)
  out = run_fresh(SERVE, tmp_path)
  got = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value.numpy())
