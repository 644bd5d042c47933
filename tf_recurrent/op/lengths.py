"""Per-example sequence lengths: checks, and the per-step batch mask.

With `sequence_length`, example b runs steps `t < sequence_length[b]`; past
its length its state is carried through unchanged and its accumulator rows
are zeros, as in `tf.nn.dynamic_rnn`. Everything here works on one step: a
`[B]` bool mask, applied to each leaf's batch axis by `masks.py`.
"""

from typing import Any, List, Optional

import numpy as np
import tensorflow as tf

from tf_recurrent.op import structs


def check_sequence_length(sequence_length: Any, state0: Any, inputs: Any,
                          static_length: Optional[int]) -> tf.Tensor:
  """Validates `sequence_length` against the batch axes of state and inputs.

  Args:
    sequence_length: `[B]` integer lengths (tensor, array or list).
    state0: Structure of `[B, ...]` tensors.
    inputs: Structure of time-major `[T, B, ...]` tensors.
    static_length: T when known statically, else None.

  Returns:
    The lengths as an int32 tensor.

  Raises:
    ValueError: If the lengths are not a rank-1 integer vector, a state or
      input leaf has no batch axis of that size, or a known length is
      negative or longer than T.
  """
  lengths = tf.convert_to_tensor(sequence_length)
  if not lengths.dtype.is_integer or lengths.shape.rank != 1:
    raise ValueError(
        "sequence_length must be a [batch] vector of integers; got "
        f"{structs.describe(lengths)}.")
  batch = lengths.shape[0]
  for root, struct, axis in (("state0", state0, 0), ("inputs", inputs, 1)):
    for path, leaf in zip(structs.leaf_paths(struct, root),
                          tf.nest.flatten(struct)):
      want = "[batch, ...]" if axis == 0 else "[T, batch, ...]"
      if leaf.shape.rank is not None and leaf.shape.rank <= axis:
        raise ValueError(
            f"With sequence_length, {path} must have shape {want}; got "
            f"{structs.describe(leaf)}.")
      size = leaf.shape[axis] if leaf.shape.rank is not None else None
      if batch is not None and size is not None and size != batch:
        raise ValueError(
            f"sequence_length has {batch} entries but {path} has batch size "
            f"{size} (shape {leaf.shape}, batch axis {axis}).")
  values = tf.get_static_value(lengths)
  if values is not None and values.size:
    if np.min(values) < 0:
      raise ValueError(
          f"sequence_length must be >= 0; got {values.tolist()}.")
    if static_length is not None and np.max(values) > static_length:
      raise ValueError(
          f"sequence_length must be <= T={static_length}; got "
          f"{values.tolist()}.")
  return tf.cast(lengths, tf.int32)


def assert_in_range(lengths: tf.Tensor, total_steps: tf.Tensor) -> List[Any]:
  """Run-time range checks for lengths only known when the graph runs.

  Returns:
    The assertion ops (None entries when run eagerly), for the caller to
    make its results depend on.
  """
  return [
      tf.debugging.assert_non_negative(
          lengths, message="sequence_length must be >= 0"),
      tf.debugging.assert_less_equal(
          lengths, total_steps,
          message="sequence_length exceeds T, the number of steps of the "
          "inputs"),
  ]


def step_mask(lengths: tf.Tensor, t) -> tf.Tensor:
  """`[B]` bools: which examples are still running at step t."""
  return tf.less(t, lengths)
