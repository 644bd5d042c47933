"""Eager calls on new lengths reuse one trace (tracing.RelaxedFunction)."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent import op as op_lib
from tf_recurrent import sequence
from tf_recurrent import tracing


def traces_so_far():
  """Traces of every eager loop function: the layers' pairs and the op's."""
  functions = [partial.func for kind in ("lstm", "gru")
               for recompute in (False, True)
               for partial in sequence._eager_functions(kind, recompute)]  # pylint: disable=protected-access
  functions += [entry["traced"] for entry in op_lib._eager_cache.values()]  # pylint: disable=protected-access
  return sum(f.tracing_count for f in functions)


LAYERS = {
    "LSTM": lambda: tf_recurrent.LSTM(4, return_sequences=True),
    "GRU_recompute": lambda: tf_recurrent.GRU(4, recompute=True),
    "SimpleRNN": lambda: tf_recurrent.SimpleRNN(4),
    "RNN_user_cell": lambda: tf_recurrent.RNN(
        keras.layers.StackedRNNCells([keras.layers.LSTMCell(4),
                                      keras.layers.GRUCell(3)])),
}


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", LAYERS)
def test_new_lengths_trace_nothing_new(caplog, name, masked):
  layer = LAYERS[name]()

  def call(length, batch=3):
    x = tf.random.normal([batch, length, 2], seed=length)
    mask = (tf.sequence_mask(tf.range(batch) + length - batch, length)
            if masked else None)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x, mask=mask))
    grads = tape.gradient(loss, layer.trainable_weights)
    assert all(g is not None for g in grads)

  call(10)
  after_first = traces_so_far()
  with caplog.at_level(logging.WARNING):
    for length in (11, 13, 17, 24, 31):
      call(length)
  assert traces_so_far() == after_first
  assert "retracing" not in caplog.text


def test_relaxed_dimensions_only():
  """A new size of a dimension left static traces anew; the relaxed ones
  do not."""
  seen = []

  def total(x, y):
    seen.append((x.shape.as_list(), y.shape.as_list()))
    return tf.reduce_sum(x) + tf.reduce_sum(y)

  fn = tracing.RelaxedFunction(total)
  for t in (2, 3):
    np.testing.assert_allclose(fn(tf.ones([t, 4]), tf.ones([t + 1, 5]),
                                  unknown=(1, -1)), 4 * t + 5 * (t + 1))
  fn(tf.ones([2, 6]), tf.ones([3, 5]), unknown=(1, -1))
  assert seen == [([None, 4], [None, 5]), ([None, 6], [None, 5])]
  assert fn.tracing_count == 2
