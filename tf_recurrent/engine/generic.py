"""Any Keras cell on the op: its call is the cell_fn, recomputed per step.

The engine's loop for a cell the chunked loops do not run (another
activation, a user's cell, `StackedRNNCells`, nested inputs): the cell's
own call on `tf_recurrent.recurrent`, which recomputes and differentiates
each step in the backward pass and gives the cell's weights gradients
through the op's captured-variable support.
"""

from typing import Any, List, Optional, Sequence, Tuple, Union

import keras
import tensorflow as tf

from tf_recurrent.op import masks
from tf_recurrent.op import op


class DropoutMasks:
  """Pins the dropout masks Keras drew before the loop, for every later call.

  `keras.layers.RNN.call` draws each cell's dropout masks once per sequence
  and clears them after the loop. The gradient recomputes steps later, after
  the clearing; re-installing the very same mask tensors around each cell
  call makes the recompute see the forward pass's masks instead of drawing
  new ones.
  """

  _ATTRS = ("_dropout_mask", "_recurrent_dropout_mask")

  def __init__(self, cell):
    cells_ = list(getattr(cell, "cells", [])) + [cell]
    self._saved = [(c, attr, getattr(c, attr)) for c in cells_
                   for attr in self._ATTRS if getattr(c, attr, None) is not None]
    self._previous = []

  def __enter__(self):
    self._previous = [(c, attr, getattr(c, attr)) for c, attr, _ in self._saved]
    for c, attr, mask in self._saved:
      setattr(c, attr, mask)

  def __exit__(self, *exc):
    for c, attr, value in self._previous:
      setattr(c, attr, value)


def _takes_training(cell) -> bool:
  """Whether the cell's call takes Keras's `training` argument."""
  return isinstance(cell, keras.layers.Layer) and getattr(
      cell, "_call_has_training_arg", False)


def run(cell, x: Any, initial_state: Sequence[tf.Tensor],
        mask: Optional[tf.Tensor], training: Any, zero_output_for_mask: bool,
        xla_steps: Union[str, bool] = "auto"
        ) -> Tuple[Any, List[tf.Tensor], tf.Tensor]:
  """Runs a Keras cell over time-major inputs on `tf_recurrent.recurrent`.

  Args:
    cell: A Keras cell (`state_size`, `call(inputs, states)`).
    x: `[T, B, ...]` inputs, or a structure of them.
    initial_state: The state list.
    mask: A `[T, B]` bool mask, or None.
    training: Keras's training flag, given to a cell that takes it.
    zero_output_for_mask: Whether a masked step emits zeros (else the
      previous output).
    xla_steps: The op's `xla_steps`.

  Returns:
    (outputs `[T, B, ...]`, final states, last output).
  """
  kwargs = {"training": training} if _takes_training(cell) else {}
  batch = tf.shape(tf.nest.flatten(initial_state)[0])[0]
  output_size = getattr(cell, "output_size", None)
  if isinstance(output_size, int) and output_size > 0:
    zero_output = tf.zeros([batch, output_size], cell.compute_dtype)
  else:
    zero_output = tf.zeros_like(tf.nest.flatten(initial_state)[0])
  pin_masks = DropoutMasks(cell)

  def cell_fn(theta, state, inputs_t):
    del theta
    with pin_masks:
      output, new_states = cell(inputs_t["x"], state["cell"], **kwargs)
    if not tf.nest.is_nested(new_states):
      new_states = [new_states]
    new_states = tf.nest.pack_sequence_as(state["cell"],
                                          tf.nest.flatten(new_states))
    if "mask" in inputs_t:
      keep = inputs_t["mask"]
      fallback = (tf.zeros_like(output) if zero_output_for_mask
                  else state["output"])
      output = masks.select(keep, output, fallback)
      new_states = masks.select_structure(keep, new_states, state["cell"])
    return {"cell": new_states, "output": output}, []

  inputs = {"x": x}
  if mask is not None:
    inputs["mask"] = mask
  state0 = {"cell": list(initial_state), "output": zero_output}
  # Only the outputs are read per step; the cell states' rows get no
  # gradient tensor (see recurrent's accumulate_state).
  per_step = {"cell": tf.nest.map_structure(lambda _: False, state0["cell"]),
              "output": True}
  acc, final = op.recurrent({}, state0, inputs, cell_fn,
                            accumulate_state=per_step, xla_steps=xla_steps)
  return acc["output"], list(final["cell"]), final["output"]
