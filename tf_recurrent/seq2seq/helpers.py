"""`tile_batch`: repeat each batch entry, for beam search's memory; and the
check that a mask pads on the right."""

from typing import Any

import tensorflow as tf

from tf_recurrent.op import unconverted


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


@unconverted.entry_point
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


def check_sequence_is_right_padded(mask: Any, time_major: bool) -> tf.Operation:
  """An assertion that each row of a `[batch, time]` (`[time, batch]` if
  `time_major`) bool mask is True, then False: right padded.

  Example:

  >>> check = check_sequence_is_right_padded(
  ...     tf.constant([[True, True, False], [True, False, False]]), False)
  """
  if time_major:
    mask = tf.transpose(mask)
  lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
  right_padded = tf.sequence_mask(lengths, maxlen=tf.shape(mask)[1],
                                  dtype=tf.bool)
  return tf.debugging.Assert(tf.reduce_all(tf.equal(mask, right_padded)),
                             ["The input sequence should be right padded."])
