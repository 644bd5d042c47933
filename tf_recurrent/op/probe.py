"""One step of `cell_fn` traced up front, to check it before any loop runs.

Tracing one step into a scratch graph (nothing is executed, nothing is added
to the caller's graph) tells the op, in one place:

* whether `cell_fn` returns `(state1, extras)` with state1 shaped and typed
  like state0 and extras like the `extras` argument (the leaf at fault is
  named otherwise), and likewise for a custom `cell_grad`;
* the extras' shapes and dtypes, to preallocate their accumulator;
* which trainable variables and outer tensors `cell_fn` closes over (they
  need gradients too), and whether it asks for `step_seed()`;
* whether it draws from a stateful random op, which a recomputing gradient
  could not reproduce;
* called eagerly, whether the step can be traced at all: what only an eager
  step can use (an eager TensorArray read at the step's index, say) raises
  `UntraceableStepError`.
"""

import dataclasses
import hashlib
from typing import Any, Callable, List, Optional

import tensorflow as tf

from tf_recurrent.op import seeds
from tf_recurrent.op import structs

# Op types whose result depends on hidden generator state.
_STATEFUL_RANDOM_OPS = frozenset({
    "Multinomial", "ParameterizedTruncatedNormal", "TruncatedNormal",
    "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormal", "StatefulStandardNormalV2",
    "StatefulTruncatedNormal", "StatefulRandomBinomial", "RngSkip",
    "RngReadAndSkip",
})


# Op types that change variables: a recomputed step would repeat the change
# (a Keras seed generator advancing, say) and see different values.
_VARIABLE_WRITES = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceScatterUpdate", "ResourceScatterAdd",
})


# Stateful op types the traced step holds whatever the cell does.
_BOOKKEEPING = frozenset({"Placeholder", "NoOp"})


class UntraceableStepError(TypeError):
  """Called eagerly, the step uses a tensor as only an eager one can be used
  (an eager TensorArray read at the step's index, say), and the op's eager
  call traces it (its loops run as one traced function). A TypeError, as
  most tracing errors it replaces; `tf_recurrent.dynamic_rnn` and `raw_rnn`
  catch it to run such a cell or `loop_fn` eagerly, as TensorFlow does."""


def _is_eager_only(error: Exception) -> bool:
  """Whether tracing failed where the step used a tensor as only an eager
  one can be used: a symbolic tensor cannot index a Python list or an eager
  TensorArray, be a Python bool or int, give `.numpy()`, or reach an eager
  op."""
  if isinstance(error, tf.errors.OperatorNotAllowedInGraphError):
    return True
  message = str(error)
  return isinstance(error, (TypeError, AttributeError)) and (
      "SymbolicTensor" in message or '"Graph" tensor' in message)


def _describe_op(op: tf.Operation) -> str:
  """`type (name)`, with the function a call op calls."""
  called = op.node_def.attr["f"].func.name if "f" in op.node_def.attr else ""
  return f"{op.type} ({op.name}{', calls ' + called if called else ''})"


def _is_stateful_random(op_type: str) -> bool:
  if op_type.startswith("Stateless") or op_type == "RandomIndexShuffle":
    return False
  return op_type in _STATEFUL_RANDOM_OPS or op_type.startswith("Random")


@dataclasses.dataclass
class StepProbe:
  """What tracing one step of `cell_fn` revealed.

  Attributes:
    extras: Structure of `tf.TensorSpec`, the extras one step returns.
    captured: Outer floating-point tensors `cell_fn` closes over.
    variables: Trainable variables `cell_fn` reads.
    uses_step_seed: Whether `cell_fn` calls `tf_recurrent.step_seed()`.
    stateful_random_ops: Types of the stateful random ops `cell_fn` creates.
    variable_writes: Types of the ops by which `cell_fn` assigns to
      variables.
    stateful_ops: `type (name)` of every stateful op `cell_fn` runs at its
      top level (a call of a stateful nested function names the function).
    fingerprint: What the traced step computes: a digest of its graph (ops,
      attributes, constants' values, shapes and dtypes, the functions it
      calls) and the ids of every outer object it reads (tensors and
      variable handles). Two calls with equal fingerprints run the same
      computation on the same closed-over objects.
    closure: Those outer objects; holding them keeps their ids unique.
  """
  extras: Any
  captured: List[tf.Tensor]
  variables: List[tf.Variable]
  uses_step_seed: bool
  stateful_random_ops: List[str]
  variable_writes: List[str]
  stateful_ops: List[str] = dataclasses.field(default_factory=list)
  fingerprint: Any = None
  closure: List[Any] = dataclasses.field(default_factory=list)


def _spec(x: tf.Tensor) -> tf.TensorSpec:
  return tf.TensorSpec(x.shape, x.dtype)


def _check_cell_output(output: Any, state0: Any, extras: Optional[Any]):
  """Validates `cell_fn`'s return value; returns (state1, extras)."""
  if not isinstance(output, (tuple, list)) or len(output) != 2:
    raise ValueError(
        "cell_fn must return a pair (state1, extras); got "
        f"{type(output).__name__}"
        f"{' of length %d' % len(output) if isinstance(output, (tuple, list)) else ''}."
        " Return (state1, []) when there are no extras.")
  state1, step_extras = output
  structs.check_leaves_match(state0, state1, "state0",
                             "the state1 cell_fn returned")
  if extras is not None:
    structs.check_leaves_match(extras, step_extras, "extras",
                               "the extras cell_fn returned")
  not_tensors = [
      f"{path} is {leaf!r}" for path, leaf in zip(
          structs.leaf_paths(step_extras, "extras"),
          tf.nest.flatten(step_extras))
      if not (hasattr(leaf, "dtype") and hasattr(leaf, "shape"))]
  if not_tensors:
    raise ValueError(
        f"cell_fn returned extras leaves that are not tensors: "
        f"{'; '.join(not_tensors)}. Return a tensor for every "
        "extras leaf, or leave the leaf out of the structure.")
  return state1, step_extras


def _check_grad_output(output: Any, theta: Any, state0: Any, inputs_t: Any):
  """Validates a custom `cell_grad`'s return value (None leaves allowed)."""
  if not isinstance(output, (tuple, list)) or len(output) != 3:
    raise ValueError(
        "cell_grad must return a triple (dtheta, dstate0, dinputs); got "
        f"{type(output).__name__}.")
  for name, want, got in zip(("theta", "state0", "inputs"),
                             (theta, state0, inputs_t), output):
    structs.check_leaves_match(want, got, name,
                               f"the d{name} cell_grad returned",
                               allow_none=True)


def _check_stop_output(output: Any):
  """Validates `stop_fn`'s return value: one bool."""
  try:
    output = tf.convert_to_tensor(output)
  except (TypeError, ValueError) as e:
    raise ValueError(
        f"stop_fn must return a scalar bool; got {output!r}.") from e
  if output.dtype != tf.bool or output.shape.rank != 0:
    raise ValueError(
        "stop_fn must return a scalar bool (reduce a per-example condition "
        f"with tf.reduce_all); got {structs.describe(output)}.")


def settle_in_tf1_graph(cell_fn: Callable[..., Any], theta: Any,
                        state0: Any, inputs: Any) -> None:
  """In a TF1 graph (outside any function), calls `cell_fn` twice in it,
  results dropped, before `probe_step` traces it.

  TF1 code's layers (tf_keras's legacy layers: `tf.compat.v1.layers`,
  `tf.compat.v1.nn.rnn_cell`) create their variables on their first call,
  in the graph's collections, where TF1 optimizers and savers look, and
  cache the variable scope of their first call once built, with its graph,
  which every later call outside a function enters. Made in the probe's
  trace, the variables were missing from the collections, and every later
  call (the op's own one-step run, the user's) was built into the trace's
  graph, which a Session cannot run.

  Example:

  >>> with tf.Graph().as_default():
  ...   settle_in_tf1_graph(lambda theta, h, x: (h + x, []), (),
  ...                       tf.zeros([2]), tf.ones([3, 2]))
  """
  if tf.executing_eagerly() or (
      tf.compat.v1.get_default_graph().building_function):
    return

  def zeros(x):
    step = tf.zeros(tf.shape(x)[1:], x.dtype)
    step.set_shape(x.shape[1:])
    return step

  step_inputs = tf.nest.map_structure(zeros, inputs)
  for _ in range(2):  # A first call builds; the second, once built, caches.
    with seeds.seeded_step(lambda: tf.zeros([2], tf.int32), 0):
      for leaf in tf.nest.flatten(cell_fn(theta, state0, step_inputs)):
        if hasattr(leaf, "mark_used"):  # A TensorArray written and dropped.
          leaf.mark_used()


def probe_step(cell_fn: Callable[..., Any],
               cell_grad: Optional[Callable[..., Any]], theta: Any,
               state0: Any, inputs: Any, extras: Optional[Any],
               stop_fn: Optional[Callable[..., Any]] = None) -> StepProbe:
  """Traces one step of `cell_fn` (and `cell_grad`, `stop_fn`) up front.

  Args:
    cell_fn: The user's step function.
    cell_grad: The user's gradient function, or None.
    theta: Structure of tensors.
    state0: Structure of tensors.
    inputs: Structure of time-major tensors `[T, ...]`.
    extras: The `extras` argument (structure of tensors) or None.
    stop_fn: The user's early-stop predicate, or None.

  Returns:
    A `StepProbe`.

  Raises:
    ValueError: If `cell_fn` or `cell_grad` return values unlike the
      arguments they mirror, naming the leaf at fault, or `stop_fn` returns
      anything but a scalar bool.
    UntraceableStepError: Called eagerly, if tracing the step fails where it
      uses a tensor as only an eager one can be used.
  """
  specs = tf.nest.map_structure(_spec, (theta, state0))
  input_specs = tf.nest.map_structure(
      lambda x: tf.TensorSpec(x.shape[1:], x.dtype), inputs)
  seed_used = []

  def one_step(theta_, state0_, inputs_t):
    # Not at the graph's root scope, where a name with a leading underscore
    # (a Keras cell class `_MyCell`'s layer name) is invalid.
    with tf.name_scope("step"):
      return checked_step(theta_, state0_, inputs_t)

  def checked_step(theta_, state0_, inputs_t):
    if stop_fn is not None:
      _check_stop_output(stop_fn(tf.constant(0), theta_, state0_))
    with seeds.seeded_step(lambda: tf.zeros([2], tf.int32), 0) as frame:
      state1, step_extras = _check_cell_output(
          cell_fn(theta_, state0_, inputs_t), state0_, extras)
    seed_used.append(frame.used)
    if cell_grad is not None:
      dstate1 = tf.nest.map_structure(tf.zeros_like, state1)
      _check_grad_output(
          cell_grad(theta_, state0_, inputs_t, step_extras, dstate1),
          theta_, state0_, inputs_t)
    return step_extras

  eager = tf.executing_eagerly()
  try:
    traced = tf.function(one_step, autograph=False).get_concrete_function(
        specs[0], specs[1], input_specs)
  except (TypeError, AttributeError) as e:
    if not eager or not _is_eager_only(e):
      raise
    raise UntraceableStepError(
        "The step (cell_fn, stop_fn, cell_grad) uses a tensor as only an "
        "eager one can be used, and the op traces its step even when called "
        f"eagerly (its loops run as one tf.function): {type(e).__name__}: "
        f"{e}\nAn eager TensorArray or a Python list indexed by a tensor of "
        "the step, a tensor used as a Python bool or int, or `.numpy()`, "
        "runs only eagerly. Pass such values through `inputs` or `theta` (a "
        "TensorArray's stacked tensor), use tf.cond or tf.gather, or call "
        "the op inside a tf.function, where they are graph values.") from e
  step_extras = tf.nest.map_structure(
      _spec, traced.structured_outputs)
  if extras is not None:
    step_extras = tf.nest.map_structure(_spec, extras)

  graph = traced.graph
  graph_def = graph.as_graph_def()
  op_types = [(op.type, op.name) for op in graph.get_operations()]
  for fdef in graph_def.library.function:
    op_types += [(node.op, node.name) for node in fdef.node_def]
  # Op types, not names: a name holds the scopes of the trace (AutoGraph's
  # of a converted cell_fn among them), and errors are the same in every
  # mode.
  stateful = sorted({op_type for op_type, _ in op_types
                     if _is_stateful_random(op_type)})
  writes = sorted({op_type for op_type, _ in op_types
                   if op_type in _VARIABLE_WRITES})
  stateful_ops = [_describe_op(op) for op in graph.get_operations()
                  if op.op_def.is_stateful and op.type not in _BOOKKEEPING]

  # Every outer float tensor may need a gradient: a tape can watch a graph
  # constant too, and tf.gradients can differentiate with respect to one.
  # So may a TensorArray's or TensorList's variant read inside the step
  # (raw_rnn's inputs): its gradient flows back to what was written into it.
  closure = list(traced.captured_inputs)
  captured = [outer for outer in closure if isinstance(outer, tf.Tensor) and
              (structs.is_differentiable(outer.dtype) or
               outer.dtype == tf.variant)]
  digest = hashlib.sha256(graph_def.SerializeToString(deterministic=True))
  return StepProbe(
      extras=step_extras,
      captured=captured,
      variables=list(traced.trainable_variables),
      uses_step_seed=any(seed_used),
      stateful_random_ops=stateful,
      variable_writes=writes,
      stateful_ops=stateful_ops,
      fingerprint=(digest.hexdigest(), tuple(id(c) for c in closure)),
      closure=closure)
