"""Bidirectional runs: a forward pass and a pass over the reversed inputs.

The backward direction reads each example's first `sequence_length[b]` steps
in reverse order (padding stays at the end, as `tf.reverse_sequence` does),
and its per-step states are reversed back, so row t of both directions
belongs to input step t.
"""

from typing import Any, Optional, Tuple

import tensorflow as tf

from tf_recurrent.op import op
from tf_recurrent.op import structs
from tf_recurrent.op import unconverted


def reverse_time(struct: Any, lengths: Optional[tf.Tensor]) -> Any:
  """Reverses every `[T, B, ...]` leaf along T, within each example's length."""
  def reverse(x):
    if x is None:  # A state leaf not accumulated.
      return None
    if lengths is None:
      return tf.reverse(x, [0])
    return tf.reverse_sequence(x, tf.cast(lengths, tf.int64), seq_axis=0,
                               batch_axis=1)

  return tf.nest.map_structure(reverse, struct)


@unconverted.entry_point
def bidirectional(theta_fw: Any,
                  theta_bw: Any,
                  state0_fw: Any,
                  state0_bw: Any,
                  inputs: Any,
                  cell_fn_fw: op.CellFn,
                  cell_fn_bw: op.CellFn,
                  cell_grad_fw: Optional[op.CellGrad] = None,
                  cell_grad_bw: Optional[op.CellGrad] = None,
                  *,
                  sequence_length: Any = None,
                  time_major: bool = True,
                  **kwargs) -> Tuple[Tuple[Any, Any], Tuple[Any, Any]]:
  """Runs `recurrent` forwards and over the reversed inputs.

  Like `tf.compat.v1.nn.bidirectional_dynamic_rnn`, for the op's cells.

  Args:
    theta_fw: Weights of the forward direction.
    theta_bw: Weights of the backward direction.
    state0_fw: Initial state of the forward direction.
    state0_bw: Initial state of the backward direction.
    inputs: Structure of `[T, B, ...]` tensors (`[B, T, ...]` when not
      `time_major`).
    cell_fn_fw: The forward direction's `cell_fn`.
    cell_fn_bw: The backward direction's `cell_fn` (may be the same function).
    cell_grad_fw: Optional `cell_grad` of the forward direction.
    cell_grad_bw: Optional `cell_grad` of the backward direction.
    sequence_length: Optional `[B]` lengths; the backward direction starts at
      each example's last valid step.
    time_major: Whether inputs (and the returned states) are time-major.
    **kwargs: Passed to both `recurrent` calls (`checkpoint_every`,
      `accumulate_state`, `use_tpu`, `seed`, ...).

  Returns:
    `((acc_fw, acc_bw), (final_fw, final_bw))`. `acc_bw` is in input order:
    its row t is the backward direction's state after reading input step t.

  Raises:
    ValueError: As `recurrent` does, for either direction.

  Example:

  >>> import tf_recurrent
  >>> def add(theta, state, x):
  ...   return state + x, []
  >>> (fw, bw), _ = tf_recurrent.bidirectional(
  ...     (), (), tf.zeros([1, 1]), tf.zeros([1, 1]),
  ...     tf.constant([[[1.0]], [[2.0]], [[3.0]]]), add, add,
  ...     sequence_length=[2])
  >>> fw[:, 0, 0].numpy().tolist(), bw[:, 0, 0].numpy().tolist()
  ([1.0, 3.0, 0.0], [3.0, 2.0, 0.0])
  """
  for name in ("max_input_length", "stop_fn"):
    if kwargs.get(name) is not None:
      raise ValueError(
          f"bidirectional does not take {name}: the backward direction "
          "starts at the end of each sequence; pass sequence_length.")
  inputs = structs.to_tensors(inputs, "inputs")
  if not time_major:
    inputs = structs.swap_batch_and_time(inputs, "inputs")
  lengths = None
  if sequence_length is not None:
    lengths = tf.convert_to_tensor(sequence_length)
  acc_fw, final_fw = op.recurrent(
      theta_fw, state0_fw, inputs, cell_fn_fw, cell_grad_fw,
      sequence_length=lengths, time_major=True, **kwargs)
  acc_bw, final_bw = op.recurrent(
      theta_bw, state0_bw, reverse_time(inputs, lengths), cell_fn_bw,
      cell_grad_bw, sequence_length=lengths, time_major=True, **kwargs)
  if acc_bw is not None:
    acc_bw = reverse_time(acc_bw, lengths)
  if not time_major:
    acc_fw, acc_bw = (
        None if acc is None else structs.swap_batch_and_time(acc, name)
        for acc, name in ((acc_fw, "acc_fw"), (acc_bw, "acc_bw")))
  return (acc_fw, acc_bw), (final_fw, final_bw)
