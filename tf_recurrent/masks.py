"""Per-example `[B]` masks applied to `[B, ...]` tensors: the one owner.

Per-example lengths (a step past an example's length), Keras masks (a
masked step) and the backward pass of both pick, per example, one of two
tensors along the batch axis (axis 0 of a state or of one step's input
row). Everything that does so goes through `select`.
"""

from typing import Any

import tensorflow as tf


def expand(mask: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
  """The `[B]` mask reshaped to `[B, 1, ...]`, broadcasting against `like`.

  Example:

  >>> expand(tf.constant([True, False]), tf.zeros([2, 3, 4])).shape
  TensorShape([2, 1, 1])
  """
  return tf.reshape(mask, tf.concat(
      [tf.shape(mask), tf.ones([tf.rank(like) - 1], tf.int32)], 0))


def select(mask: tf.Tensor, on: tf.Tensor, off: tf.Tensor) -> tf.Tensor:
  """Per example b, `on[b]` where `mask[b]` else `off[b]`.

  Example:

  >>> select(tf.constant([True, False]), tf.ones([2, 2]),
  ...        tf.zeros([2, 2])).numpy().tolist()
  [[1.0, 1.0], [0.0, 0.0]]
  """
  return tf.where(expand(mask, on), on, off)


def select_structure(mask: tf.Tensor, on: Any, off: Any) -> Any:
  """`select` leaf by leaf over two structures alike (a masked step carries
  its state through: `select_structure(mask, new_state, old_state)`)."""
  return tf.nest.map_structure(lambda a, b: select(mask, a, b), on, off)


def zero_where_off(mask: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
  """`x` with the examples whose mask is False set to zero."""
  return select(mask, x, tf.zeros_like(x))
