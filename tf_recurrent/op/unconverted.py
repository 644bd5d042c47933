"""Our code is never converted by AutoGraph, and our errors reach the user as
they were raised, in every mode; the user's callables are converted where
their caller's code is.

Inside a `tf.function` AutoGraph converts the functions the user's code
calls, and the functions they call: ours too, unless told otherwise. Our
Python control flow is static (it decides how to build, never on a tensor),
so converting it only costs tracing time. And an error passing up through
converted code (ours, or the user's that called us) is rebuilt: its message
prefixed with AutoGraph's traceback, and a type AutoGraph cannot rebuild (a
`ValueError` subclass such as `UnrecomputableStepError`) turned into its
`StagingError`, so a user's `except ValueError` stopped working when the
code moved into a `tf.function`.

One mechanism, three parts:

* on import, AutoGraph's conversion rules treat `tf_recurrent` as they treat
  `tensorflow` and `keras`: its functions, methods and objects are called,
  never converted;
* `errors_as_raised` (the public functions, through `entry_point`, and the
  Keras layers', cells' and losses' `__call__`, through `EntryPoint`) marks
  an error leaving our code so that AutoGraph passes it through as raised:
  the same type and message eagerly, in a `tf.function` and under XLA;
* `like_caller(fn)` converts a callable of the user's (a `cell_fn`, a
  `loop_fn`, an RNNCell object) as the code calling us is converted, so a
  user's Python `if` or `for` on tensors keeps working inside a
  `tf.function` as it did while AutoGraph converted our code and, through
  it, theirs.
"""

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator, List, TypeVar

import tensorflow as tf
from tensorflow.python.autograph.core import config as autograph_config  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.autograph.core import config_lib as autograph_rules  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.autograph.core import converter  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.autograph.impl import api as autograph_api  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.autograph.impl import conversion  # pylint: disable=g-direct-tensorflow-import

_PACKAGE = __name__.split(".", maxsplit=1)[0]

Function = TypeVar("Function", bound=Callable[..., Any])


def _register() -> None:
  """Puts the package among the modules AutoGraph calls unconverted (once;
  first, before rules for parents of it)."""
  rules = autograph_config.CONVERSION_RULES
  if any(isinstance(rule, autograph_rules.DoNotConvert) and
         rule.matches(_PACKAGE) for rule in rules):
    return
  autograph_config.CONVERSION_RULES = (
      (autograph_rules.DoNotConvert(_PACKAGE),) + tuple(rules))


_register()


@contextlib.contextmanager
def errors_as_raised() -> Iterator[None]:
  """An error leaving the block passes through AutoGraph as raised.

  An error already rebuilt by AutoGraph (raised in the user's converted
  code) is left to it.

  Example:

  >>> @tf.function
  ... def f():
  ...   with errors_as_raised():
  ...     raise ValueError("as raised")
  >>> try:
  ...   f()
  ... except ValueError as e:
  ...   print(e)
  as raised
  """
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    if not hasattr(e, "ag_error_metadata"):
      try:
        e.ag_pass_through = True
      except AttributeError:  # An error without a __dict__: left as it is.
        pass
    raise


# The AutoGraph status of the code that called into the package: a stack of
# the statuses our entry points were called with, the outermost first.
_callers = threading.local()


def _caller_stack() -> List[Any]:
  if not hasattr(_callers, "stack"):
    _callers.stack = []
  return _callers.stack


def entry_point(function: Function) -> Function:
  """`function`, a public function of ours: its errors `errors_as_raised`,
  and the AutoGraph status it was called with kept for `like_caller`.

  Example:

  >>> @entry_point
  ... def double(x):
  ...   return 2 * x
  >>> int(tf.function(double)(tf.constant(3)))
  6
  """

  @functools.wraps(function)
  def wrapper(*args, **kwargs):
    stack = _caller_stack()
    stack.append(tf.__internal__.autograph.control_status_ctx())
    try:
      with errors_as_raised():
        return function(*args, **kwargs)
    finally:
      stack.pop()

  return wrapper  # type: ignore[return-value]


class EntryPoint:
  """A base of our Keras layers, cells and losses: an error leaving a call
  of one passes through AutoGraph as raised (Keras's own message, naming
  the layer and its arguments, included)."""

  def __call__(self, *args, **kwargs):
    with errors_as_raised():
      return super().__call__(*args, **kwargs)  # pytype: disable=attribute-error


def like_caller(fn: Any) -> Any:
  """`fn` (a user's callable we call) under AutoGraph where the code that
  called into the package (the outermost `entry_point`) is converted (a
  default `tf.function`), else `fn` itself. (Inside our own traces,
  `autograph=False`, AutoGraph's current status says disabled.)

  Our own functions and TensorFlow's or Keras's stay unconverted either way
  (AutoGraph's rules); a Keras layer converts its `call` as Keras does.

  Example (called eagerly, nothing is converted; see test_unconverted.py):

  >>> def double(x):
  ...   return 2 * x
  >>> like_caller(double) is double
  True
  """
  if fn is None or conversion.is_allowlisted(fn):
    return fn
  stack = _caller_stack()
  caller = (stack[0] if stack else
            tf.__internal__.autograph.control_status_ctx())
  if getattr(caller.status, "name", "") != "ENABLED":
    return fn
  # A callable the user's converted code defined (a lambda, a nested def)
  # is converted already, and calls what it calls through AutoGraph as the
  # status at that moment says: inside our traces (autograph=False) it
  # says disabled, so the caller's status is restored around the call.
  # (Not `tf_convert`, whose wrapper rebuilds the user's errors once more
  # on their way out: a type it rebuilt could not be rebuilt again.)
  # With the caller's optional features: a default tf.function uses none
  # (ConversionOptions' own default, all of them, turns an empty list
  # literal into a TensorList, which XLA cannot compile).
  callers_options = getattr(caller, "options", None)
  options = converter.ConversionOptions(
      recursive=True, user_requested=False,
      optional_features=getattr(callers_options, "optional_features", None))

  def in_callers_status(*args, **kwargs):
    with caller:
      return autograph_api.converted_call(fn, args, kwargs, options=options)

  return in_callers_status
