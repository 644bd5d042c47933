"""`tile_batch`: repeat each batch entry, for beam search's memory."""

from typing import Any

import tensorflow as tf


def _tile_batch(t, multiplier):
  t = tf.convert_to_tensor(t, name="t")
  if t.shape.ndims is None or t.shape.ndims < 1:
    raise ValueError("t must have statically known rank")
  tiling = [1] * (t.shape.ndims + 1)
  tiling[1] = multiplier
  tiled = tf.tile(tf.expand_dims(t, 1), tiling)
  tiled = tf.reshape(tiled, tf.concat(
      ([tf.shape(t)[0] * multiplier], tf.shape(t)[1:]), 0))
  static_batch = None if t.shape[0] is None else t.shape[0] * multiplier
  tiled.set_shape(tf.TensorShape([static_batch]).concatenate(t.shape[1:]))
  return tiled


def tile_batch(t: Any, multiplier: int, name: str = None) -> Any:
  """Repeats each batch entry `multiplier` times, entries kept together.

  For a `[batch, ...]` tensor returns `[batch * multiplier, ...]` whose
  rows are `t[0]` x multiplier, then `t[1]` x multiplier, ...: the layout
  beam search expects of the memory and the initial state.

  Args:
    t: A tensor or a nested structure of them.
    multiplier: The number of copies.
    name: An optional name scope.

  Returns:
    The tiled structure.

  Example:

  >>> tile_batch(tf.constant([[1], [2]]), 2).numpy().ravel()
  array([1, 1, 2, 2], dtype=int32)
  """
  flat = tf.nest.flatten(t)
  with tf.name_scope(name or "tile_batch"):
    return tf.nest.map_structure(lambda t_: _tile_batch(t_, multiplier), t) \
        if flat else t
