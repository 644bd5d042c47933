"""`gather_tree`: beam search's back-tracking, in plain TensorFlow ops.

TF Addons ran it as a compiled custom kernel (`Addons>GatherTree`,
`custom_ops/seq2seq/cc/kernels/beam_search_ops.cc`). Here it is a
`tf.while_loop` back over time, following the parent ids, then one gather
of the ids: no custom op to build or load, and it compiles under XLA
(`tf.function(jit_compile=True)`) with the rest of a beam search.

The kernel's semantics, per batch entry `b` and beam `k`, with
`length = min(max_sequence_lengths[b], max_time)`:

- steps at or past `length` hold `end_token` (a `length <= 0` gives a
  beam of `end_token` only);
- the last step, `length - 1`, holds `step_ids[length - 1, b, k]`; each
  step before it holds the id of the beam the following step's parent id
  points to;
- after the first `end_token` of a beam every step holds `end_token`
  (only inputs a `BeamSearchDecoder` never gives need it).

A parent id that is followed and is not in `[0, beam_width)` raises
`InvalidArgumentError` (the CPU kernel's "Saw invalid parent id"). Under
XLA, which cannot raise, the result is the GPU kernel's: `-1` from that
step back to step 0, and no `end_token` filling for that beam. (The
kernels accept a parent id equal to `beam_width` and read past the beam;
here it is out of range, as in Addons' Python fallback.)
"""

from typing import Any

import tensorflow as tf

from tf_recurrent.op import unconverted
from tf_recurrent.seq2seq import decoder


def _check_shapes(step_ids, parent_ids, max_sequence_lengths, end_token):
  if step_ids.shape.rank is not None and step_ids.shape.rank != 3:
    raise ValueError("gather_tree: step_ids must be a 3-tensor "
                     f"[max_time, batch_size, beam_width], saw shape "
                     f"{step_ids.shape}.")
  if not step_ids.shape.is_compatible_with(parent_ids.shape):
    raise ValueError("gather_tree: step_ids.shape must match "
                     f"parent_ids.shape, but shapes are {step_ids.shape} and "
                     f"{parent_ids.shape}.")
  if (max_sequence_lengths.shape.rank is not None and
      max_sequence_lengths.shape.rank != 1):
    raise ValueError("gather_tree: max_sequence_lengths must be a vector "
                     "[batch_size], saw shape "
                     f"{max_sequence_lengths.shape}.")
  if end_token.shape.rank is not None and end_token.shape.rank != 0:
    raise ValueError("gather_tree: end_token must be a scalar, saw shape "
                     f"{end_token.shape}.")
  batch = tf.TensorShape(step_ids.shape[1:2]).merge_with(parent_ids.shape[1:2])
  if not batch.is_compatible_with(max_sequence_lengths.shape):
    raise ValueError("gather_tree: the batch size dimensions "
                     "step_ids.shape[1] and max_sequence_lengths.shape[0] "
                     f"must match, but shapes are {step_ids.shape} and "
                     f"{max_sequence_lengths.shape}.")


def _check_parents(ids, index, invalid, found_bad, dims):
  """Raises InvalidArgumentError naming an invalid parent id followed and
  where: the last in (time, batch, beam) order, where its beam's walk back
  met it (the steps before hold -1). Static shapes: no tf.where(invalid)."""
  flat = tf.range(tf.size(invalid))
  last = tf.reduce_max(tf.where(tf.reshape(invalid, [-1]), flat, -1))
  bad_id = tf.reduce_sum(tf.where(tf.equal(flat, last),
                                  tf.reshape(index, [-1]), 0))
  _, batch_size, beam_width = dims
  where = tf.stack([last // (batch_size * beam_width),
                    last // beam_width % batch_size, last % beam_width])
  if tf.executing_eagerly():
    if bool(tf.reduce_any(found_bad)):
      raise tf.errors.InvalidArgumentError(
          None, None,
          f"gather_tree: saw invalid parent id {int(bad_id)} at (time, "
          f"batch, beam) == {tuple(where.numpy().tolist())}; parent_ids must "
          f"be in [0, beam_width) == [0, {int(beam_width)}).")
    return ids
  check = tf.debugging.Assert(
      tf.logical_not(tf.reduce_any(found_bad)),
      ["gather_tree: saw invalid parent id", bad_id,
       "at (time, batch, beam) ==", where,
       "; parent_ids must be in [0, beam_width), beam_width ==", beam_width],
      name="check_parent_ids")
  with tf.control_dependencies([check]):
    return tf.identity(ids)


@unconverted.entry_point
def gather_tree(step_ids: Any, parent_ids: Any, max_sequence_lengths: Any,
                end_token: Any) -> tf.Tensor:
  """Calculates the full beams from the per-step ids and parent beam ids.

  For a given beam, past the time step containing the first decoded
  `end_token` all values are filled in with `end_token`.

  Args:
    step_ids: The predicted token IDs.
      An `int32` `Tensor` of shape `[max_time, batch_size, beam_width]`.
    parent_ids: The parent beam indices.
      An `int32` `Tensor` of shape `[max_time, batch_size, beam_width]`.
    max_sequence_lengths: The maximum sequence length of each batch.
      An `int32` `Tensor` of shape `[batch_size]`.
    end_token: The end token ID (a scalar).

  Returns:
    The reordered token IDs based on `parent_ids`, an `int32` `Tensor` of
    shape `[max_time, batch_size, beam_width]`.

  Raises:
    InvalidArgumentError: if `parent_ids` contains an invalid index that is
      followed (outside XLA; under XLA that beam holds -1 from there back).
    ValueError: if the shapes do not fit together.

  Example:

  >>> # max_time 3, batch 1, beam 2: beam 0 ends in beam 1's history.
  >>> step_ids = tf.constant([[[1, 2]], [[3, 4]], [[5, 6]]])
  >>> parent_ids = tf.constant([[[0, 0]], [[1, 0]], [[0, 0]]])
  >>> gather_tree(step_ids, parent_ids, [3], end_token=9)[:, 0, :].numpy()
  array([[2, 2],
         [3, 3],
         [5, 6]], dtype=int32)
  """
  with tf.name_scope("gather_tree"):
    step_ids = tf.convert_to_tensor(step_ids, dtype=tf.int32, name="step_ids")
    parent_ids = tf.convert_to_tensor(parent_ids, dtype=tf.int32,
                                      name="parent_ids")
    max_sequence_lengths = tf.convert_to_tensor(
        max_sequence_lengths, dtype=tf.int32, name="max_sequence_lengths")
    end_token = tf.convert_to_tensor(end_token, dtype=tf.int32,
                                     name="end_token")
    _check_shapes(step_ids, parent_ids, max_sequence_lengths, end_token)
    if not (step_ids.shape.is_fully_defined() and
            parent_ids.shape.is_fully_defined() and
            max_sequence_lengths.shape.is_fully_defined()):
      # Checked statically above where the shapes are known.
      shapes_agree = tf.reduce_all(tf.equal(
          tf.concat([tf.shape(step_ids), tf.shape(step_ids)[1:2]], 0),
          tf.concat([tf.shape(parent_ids), tf.shape(max_sequence_lengths)],
                    0)))
      check = tf.debugging.Assert(shapes_agree, [
          "gather_tree: step_ids.shape must match parent_ids.shape, and "
          "step_ids.shape[1] max_sequence_lengths.shape[0]; shapes are",
          tf.shape(step_ids), tf.shape(parent_ids),
          tf.shape(max_sequence_lengths)])
      with tf.control_dependencies([check]):
        step_ids = tf.identity(step_ids)
    # [max_time, batch_size, beam_width]: Python ints where known (fewer ops
    # to trace, static shapes for XLA).
    dynamic = tf.unstack(tf.shape(step_ids), num=3)
    dims = [static if static is not None else dim
            for static, dim in zip(step_ids.shape, dynamic)]
    max_time, beam_width = dims[0], dims[2]
    lengths = tf.expand_dims(
        tf.clip_by_value(max_sequence_lengths, 0, max_time), 1)
    beams = tf.broadcast_to(tf.range(beam_width), dims[1:])

    # Walk back from the last step: index[t] is the beam each beam's step t
    # comes from (-1 once a parent id was out of range).
    def back(time, index, indices):
      time -= 1
      valid = tf.logical_and(index >= 0, index < beam_width)
      parents = tf.gather(tf.gather(parent_ids, time),
                          tf.where(valid, index, 0), batch_dims=1)
      # Past a beam's length, the walk starts from the beam itself at its
      # last step.
      previous = tf.where(time < lengths, tf.where(valid, parents, -1), beams)
      return time, previous, indices.write(time, index)

    indices = tf.TensorArray(tf.int32, size=max_time,
                             element_shape=step_ids.shape[1:])
    _, _, indices = tf.while_loop(
        lambda time, *_: time > 0, back, (max_time, beams, indices),
        maximum_iterations=max_time, name="gather_tree_back")
    index = indices.stack()
    index.set_shape(step_ids.shape)
    # [max_time, batch_size, 1]: the steps before each entry's length.
    in_range = tf.reshape(tf.range(max_time), [-1, 1, 1]) < lengths
    valid = tf.logical_and(index >= 0, index < beam_width)
    ids = tf.gather(step_ids, tf.where(valid, index, 0), axis=2, batch_dims=2)
    ids = tf.where(in_range, tf.where(valid, ids, -1), end_token)
    invalid = tf.logical_and(in_range, tf.logical_not(valid))
    found_bad = tf.reduce_any(invalid, axis=0)
    if not decoder.in_xla_context():
      # XLA cannot raise (it would log that it ignores the assertion): the
      # -1s are what it returns.
      ids = _check_parents(ids, index, invalid, found_bad, dims)
    # Everything after a beam's first end_token is end_token (not for a
    # beam that met an invalid parent: the GPU kernel's -1s stay).
    ended = tf.math.cumsum(tf.cast(tf.equal(ids, end_token), tf.int32),
                           axis=0, exclusive=True) > 0
    fill = tf.logical_and(ended, tf.logical_not(found_bad))
    return tf.where(fill, end_token, ids)
