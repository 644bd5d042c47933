"""tf_recurrent.bidirectional against two static unrolls, one reversed."""

import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from conftest import (assert_all_close, elman_args, elman_cell, elman_grad,
                      in_mode, static_unroll)

SEQ_LEN = 5


def reference(theta_fw, theta_bw, s_fw, s_bw, x, lengths):
  """Forward unroll, and an unroll over each example's reversed prefix."""
  acc_fw, final_fw = static_unroll(theta_fw, s_fw, x, elman_cell,
                                   sequence_length=lengths)
  if lengths is None:
    rev = lambda v: tf.reverse(v, [0])
  else:
    rev = lambda v: tf.reverse_sequence(v, lengths, seq_axis=0, batch_axis=1)
  acc_bw, final_bw = static_unroll(theta_bw, s_bw, rev(x), elman_cell,
                                   sequence_length=lengths)
  return ((acc_fw, tf.nest.map_structure(rev, acc_bw)), (final_fw, final_bw))


@pytest.mark.parametrize("lengths", [None, [5, 2, 0]])
@pytest.mark.parametrize("time_major", [True, False])
def test_matches_reversed_unrolls(mode, lengths, time_major):
  theta_fw, s_fw, x = elman_args(SEQ_LEN, seed=1)
  theta_bw, s_bw, _ = elman_args(SEQ_LEN, seed=2)
  feed = x if time_major else tf.transpose(x, [1, 0, 2])

  def loss_of(outputs, batch_major):
    (acc_fw, acc_bw), (final_fw, final_bw) = outputs
    if batch_major:
      acc_fw, acc_bw = (tf.nest.map_structure(
          lambda v: tf.transpose(v, [1, 0, 2]), a) for a in (acc_fw, acc_bw))
    weights = tf.reshape(tf.range(SEQ_LEN, dtype=tf.float64), [-1, 1, 1])
    return (tf.reduce_sum(tf.sin(acc_fw["h"]) * weights) +
            tf.reduce_sum(tf.cos(acc_bw["h"]) * weights) +
            tf.reduce_sum(final_fw["h"] * final_bw["h"])), (acc_fw, acc_bw)

  def run(tfw, tbw, sf, sb, inputs):
    with tf.GradientTape() as tape:
      tape.watch([tfw, tbw, sf, sb, inputs])
      loss, accs = loss_of(tf_recurrent.bidirectional(
          tfw, tbw, sf, sb, inputs, elman_cell, elman_cell,
          cell_grad_bw=elman_grad, sequence_length=lengths,
          time_major=time_major), batch_major=not time_major)
    return loss, accs, tape.gradient(loss, [tfw, tbw, sf, sb, inputs])

  def ref(tfw, tbw, sf, sb, inputs):
    with tf.GradientTape() as tape:
      tape.watch([tfw, tbw, sf, sb, inputs])
      loss, accs = loss_of(reference(tfw, tbw, sf, sb, inputs, lengths),
                           batch_major=False)
    return loss, accs, tape.gradient(loss, [tfw, tbw, sf, sb, inputs])

  loss, accs, grads = in_mode(mode, run)(theta_fw, theta_bw, s_fw, s_bw, feed)
  want_loss, want_accs, want_grads = ref(theta_fw, theta_bw, s_fw, s_bw, x)
  if not time_major:
    grads[-1] = tf.transpose(grads[-1], [1, 0, 2])
  assert_all_close((loss, accs, grads), (want_loss, want_accs, want_grads),
                   tol=1e-9)
  if lengths is not None:
    for acc in accs:
      assert np.all(np.asarray(acc["h"])[2:, 1] == 0)


def test_rejects_max_input_length():
  theta, s, x = elman_args(SEQ_LEN)
  with pytest.raises(ValueError, match="does not take max_input_length"):
    tf_recurrent.bidirectional(theta, theta, s, s, x, elman_cell, elman_cell,
                               max_input_length=2)
