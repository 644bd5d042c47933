"""Eager calls run traced functions: one trace for every sequence length.

An eager call of the op or of a layer's loop pair runs a `tf.function`.
Traced with the shapes of the first call, it would trace again for each new
length (seconds each, and TensorFlow's retracing warning). `RelaxedFunction`
traces with the leading dimensions that vary between calls (time, and
where the caller says so the batch) left unknown, so later calls with other
lengths reuse that trace.
"""

from typing import Any, Callable, Sequence, Union

import tensorflow as tf


def _relaxed_spec(value: Any, unknown: int) -> Any:
  """`value`'s TensorSpec with its first `unknown` dimensions unknown (all
  but the last `-unknown` when negative); a Python value (None, an int)
  stays as it is: it is part of the trace key."""
  if not isinstance(value, (tf.Tensor, tf.Variable)):
    return value
  shape = value.shape
  if shape.rank is None:
    return tf.TensorSpec(None, value.dtype)
  cut = max(shape.rank + unknown, 0) if unknown < 0 else min(unknown,
                                                               shape.rank)
  return tf.TensorSpec([None] * cut + shape.as_list()[cut:], value.dtype)


class RelaxedFunction:
  """A `tf.function` traced with some leading dimensions left unknown.

  Example:

  >>> traces = []
  >>> def total(x):
  ...   traces.append(x.shape)
  ...   return tf.reduce_sum(x, 0)
  >>> fn = RelaxedFunction(total)
  >>> for length in (3, 5, 8):
  ...   _ = fn(tf.ones([length, 2]), unknown=(1,))
  >>> traces
  [TensorShape([None, 2])]
  """

  def __init__(self, python_function: Callable[..., Any], **tf_function_kwargs):
    self._function = tf.function(python_function, **tf_function_kwargs)

  @property
  def tracing_count(self) -> int:
    """How many times the function was traced."""
    return self._function.experimental_get_tracing_count()

  def __call__(self, *args, unknown: Union[int, Sequence[int]]) -> Any:
    """Calls the function on `args`.

    Args:
      *args: The positional arguments (structures of tensors, or Python
        values).
      unknown: Per argument (or one for all), how many leading dimensions of
        each of its tensors may differ between calls; -1: all but the last.

    Returns:
      What the function returns.
    """
    if isinstance(unknown, int):
      unknown = [unknown] * len(args)
    specs = [tf.nest.map_structure(lambda v, n=n: _relaxed_spec(v, n), arg)
             for arg, n in zip(args, unknown)]
    # Traces once per relaxed signature; the call below then dispatches to
    # that trace (a supertype of the call's own shapes).
    self._function.get_concrete_function(*specs)
    return self._function(*args)
