"""Hand-written gradients are first order: a gradient of them raises.

The chunked loops' backward pass is a hand-written loop that writes rows in
place (an op with no gradient). Under a persistent tape or a tape inside
another, TensorFlow records that loop to differentiate it and fails deep in
its machinery. `first_order_only` runs such a gradient
where no tape can see into it, and gives its result a gradient that raises
`NotImplementedError` with the cause and the remedy when a second order is
asked for. (Inside a `tf.function`, such a tape still fails: TensorFlow
differentiates the loops' nested functions while it records the first
order.)
"""

from typing import Any, Callable

import tensorflow as tf

SECOND_ORDER_MESSAGE = (
    "{what} has a hand-written first-order gradient, which has no gradient "
    "of its own: a second-order gradient (a gradient of a gradient, a "
    "Hessian) through it is not available. {remedy}")


def first_order_only(gradient: Callable[..., Any], *args: Any,
                     what: str, remedy: str) -> Any:
  """`gradient(*args)`, differentiable no further.

  Args:
    gradient: Computes a custom gradient's result from `args`.
    *args: Structures of tensors (None leaves allowed) `gradient` reads;
      everything it reads from the graph of the forward pass must be here.
    what: The computation, for the error (e.g. "tf_recurrent.recurrent").
    remedy: What to use for a second order instead.

  Returns:
    What `gradient` returned (a structure of tensors), whose gradient raises
    `NotImplementedError`.

  Example:

  >>> x = tf.constant(2.0)
  >>> with tf.GradientTape() as outer:
  ...   outer.watch(x)
  ...   dx = first_order_only(lambda x: 3.0 * x * x, x, what="f",
  ...                         remedy="Use g.")
  >>> float(dx)
  12.0
  >>> try:
  ...   outer.gradient(dx, x)
  ... except NotImplementedError as e:
  ...   print("has no gradient of its own" in str(e))
  True
  """
  flat = tf.nest.flatten(args)
  present = [i for i, t in enumerate(flat) if t is not None]
  message = SECOND_ORDER_MESSAGE.format(what=what, remedy=remedy)
  result_leaves = []  # The result's flat leaves, None where a gradient is.

  @tf.custom_gradient
  def call(*tensors):
    leaves = list(flat)
    for i, t in zip(present, tensors):
      leaves[i] = tf.stop_gradient(t)
    result = gradient(*tf.nest.pack_sequence_as(args, leaves))
    result_leaves.append(result)

    def second_order(*unused_upstream, variables=None):
      del variables  # The gradient may read the cell's variables.
      raise NotImplementedError(message)

    # A custom gradient's results are tensors: None (no gradient) stays out.
    return ([t for t in tf.nest.flatten(result) if t is not None],
            second_order)

  computed = iter(call(*[flat[i] for i in present]))
  return tf.nest.pack_sequence_as(
      result_leaves[0], [None if t is None else next(computed)
                         for t in tf.nest.flatten(result_leaves[0])])
