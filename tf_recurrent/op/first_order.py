"""Hand-written gradients are first order: their own gradient fails loudly.

The op's reverse loop and the chunked loops' backward pass are hand-written:
they cut each step's inputs from the graph, and the chunked ones write rows
in place (an op with no gradient). Differentiated again, TensorFlow would
return a wrong second order without a word (the op), or fail deep in its
machinery while it records the first order under a tape that may
differentiate twice, a persistent tape or one inside another (the chunked
loops: a LookupError for InplaceUpdate).

`first_order_only` runs such a gradient where no tape sees into it, and
gives its result a gradient of its own that TensorFlow can build whenever
it likes and that fails when run: `tf.errors.InvalidArgumentError` with the
cause and the remedy (eagerly, as soon as a second order is asked for), or
NaN under XLA, which drops assertions: never a finite wrong number.
"""

from typing import Any, Callable, Sequence

import tensorflow as tf

SECOND_ORDER_MESSAGE = (
    "{what} has a hand-written first-order gradient, which has no gradient "
    "of its own: a second-order gradient (a gradient of a gradient, a "
    "Hessian) through it is not available. {remedy}")


def _nan_like(t: Any) -> tf.Tensor:
  return tf.fill(tf.shape(t), tf.constant(float("nan"), t.dtype))


def saved_for_backward(structure: Any) -> Any:
  """`structure` (tensors, None leaves allowed) as the backward pass reads it.

  A tape that may differentiate twice makes TensorFlow, inside a
  `tf.function`, differentiate every intermediate the first order reads,
  back into the loop that made it, whose in-place writes have no gradient
  (a LookupError). Behind this identity their gradient is None: the second
  order still fails when run, through `first_order_only`'s `watch`.

  Example:

  >>> x = tf.constant([1.0, 2.0])
  >>> with tf.GradientTape() as tape:
  ...   tape.watch(x)
  ...   y = saved_for_backward([x * 3.0])[0]
  >>> y.numpy(), tape.gradient(y, x)
  (array([3., 6.], dtype=float32), None)
  """
  flat = tf.nest.flatten(structure)
  present = [t for t in flat if t is not None]
  if not present:
    return structure

  @tf.custom_gradient
  def identity(*tensors):
    return ([tf.identity(t) for t in tensors],
            lambda *upstream: [None] * len(tensors))

  copies = iter(identity(*present))
  return tf.nest.pack_sequence_as(
      structure, [None if t is None else next(copies) for t in flat])


def first_order_only(gradient: Callable[..., Any], args: Sequence[Any], *,
                     watch: Sequence[Any], what: str, remedy: str) -> Any:
  """`gradient(*args)`, whose own gradient fails when run.

  Args:
    gradient: Computes a custom gradient's result (a structure of tensors,
      None leaves allowed) from `args`.
    args: Structures of tensors (None leaves allowed) `gradient` reads; they
      reach it cut from every tape.
    watch: Tensors (structures, None leaves allowed) through which every
      second order would reach the sources: the forward pass's inputs and
      the upstream gradient. A second order through the result reaches each
      of them as NaN (and fails first where assertions run). Not the
      forward pass's outputs: TensorFlow would then differentiate the
      forward loop that made them.
    what: The computation, for the error (e.g. "tf_recurrent.recurrent").
    remedy: What to use for a second order instead.

  Returns:
    What `gradient` returned.

  Example:

  >>> x = tf.constant(2.0)
  >>> with tf.GradientTape() as outer:
  ...   outer.watch(x)
  ...   dx = first_order_only(lambda x: 3.0 * x * x, [x], watch=[x],
  ...                         what="f", remedy="Use g.")
  >>> float(dx)
  12.0
  >>> try:
  ...   outer.gradient(dx, x)
  ... except tf.errors.InvalidArgumentError as e:
  ...   print("f has a hand-written first-order gradient" in e.message)
  True
  """
  message = SECOND_ORDER_MESSAGE.format(what=what, remedy=remedy)
  cut = tf.nest.map_structure(
      lambda t: t if t is None else tf.stop_gradient(t), list(args))
  watched = [t for t in tf.nest.flatten(watch)
             if t is not None and t.dtype.is_floating]
  # One scalar that every watched tensor feeds (with zero weight): the
  # result's gradient goes to it, so a NaN there reaches all of them.
  anchor = tf.add_n([tf.constant(0.0)] + [
      tf.cast(tf.reduce_sum(t), tf.float32) * 0.0 for t in watched])
  results = []  # The result's structure, None leaves included.

  @tf.custom_gradient
  def call(anchor):
    del anchor  # Only a handle for the gradient below.
    result = gradient(*cut)
    results.append(result)

    def second_order(*unused_upstream, variables=None):
      # TensorFlow may build this while recording the first order; it must
      # build, and fail only when run. It reads no tensor of the forward
      # pass's graph (this may be built in another function's graph).
      check = tf.debugging.Assert(False, [message])
      with tf.control_dependencies([check]):
        nan = tf.constant(float("nan"))
        if variables is None:
          return nan
        return nan, [_nan_like(v) for v in variables]

    # A custom gradient's results are tensors: None (no gradient) stays out.
    return ([t for t in tf.nest.flatten(result) if t is not None],
            second_order)

  computed = iter(call(anchor))
  return tf.nest.pack_sequence_as(
      results[0], [None if t is None else next(computed)
                   for t in tf.nest.flatten(results[0])])
