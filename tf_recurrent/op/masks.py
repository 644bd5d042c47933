"""Per-example `[B]` masks applied to `[B, ...]` tensors: the one owner.

Per-example lengths (a step past an example's length), Keras masks (a
masked step) and the backward pass of both pick, per example, one of two
tensors along the batch axis (axis 0 of a state or of one step's input
row). Everything that does so goes through `select`. A mask may also cover
several leading axes (a `[K, B]` block of steps against `[K, B, H]` rows).
"""

from typing import Any

import tensorflow as tf


def expand(mask: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
  """The `[B]` mask reshaped to `[B, 1, ...]`, broadcasting against `like`.

  A mask of several leading axes (`[K, B]`) gets ones for the rest.

  Example:

  >>> expand(tf.constant([True, False]), tf.zeros([2, 3, 4])).shape
  TensorShape([2, 1, 1])
  >>> expand(tf.ones([5, 2], tf.bool), tf.zeros([5, 2, 4])).shape
  TensorShape([5, 2, 1])
  """
  if mask.shape.rank is not None and like.shape.rank is not None:
    # Ranks known while tracing: one op (none at equal ranks), not five;
    # this runs in every step of a masked loop.
    extra = like.shape.rank - mask.shape.rank
    return mask[(Ellipsis,) + (tf.newaxis,) * extra] if extra else mask
  return tf.reshape(mask, tf.concat(
      [tf.shape(mask), tf.ones([tf.rank(like) - tf.rank(mask)], tf.int32)],
      0))


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
