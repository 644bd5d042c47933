"""tf_recurrent.contrib: tf.contrib.recurrent's names, one import swapped."""

import inspect

import keras
import numpy as np
import tensorflow as tf

import tf_recurrent
from tf_recurrent import contrib as recurrent  # was: ...python.ops import recurrent
from tf_recurrent.compat import dynamic
from conftest import assert_all_close, elman_args, elman_cell, static_unroll


def test_recurrent_is_the_op():
  assert recurrent.Recurrent is tf_recurrent.recurrent
  theta, state0, inputs = elman_args(4)
  acc, final = recurrent.Recurrent(theta, state0, inputs, elman_cell)
  want_acc, want_final = static_unroll(theta, state0, inputs, elman_cell)
  assert_all_close((acc, final), (want_acc, want_final), 1e-12)


def test_contrib_signatures():
  assert list(inspect.signature(recurrent.functional_rnn).parameters) == [
      "cell", "inputs", "sequence_length", "initial_state", "dtype",
      "time_major", "scope", "use_tpu"]
  assert list(inspect.signature(
      recurrent.bidirectional_functional_rnn).parameters) == [
          "cell_fw", "cell_bw", "inputs", "initial_state_fw",
          "initial_state_bw", "dtype", "sequence_length", "time_major",
          "use_tpu", "scope"]


def test_functional_rnn_runs_dynamic_rnn(monkeypatch):
  """The same code: functional_rnn's positional order reaches dynamic_rnn."""
  cell = keras.layers.GRUCell(3)
  x = tf.constant(np.random.default_rng(0).normal(size=[4, 2, 5]), tf.float32)
  s0 = tf.ones([2, 3])
  got = recurrent.functional_rnn(cell, x, [4, 1], s0, tf.float32, True)
  want = tf_recurrent.dynamic_rnn(cell, x, sequence_length=[4, 1],
                                  initial_state=s0, time_major=True)
  assert_all_close(got, want, 0.0)
  calls = []
  monkeypatch.setattr(dynamic, "dynamic_rnn",
                      lambda *a, **k: calls.append((a, k)) or "ran")
  monkeypatch.setattr(dynamic, "bidirectional_dynamic_rnn",
                      lambda *a, **k: calls.append((a, k)) or "ran both")
  assert recurrent.functional_rnn(cell, x, scope="s", use_tpu=True) == "ran"
  assert recurrent.bidirectional_functional_rnn(
      cell, cell, x, s0, None, tf.float32, [4, 1]) == "ran both"
  assert calls[0][1]["scope"] == "s"
  assert calls[1][1]["initial_state_fw"] is s0
  assert calls[1][1]["sequence_length"] == [4, 1]


def test_bidirectional_functional_rnn_matches_bidirectional_dynamic_rnn():
  fw, bw = keras.layers.LSTMCell(3), keras.layers.SimpleRNNCell(2)
  x = tf.constant(np.random.default_rng(1).normal(size=[2, 5, 4]), tf.float32)
  got = recurrent.bidirectional_functional_rnn(
      fw, bw, x, dtype=tf.float32, sequence_length=[5, 2])
  want = tf_recurrent.bidirectional_dynamic_rnn(
      fw, bw, x, sequence_length=[5, 2], dtype=tf.float32)
  assert_all_close(got, want, 0.0)
