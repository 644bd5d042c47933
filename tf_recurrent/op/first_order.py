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

import contextlib
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf
from tensorflow.python import pywrap_tfe  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import handle_data_util  # pylint: disable=g-direct-tensorflow-import

from tf_recurrent.op import structs

SECOND_ORDER_MESSAGE = (
    "{what} has a hand-written first-order gradient, which has no gradient "
    "of its own: a second-order gradient (a gradient of a gradient, a "
    "Hessian) through it is not available. {remedy}")


def _nan_like(t: Any) -> tf.Tensor:
  return tf.fill(tf.shape(t), tf.constant(float("nan"), t.dtype))


def _zero_weighted(t: tf.Tensor) -> tf.Tensor:
  """A float32 scalar, zero, through which a gradient reaches all of `t`
  (a complex one through its real part)."""
  total = tf.reduce_sum(t)
  if total.dtype.is_complex:
    total = tf.math.real(total)
  return tf.cast(total, tf.float32) * 0.0


def _element_dtype(variant: tf.Tensor) -> tf.DType:
  """The element dtype of a TensorList variant (a TensorArray's), from the
  handle data TensorFlow keeps beside it; float32 where it has none."""
  data = handle_data_util.get_resource_handle_data(variant)
  if data is not None and data.is_set and data.shape_and_type:
    return tf.as_dtype(data.shape_and_type[0].dtype)
  return tf.float32


def _readable_here(t: tf.Tensor) -> bool:
  """Whether the graph being built (or one it is nested in) holds `t`."""
  graph = tf.compat.v1.get_default_graph()
  while graph is not None:
    if getattr(t, "graph", None) is graph:
      return True
    graph = getattr(graph, "outer_graph", None)
  return False


def _nan_list(variant: tf.Tensor, element_dtype: tf.DType) -> tf.Tensor:
  """A TensorList gradient for `variant` (a TensorArray's) that brings a
  NaN to whatever was written into it: a list like it, its elements NaN.
  Built in another function's graph, which cannot read `variant`, an empty
  list of unknown size instead, which no gradient reading it can use (an
  error when run)."""
  if not _readable_here(variant):
    return tf.raw_ops.EmptyTensorList(
        element_shape=tf.constant(-1), max_num_elements=tf.constant(-1),
        element_dtype=element_dtype)
  rows = tf.raw_ops.TensorListStack(input_handle=variant,
                                    element_shape=tf.constant(-1),
                                    element_dtype=element_dtype)
  return tf.raw_ops.TensorListFromTensor(
      tensor=rows * tf.constant(float("nan"), element_dtype),
      element_shape=tf.shape(rows)[1:])


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
  """No tape records what runs inside (a custom gradient's own computation,
  which it records as one operation).

  Under a tape that may differentiate twice (a persistent tape, or one
  inside another), TensorFlow readies every `tf.while_loop` whose inputs it
  watches for a gradient of its own, accumulating each step's intermediates
  (a variable read in the step suffices): the memory the hand-written
  gradient saves, and under XLA a loop it cannot compile ("requires a fixed
  tensor list size").

  The user's code run inside (a cell, its `cell_grad`) runs `recorded()`.

  Example:

  >>> x = tf.constant(2.0)
  >>> with tf.GradientTape() as tape:
  ...   tape.watch(x)
  ...   with unrecorded():
  ...     y = x * x
  >>> print(tape.gradient(y, x))
  None
  """
  with record.stop_recording():
    yield


@contextlib.contextmanager
def recorded() -> Iterator[None]:
  """Inside `unrecorded()`, the tapes record again: the user's code (a cell,
  its `cell_grad`) runs as it would anywhere, a tape it makes recording
  (while recording is stopped, a new tape records nothing either). The
  loop around it is still made unrecorded, which is what matters.

  Example:

  >>> x = tf.constant(2.0)
  >>> with unrecorded(), recorded():
  ...   with tf.GradientTape() as tape:
  ...     tape.watch(x)
  ...     y = x * x
  ...   print(float(tape.gradient(y, x)))
  4.0
  """
  if not pywrap_tfe.TFE_Py_TapeSetIsStopped():
    yield
    return
  pywrap_tfe.TFE_Py_TapeSetRestartOnThread()
  try:
    yield
  finally:
    pywrap_tfe.TFE_Py_TapeSetStopOnThread()


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
      of them as NaN (and fails first where assertions run): every float
      and complex one, and a TensorArray's variant (its gradient a list of
      NaN rows like it). Not the forward
      pass's outputs: TensorFlow would then differentiate the forward loop
      that made them.
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
  watched = [t for t in tf.nest.flatten(watch) if t is not None]
  # One scalar that every float or complex watched tensor feeds (with zero
  # weight): the result's gradient goes to it, so a NaN there reaches all
  # of them. A variant (a TensorArray read in the step) is an input itself.
  anchor = tf.add_n([tf.constant(0.0)] + [
      _zero_weighted(t) for t in watched
      if structs.is_differentiable(t.dtype)])
  lists = [t for t in watched if t.dtype == tf.variant]
  list_dtypes = [_element_dtype(t) for t in lists]
  results = []  # The result's structure, None leaves included.

  @tf.custom_gradient
  def call(anchor, *variants):
    del anchor, variants  # Only handles for the gradient below.
    result = gradient(*cut)
    results.append(result)

    def second_order(*unused_upstream, variables=None):
      # TensorFlow may build this while recording the first order; it must
      # build, and fail only when run. It reads no tensor of the forward
      # pass's graph (this may be built in another function's graph) but
      # the TensorArrays' where it can, whose NaN copies need their sizes.
      check = tf.debugging.Assert(False, [message])
      with tf.control_dependencies([check]):
        nan = tf.constant(float("nan"))
        inputs = [nan] + [_nan_list(t, d) for t, d in zip(lists,
                                                          list_dtypes)]
        if variables is None:
          return inputs
        return inputs, [_nan_like(v) for v in variables]

    # A custom gradient's results are tensors: None (no gradient) stays out.
    return ([t for t in tf.nest.flatten(result) if t is not None],
            second_order)

  computed = iter(call(anchor, *lists))
  return tf.nest.pack_sequence_as(
      results[0], [None if t is None else next(computed)
                   for t in tf.nest.flatten(results[0])])
