"""Lingvo's `Recurrent` on tf_recurrent's op: migrating swaps one import.

`lingvo.core.recurrent.Recurrent` is the most used descendant of the
tf.contrib op. `Recurrent` here takes its signature and semantics, in eager,
`tf.function`, XLA and TF1 graph mode (`tf.compat.v1` graphs, Session,
`tf.gradients`), and runs the same op as `tf_recurrent.recurrent`:

* `cell_grad` returns four values, `(dtheta, dstate0, dinputs, dcaptured)`;
  `dcaptured` is None (a custom `cell_grad` may not capture tensors).
* `inputs.padding` (1 = padded, or True) marks steps; leading and trailing
  steps where every example is padding are skipped: their rows are zeros,
  the state passes through them, and they get no gradient. Trailing ones
  are not run at all; leading ones are computed and discarded (the op's
  loop starts at step 0).
* `stop_fn(t, theta, state)` may return per-example bools: the loop stops
  once all of them are True.
* By default a `cell_fn` that reads tensors or variables it was not given
  is rejected (`allow_implicit_capture`, `allowed_tensor_captures`), and
  `check_stateful_ops` rejects stateful ops.
* `return_acc_extras` also returns every step's extras (without gradient,
  as in Lingvo); `backward_cleanup` runs after the backward pass.
* Containers come back as they went in: a `NestedMap` stays a `NestedMap`.
* Symbol values: when `lingvo.core.symbolic` is loaded, the tensor values
  of `symbolic.SymbolToValueMap.Get(symbolic.TENSOR_VALUES)` ride in
  `theta["_symbol_values"]`, and `cell_fn` and `cell_grad` run inside a
  `SymbolToValueMap` of them, so `symbolic.EvalExpr(TENSOR_VALUES, sym)`
  reads them in the loop; they get gradients, by autodiff of the step when
  a `cell_grad` returns none for them (as in Lingvo).

`accumulator_layer` (Lingvo's layer-accumulator protocol) is not supported:
carry such values in the state instead.
"""

import collections.abc
import sys
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from tf_recurrent.op import op
from tf_recurrent.op import probe as probe_lib
from tf_recurrent.op import structs
from tf_recurrent.op import unconverted


@unconverted.entry_point
def Recurrent(theta: Any,  # pylint: disable=invalid-name
              state0: Any,
              inputs: Any,
              cell_fn: Callable[..., Any],
              cell_grad: Optional[Callable[..., Any]] = None,
              cell_type: Optional[str] = None,
              stop_fn: Optional[Callable[..., Any]] = None,
              extras: Any = None,
              check_stateful_ops: bool = False,
              accumulator_layer: Any = None,
              allow_implicit_capture: bool = False,
              allowed_tensor_captures: Optional[Sequence[Any]] = None,
              backward_cleanup: Optional[Callable[[], Any]] = None,
              return_acc_extras: bool = False):
  """Lingvo's `Recurrent(...)`, computed by `tf_recurrent.recurrent`.

  Computes, for the steps between the leading and trailing padding:

      state = state0
      for t in range(T):
        if all(stop_fn(t, theta, state)): break
        state, extras = cell_fn(theta, state, inputs[t])
        acc_state[t] = state

  Args:
    theta: Weights, a nested structure (e.g. a `NestedMap`) of tensors.
    state0: The initial state, a nested structure of tensors.
    inputs: Time-major inputs `[T, ...]`, a nested structure; a `padding`
      key (`[T, ...]`, 1.0 or True = padded) marks padded steps.
    cell_fn: `(theta, state0, inputs_t) -> (state1, extras)`.
    cell_grad: Optional `(theta, state0, inputs_t, extras, dstate1) ->
      (dtheta, dstate0, dinputs_t, dcaptured)`, `dcaptured` None.
    cell_type: Name scope of the op.
    stop_fn: Optional `(t, theta, state) -> bools`; the loop ends before
      step t once all are True.
    extras: Optional structure shaped like one step's extras.
    check_stateful_ops: Raise a ValueError if `cell_fn` has stateful ops.
    accumulator_layer: Not supported (raises NotImplementedError).
    allow_implicit_capture: Whether `cell_fn` may read tensors and variables
      it is not given (they then get gradients). Forced False with a
      `cell_grad`.
    allowed_tensor_captures: Tensors (or variables) `cell_fn` may read
      although not given; overrides `allow_implicit_capture`.
    backward_cleanup: Optional callable with no argument returning a list of
      ops, run after the backward pass (the gradients depend on them).
    return_acc_extras: Also return every step's extras, `[T, ...]`.

  Returns:
    `(acc_state, final_state)`, or `(acc_state, final_state, acc_extras)`
    with `return_acc_extras`.

  Raises:
    NotImplementedError: If `accumulator_layer` is given.
    ValueError: If `cell_fn` captures what it may not, has stateful ops under
      `check_stateful_ops`, or `cell_grad` returns a `dcaptured`; and every
      error of `tf_recurrent.recurrent`.

  Example:

  >>> from tf_recurrent import lingvo
  >>> def poly(theta, state, inputs):
  ...   return ({"value": state["value"] + inputs["coeff"] * state["x_power"],
  ...            "x_power": state["x_power"] * theta["x"]}, {})
  >>> acc, final = lingvo.Recurrent(
  ...     {"x": tf.constant(2.0)},
  ...     {"value": tf.constant(0.0), "x_power": tf.constant(1.0)},
  ...     {"coeff": tf.constant([1.0, 2.0, 3.0, 4.0]),
  ...      "padding": tf.constant([0.0, 0.0, 0.0, 1.0])}, poly)
  >>> acc["value"].numpy().tolist(), float(final["value"])
  ([1.0, 5.0, 17.0, 0.0], 17.0)
  """
  if accumulator_layer is not None:
    raise NotImplementedError(
        "tf_recurrent.lingvo.Recurrent does not support accumulator_layer: "
        "carry the accumulated values in state0 and read them from the "
        "final state instead.")
  if cell_grad is not None:
    allow_implicit_capture, allowed_tensor_captures = False, None
  cell_fn, cell_grad = (unconverted.like_caller(fn)
                        for fn in (cell_fn, cell_grad))
  with tf.name_scope(cell_type or "Recurrent"):
    theta, cell_fn, cell_grad = _with_symbol_values(theta, cell_fn, cell_grad)
    theta = structs.to_tensors(theta, "theta")
    state0 = structs.to_tensors(state0, "state0")
    inputs = structs.to_tensors(inputs, "inputs")
    _check_cell_fn(cell_fn, theta, state0, inputs, extras, check_stateful_ops,
                   allow_implicit_capture, allowed_tensor_captures)
    if backward_cleanup is not None:
      theta, state0, inputs = _cleanup_after_backward(
          (theta, state0, inputs), backward_cleanup)
    step_fn, step_grad = cell_fn, (None if cell_grad is None else
                                   _three_results(cell_grad))
    run_state0 = state0
    if return_acc_extras:
      step_fn, step_grad, run_state0 = _extras_in_state(
          step_fn, step_grad, theta, state0, inputs, extras)
    first, limit = _unpadded_steps(inputs)
    run_inputs = inputs
    if first is not None:
      step_fn, step_grad, run_inputs = _skip_leading(step_fn, step_grad,
                                                     inputs, first)
    acc, final = op.recurrent(
        theta, run_state0, run_inputs, step_fn, step_grad,
        extras=extras,
        max_input_length=limit,
        stop_fn=None if stop_fn is None else _all_stopped(stop_fn))
    if first is not None:
      acc = _zero_leading_rows(acc, first)
    if not return_acc_extras:
      return acc, final
    return (acc["state"], final["state"],
            tf.nest.map_structure(tf.stop_gradient, acc["extras"]))


def _check_cell_fn(cell_fn, theta, state0, inputs, extras,
                   check_stateful_ops, allow_implicit_capture,
                   allowed_tensor_captures):
  """Lingvo's reflection on cell_fn: captures and stateful ops."""
  step = probe_lib.probe_step(cell_fn, None, theta, state0, inputs, extras)
  if check_stateful_ops and step.stateful_ops:
    raise ValueError(
        f"cell_fn contains stateful ops: {step.stateful_ops}. Use "
        "tf.random.stateless_* ops seeded by tf_recurrent.step_seed(), or "
        "pass check_stateful_ops=False.")
  allowed = {id(_capture_of(a)) for a in allowed_tensor_captures or ()}
  variable_names = {id(v.handle): v.name for v in step.variables}
  names = [variable_names.get(id(c)) or getattr(c, "name", None) or
           structs.describe(c) for c in step.closure if id(c) not in allowed]
  if allowed_tensor_captures and names:
    raise ValueError(
        f"Recurrent cell_fn implicitly captures {names}, which are not in "
        "allowed_tensor_captures. Pass them in theta, or add them to "
        "allowed_tensor_captures.")
  if not allowed_tensor_captures and not allow_implicit_capture and names:
    raise ValueError(
        f"Recurrent cell_fn implicitly captures tensors {names} but implicit "
        "capture is disabled (the default) or a custom cell_grad is in use. "
        "Pass them in theta, or pass allow_implicit_capture=True (without a "
        "cell_grad).")


def _with_symbol_values(theta, cell_fn, cell_grad):
  """Lingvo's symbol values: carried in theta and set again in the step.

  Lingvo's Recurrent reads `symbolic.SymbolToValueMap.Get(TENSOR_VALUES)`,
  passes the values in `theta["_symbol_values"]` (a list, in the map's
  order) and wraps `cell_fn` and `cell_grad` in a `SymbolToValueMap` of
  them; `cell_fn` gets theta without the key, `cell_grad` with it. A
  `cell_grad` whose dtheta has no `_symbol_values` gets theirs computed here
  from a recompute of the step (Lingvo uses tf.gradients, a
  `tf.GradientTape` works in every mode and sees only this step's ops). The
  module is looked up in `sys.modules`: a map can only have been entered if
  it is loaded, and Lingvo is no dependency of tf_recurrent.
  """
  symbolic = sys.modules.get("lingvo.core.symbolic")
  symbol_map = (None if symbolic is None else
                symbolic.SymbolToValueMap.Get(symbolic.TENSOR_VALUES))
  if not symbol_map:
    return theta, cell_fn, cell_grad
  if not isinstance(theta, collections.abc.MutableMapping):
    raise TypeError(
        "Lingvo's symbol values are set (symbolic.SymbolToValueMap), so theta "
        "must be a NestedMap or dict to carry them in '_symbol_values', as in "
        f"Lingvo; got {type(theta).__name__}.")
  symbols = list(symbol_map.keys())
  theta = _copy(theta)  # The caller's theta stays as it was.
  theta["_symbol_values"] = [tf.convert_to_tensor(v)
                             for v in symbol_map.values()]

  def symbol_values_set(values):
    return symbolic.SymbolToValueMap(symbolic.TENSOR_VALUES,
                                     dict(zip(symbols, values)))

  def fn(theta, state0, inputs_t):
    theta = _copy(theta)
    values = theta.pop("_symbol_values")
    with symbol_values_set(values):
      return cell_fn(theta, state0, inputs_t)

  if cell_grad is None:
    return theta, fn, None

  def grad(theta, state0, inputs_t, extras, dstate1):
    values = theta["_symbol_values"]
    with symbol_values_set(values):
      dtheta, dstate0, dinputs, dcaptured = cell_grad(theta, state0, inputs_t,
                                                      extras, dstate1)
      if "_symbol_values" not in dtheta:
        dtheta = _copy(dtheta)
        dtheta["_symbol_values"] = _step_gradients(fn, theta, state0,
                                                   inputs_t, dstate1, values)
    return dtheta, dstate0, dinputs, dcaptured

  return theta, fn, grad


def _copy(mapping):
  """A shallow copy of the same type (dict.copy of a NestedMap is a dict)."""
  return type(mapping)(mapping)


def _step_gradients(fn, theta, state0, inputs_t, dstate1, values):
  """d <fn(theta, state0, inputs_t)[0], dstate1> / d values, of this step."""
  watched = [v for v in values if structs.is_differentiable(v.dtype)]
  with tf.GradientTape(watch_accessed_variables=False) as tape:
    tape.watch(watched)
    state1, _ = fn(theta, state0, inputs_t)
  state1, dstate1 = tf.nest.flatten(state1), tf.nest.flatten(dstate1)
  pairs = [(s, d) for s, d in zip(state1, dstate1)
           if d is not None and structs.is_differentiable(s.dtype)]
  grads = iter(tape.gradient(
      [s for s, _ in pairs], watched, output_gradients=[d for _, d in pairs],
      unconnected_gradients=tf.UnconnectedGradients.ZERO))
  return [next(grads) if structs.is_differentiable(v.dtype) else None
          for v in values]


def _capture_of(value):
  """What a step's trace holds for `value`: a variable's handle, or itself."""
  return getattr(value, "handle", value)


def _three_results(cell_grad):
  """Lingvo's four-result cell_grad as the op's three-result one."""

  def grad(theta, state0, inputs_t, extras, dstate1):
    results = cell_grad(theta, state0, inputs_t, extras, dstate1)
    if not isinstance(results, (tuple, list)) or len(results) != 4:
      raise ValueError(
          "cell_grad must return (dtheta, dstate0, dinputs, dcaptured) as in "
          f"Lingvo; got {type(results).__name__}"
          f"{' of length %d' % len(results) if isinstance(results, (tuple, list)) else ''}.")
    dtheta, dstate0, dinputs, dcaptured = results
    if any(d is not None for d in tf.nest.flatten(dcaptured)):
      raise ValueError(
          "cell_grad returned a dcaptured, but a custom cell_grad may not "
          "capture tensors: return None for it and pass them in theta.")
    return dtheta, dstate0, dinputs

  return grad


def _unpadded_steps(inputs):
  """(first step, end) run for `inputs['padding']`, or (None, None).

  A step is padding when every entry of `padding[t]` is (Lingvo's
  FlattenPadding); leading and trailing padding steps are skipped.
  """
  padding = inputs.get("padding") if hasattr(inputs, "get") else None
  if padding is None:
    return None, None
  padded = (padding if padding.dtype == tf.bool else
            tf.not_equal(padding, tf.zeros([], padding.dtype)))
  if padded.shape.rank != 1:
    padded = tf.reduce_all(padded, axis=tf.range(1, tf.rank(padded)))
  total = tf.shape(padded, out_type=tf.int32)[0]
  real = tf.cast(tf.logical_not(padded), tf.int32)
  steps = tf.range(1, total + 1)
  end = tf.reduce_max(tf.concat([real * steps, [0]], 0))
  first = tf.where(tf.equal(end, 0), 0, total - tf.reduce_max(
      tf.concat([tf.reverse(real, [0]) * steps, [0]], 0)))
  return first, end


def _skip_leading(cell_fn, cell_grad, inputs, first):
  """Steps before `first` carry the state and have no gradient."""
  steps = tf.range(tf.shape(tf.nest.flatten(inputs)[0])[0])
  run_inputs = {"inputs": inputs, "t": steps}

  def skipping_fn(theta, state, inputs_t):
    state1, extras = cell_fn(theta, state, inputs_t["inputs"])
    running = inputs_t["t"] >= first
    state1 = tf.nest.map_structure(lambda new, old: tf.where(running, new, old),
                                   tf.nest.pack_sequence_as(
                                       state, tf.nest.flatten(state1)), state)
    return state1, extras

  if cell_grad is None:
    return skipping_fn, None, run_inputs

  def skipping_grad(theta, state0, inputs_t, extras, dstate1):
    dtheta, dstate0, dinputs = cell_grad(theta, state0, inputs_t["inputs"],
                                         extras, dstate1)
    running = inputs_t["t"] >= first

    def zero_when_skipped(grad, like):
      del like  # The structure only.
      return None if grad is None else tf.where(running, grad,
                                                tf.zeros_like(grad))

    def passed_when_skipped(grad, dstate):
      """A skipped step passes its state's gradient straight through."""
      grad = tf.zeros_like(dstate) if grad is None else grad
      return tf.where(running, grad, tf.cast(dstate, grad.dtype))

    return (tf.nest.map_structure(zero_when_skipped, dtheta, theta,
                                  check_types=False),
            tf.nest.map_structure(passed_when_skipped, dstate0, dstate1,
                                  check_types=False),
            {"inputs": tf.nest.map_structure(
                zero_when_skipped, dinputs, inputs_t["inputs"],
                check_types=False), "t": None})

  return skipping_fn, skipping_grad, run_inputs


def _zero_leading_rows(acc, first):
  """Rows of the steps before `first` are zeros, as if never written."""

  def zero(rows):
    steps = tf.range(tf.shape(rows)[0])
    mask = tf.reshape(steps >= first, tf.concat(
        [[-1], tf.ones([tf.rank(rows) - 1], tf.int32)], 0))
    return tf.where(mask, rows, tf.zeros_like(rows))

  return tf.nest.map_structure(zero, acc)


def _extras_in_state(cell_fn, cell_grad, theta, state0, inputs, extras):
  """Carries each step's extras in the state, so that they are returned."""
  if extras is None:
    first_inputs = tf.nest.map_structure(lambda x: x[0], inputs)
    extras = cell_fn(theta, state0, first_inputs)[1]
  extras0 = tf.nest.map_structure(tf.zeros_like, extras)
  state0 = {"state": state0, "extras": extras0}

  def fn(theta, state, inputs_t):
    state1, step_extras = cell_fn(theta, state["state"], inputs_t)
    return {"state": state1, "extras": step_extras}, step_extras

  if cell_grad is None:
    return fn, None, state0

  def grad(theta, state, inputs_t, step_extras, dstate1):
    dtheta, dstate, dinputs = cell_grad(theta, state["state"], inputs_t,
                                        step_extras, dstate1["state"])
    # A step's extras do not depend on the extras carried into it.
    return dtheta, {"state": dstate, "extras": tf.nest.map_structure(
        tf.zeros_like, state["extras"])}, dinputs

  return fn, grad, state0


def _all_stopped(stop_fn):
  """Lingvo's stop_fn may return per-example bools: stop when all are."""

  def stop(t, theta, state):
    return tf.reduce_all(tf.cast(stop_fn(t, theta, state), tf.bool))

  return stop


def _cleanup_after_backward(structures, backward_cleanup):
  """The structures, whose gradients wait for `backward_cleanup()`'s ops."""
  flat = tf.nest.flatten(structures)
  float_index = [i for i, x in enumerate(flat)
                 if structs.is_differentiable(x.dtype)]
  if not float_index:
    return structures

  @tf.custom_gradient
  def marked(*xs):
    def grad(*dys):
      with tf.control_dependencies([d for d in dys if d is not None]):
        cleanup = backward_cleanup() or []
      with tf.control_dependencies(cleanup):
        return [None if d is None else tf.identity(d) for d in dys]
    return [tf.identity(x) for x in xs], grad

  outs = marked(*[flat[i] for i in float_index])
  for i, out in zip(float_index, outs):
    flat[i] = out
  return tf.nest.pack_sequence_as(structures, flat)
