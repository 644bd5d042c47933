"""Eager calls on new lengths reuse one trace (tracing.RelaxedFunction)."""

import collections
import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent.op import op as op_lib
from tf_recurrent.chunked import sequence
from tf_recurrent.op import tracing


def traces_so_far():
  """Traces of every eager loop function: the layers' pairs and the op's."""
  op_traces = sum(entry["traced"].tracing_count
                  for entry in op_lib._eager_cache.values())  # pylint: disable=protected-access
  return sequence.tracing_count() + op_traces


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


def test_a_models_first_train_step_traces_the_loops_once(monkeypatch):
  """Keras traces its train function twice on the first call; the loop
  pair, a tf.function inside it, is traced once (a second trace of each
  cost 0.13-0.15 s of every model's first call)."""
  traced = collections.Counter()

  def counting(name, loop):
    def counted(*args, **kwargs):
      traced[name] += 1
      return loop(*args, **kwargs)
    return counted

  for name in ("_forward", "_backward"):
    monkeypatch.setattr(sequence, name,
                        counting(name, getattr(sequence, name)))
  monkeypatch.setattr(sequence, "_loop_function_cache", {})
  # A GRU: a small float32 LSTM runs on the whole-sequence kernels instead.
  model = keras.Sequential([keras.Input((5, 2), batch_size=3),
                            tf_recurrent.GRU(4), keras.layers.Dense(1)])
  model.compile(optimizer="sgd", loss="mse")
  for _ in range(2):
    model.train_on_batch(np.ones([3, 5, 2]), np.ones([3, 1]))
  assert traced == {"_forward": 1, "_backward": 1}


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
