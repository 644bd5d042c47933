"""`sequence_loss` and `SequenceLoss`: weighted cross-entropy over a
sequence of logits (TF Addons' `tfa.seq2seq.loss`), the class a Keras 3
loss usable in `compile`."""

from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tf_recurrent.op import unconverted


def _check_flags(average_across_timesteps, average_across_batch,
                 sum_over_timesteps, sum_over_batch):
  if average_across_timesteps and sum_over_timesteps:
    raise ValueError("average_across_timesteps and sum_over_timesteps cannot "
                     "be set to True at same time.")
  if average_across_batch and sum_over_batch:
    raise ValueError("average_across_batch and sum_over_batch cannot be set "
                     "to True at same time.")
  if average_across_batch and sum_over_timesteps:
    raise ValueError("average_across_batch and sum_over_timesteps cannot be "
                     "set to True at same time because of ambiguous order.")
  if sum_over_batch and average_across_timesteps:
    raise ValueError("sum_over_batch and average_across_timesteps cannot be "
                     "set to True at same time because of ambiguous order.")


@unconverted.entry_point
def sequence_loss(logits: Any, targets: Any, weights: Any,
                  average_across_timesteps: bool = True,
                  average_across_batch: bool = True,
                  sum_over_timesteps: bool = False,
                  sum_over_batch: bool = False,
                  softmax_loss_function: Optional[Callable] = None,
                  name: Optional[str] = None) -> tf.Tensor:
  """Weighted cross-entropy of `[batch, time, classes]` logits.

  Averaging divides by the sum of the weights; summing divides by the
  count of non-zero weights (Addons' semantics).

  Args:
    logits: `[batch, time, classes]` logits.
    targets: `[batch, time]` ids or `[batch, time, classes]` one-hots.
    weights: `[batch, time]` weights (a padding mask).
    average_across_timesteps: Average over time.
    average_across_batch: Average over the batch.
    sum_over_timesteps: Sum over time, divided by the non-zero weights.
    sum_over_batch: Sum over the batch, divided by the non-zero weights.
    softmax_loss_function: `(labels, logits) -> losses` instead of the
      softmax cross-entropy.
    name: An optional name scope.

  Returns:
    A scalar, or a `[batch]`, `[time]` or `[batch, time]` tensor for the
    axes not reduced.

  Example:

  >>> logits = tf.constant([[[0., 10.], [10., 0.]]])
  >>> float(sequence_loss(logits, [[1, 0]], tf.ones([1, 2]))) < 1e-3
  True
  """
  logits = tf.convert_to_tensor(logits)
  targets = tf.convert_to_tensor(targets)
  weights = tf.convert_to_tensor(weights)
  if len(logits.shape) != 3:
    raise ValueError("Logits must be a [batch_size x sequence_length x "
                     "logits] tensor")
  targets_rank = len(targets.shape)
  if targets_rank not in (2, 3):
    raise ValueError(
        "Targets must be either a [batch_size x sequence_length] tensor where "
        "each element contains the labels' index or a [batch_size x "
        "sequence_length x num_classes] tensor where the third axis is a "
        "one-hot representation of the labels")
  if len(weights.shape) != 2:
    raise ValueError("Weights must be a [batch_size x sequence_length] tensor")
  _check_flags(average_across_timesteps, average_across_batch,
               sum_over_timesteps, sum_over_batch)
  with tf.name_scope(name or "sequence_loss"):
    num_classes = tf.shape(logits)[2]
    logits_flat = tf.reshape(logits, [-1, num_classes])
    if softmax_loss_function is not None:
      crossent = softmax_loss_function(labels=tf.reshape(targets, [-1]),
                                       logits=logits_flat)
    elif targets_rank == 2:
      crossent = tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=tf.reshape(targets, [-1]), logits=logits_flat)
    else:
      crossent = tf.nn.softmax_cross_entropy_with_logits(
          labels=tf.reshape(targets, [-1, num_classes]), logits=logits_flat)
    weights = tf.cast(weights, crossent.dtype)
    crossent *= tf.reshape(weights, [-1])
    if average_across_timesteps and average_across_batch:
      return tf.math.divide_no_nan(tf.reduce_sum(crossent),
                                   tf.reduce_sum(weights))
    if sum_over_timesteps and sum_over_batch:
      count = tf.cast(tf.math.count_nonzero(weights), crossent.dtype)
      return tf.math.divide_no_nan(tf.reduce_sum(crossent), count)
    crossent = tf.reshape(crossent, tf.shape(logits)[0:2])
    if average_across_timesteps or average_across_batch:
      axis = [0] if average_across_batch else [1]
      return tf.math.divide_no_nan(tf.reduce_sum(crossent, axis=axis),
                                   tf.reduce_sum(weights, axis=axis))
    if sum_over_timesteps or sum_over_batch:
      axis = [0] if sum_over_batch else [1]
      count = tf.cast(tf.math.count_nonzero(weights, axis=axis),
                      crossent.dtype)
      return tf.math.divide_no_nan(tf.reduce_sum(crossent, axis=axis), count)
    return crossent


@keras.saving.register_keras_serializable(package="tf_recurrent")
class SequenceLoss(unconverted.EntryPoint, keras.losses.Loss):
  """`sequence_loss` as a Keras 3 loss (`model.compile(loss=...)`).

  Its defaults sum over time and batch, divided by the non-zero weights;
  Keras's `sample_weight` is the `[batch, time]` weights (ones if none).

  Args:
    average_across_timesteps: See `sequence_loss`.
    average_across_batch: See `sequence_loss`.
    sum_over_timesteps: See `sequence_loss`.
    sum_over_batch: See `sequence_loss`.
    softmax_loss_function: See `sequence_loss`.
    name: The loss's name.

  Example:

  >>> loss = SequenceLoss()
  >>> logits = tf.constant([[[0., 10.], [10., 0.]]])
  >>> float(loss(tf.constant([[1, 0]]), logits)) < 1e-3
  True
  """

  def __init__(self, average_across_timesteps: bool = False,
               average_across_batch: bool = False,
               sum_over_timesteps: bool = True, sum_over_batch: bool = True,
               softmax_loss_function: Optional[Callable] = None,
               name: Optional[str] = None):
    super().__init__(reduction=None, name=name or "sequence_loss")
    _check_flags(average_across_timesteps, average_across_batch,
                 sum_over_timesteps, sum_over_batch)
    self.average_across_timesteps = average_across_timesteps
    self.average_across_batch = average_across_batch
    self.sum_over_timesteps = sum_over_timesteps
    self.sum_over_batch = sum_over_batch
    self.softmax_loss_function = softmax_loss_function

  def __call__(self, y_true, y_pred, sample_weight=None):
    # The weights are the loss's own argument, not Keras's elementwise
    # sample weighting, so the reduction is sequence_loss's alone.
    y_pred = tf.convert_to_tensor(y_pred)
    if sample_weight is None:
      sample_weight = tf.ones(tf.shape(y_pred)[:2], y_pred.dtype)
    return sequence_loss(
        y_pred, y_true, sample_weight,
        average_across_timesteps=self.average_across_timesteps,
        average_across_batch=self.average_across_batch,
        sum_over_timesteps=self.sum_over_timesteps,
        sum_over_batch=self.sum_over_batch,
        softmax_loss_function=self.softmax_loss_function)

  def call(self, y_true, y_pred):
    return self(y_true, y_pred)

  def get_config(self):
    return {"name": self.name,
            "average_across_timesteps": self.average_across_timesteps,
            "average_across_batch": self.average_across_batch,
            "sum_over_timesteps": self.sum_over_timesteps,
            "sum_over_batch": self.sum_over_batch}
