"""The recurrent op: a forward while loop, a reverse while loop, one gradient.

`recurrent` runs `state = cell_fn(theta, state, inputs[t])` for every step
and returns every step's state. Its gradient is not TensorFlow's autodiff of
the loop (which would keep every intermediate of every step alive until the
backward pass) but a reverse loop that, per step, calls the cell's gradient
with the state entering that step. Only the per-step states (and, with a
custom `cell_grad`, the extras it asks for) are kept between the passes; with
`checkpoint_every`, only every k-th state.

This module checks the arguments and picks how to run; `loops.py` builds the
loops themselves.
"""

import collections
from typing import Any, Callable, Optional, Tuple, Union

import tensorflow as tf

from tf_recurrent.op import lengths as lengths_lib
from tf_recurrent.op import loops
from tf_recurrent.op import probe as probe_lib
from tf_recurrent.op import seeds
from tf_recurrent.op import step_clusters
from tf_recurrent.op import structs
from tf_recurrent.op import tracing
from tf_recurrent.op import unconverted

UntraceableStepError = probe_lib.UntraceableStepError

CellFn = Callable[[Any, Any, Any], Tuple[Any, Any]]
CellGrad = Callable[[Any, Any, Any, Any, Any], Tuple[Any, Any, Any]]
StopFn = Callable[[tf.Tensor, Any, Any], tf.Tensor]

# Eager calls run the loops as one traced function. The traces of a handful of
# recent (options, step fingerprint) combinations are kept.
_EAGER_CACHE_SIZE = 32
_eager_cache: "collections.OrderedDict[Any, Any]" = collections.OrderedDict()


class UnrecomputableStepError(ValueError):
  """`cell_fn` draws from stateful random ops or assigns to variables, and no
  `cell_grad` is given: the default gradient, which recomputes each step,
  would see other values. (A ValueError; `tf_recurrent.dynamic_rnn` catches
  it to run such a cell under ordinary autodiff.)"""


@unconverted.entry_point
def recurrent(theta: Any,
              state0: Any,
              inputs: Any,
              cell_fn: CellFn,
              cell_grad: Optional[CellGrad] = None,
              extras: Any = None,
              max_input_length: Any = None,
              use_tpu: bool = False,
              *,
              sequence_length: Any = None,
              checkpoint_every: Union[None, int, str] = None,
              accumulate_state: Any = True,
              stop_fn: Optional[StopFn] = None,
              time_major: bool = True,
              seed: Any = None,
              xla_steps: Union[str, bool] = "auto") -> Tuple[Any, Any]:
  """Runs a recurrent cell over time-major inputs, with a lean gradient.

  Computes, in one `tf.while_loop`:

      state = state0
      for t in range(T):
        if stop_fn is not None and stop_fn(t, theta, state): break
        state, _ = cell_fn(theta, state, inputs[t])
        acc_state[t] = state
      return acc_state, state

  and registers a gradient that walks the steps backwards, calling
  `cell_grad(theta, state[t-1], inputs[t], extras[t], dstate[t])` once per
  step. Between the two passes only the per-step states (plus extras when a
  custom `cell_grad` is given) are kept.

  Args:
    theta: The weights, a nested structure of tensors or variables. Gradients
      flow to every floating-point leaf.
    state0: The initial state, a nested structure of tensors.
    inputs: The inputs, a nested structure of time-major tensors `[T, ...]`
      that agree on T. T may be unknown until run time.
    cell_fn: `(theta, state0, inputs_t) -> (state1, extras)`; `state1` has
      the structure, dtypes and shapes of `state0`. It may read trainable
      variables and outer tensors it closes over (from ops, constants, TF1
      placeholders); both get gradients, in every mode. Called eagerly, the
      op computes what `cell_fn` computes now: its compiled loops are reused
      only while the traced step (graph, constants, the tensors and
      variables it reads) is unchanged. For randomness use stateless ops
      seeded by `tf_recurrent.step_seed()` (a new seed per call).
    cell_grad: Optional `(theta, state0, inputs_t, extras, dstate1) ->
      (dtheta, dstate0, dinputs_t)`; None leaves mean zeros. Every argument
      is a value of that step only (cut from the forward loop by
      `tf.stop_gradient`), so a `cell_grad` that recomputes its step and
      differentiates it, with a tape or `tf.gradients`, gets the step's
      partial derivatives in every mode. Without it each step is recomputed
      and differentiated in the backward pass.
    extras: Optional structure of tensors shaped like the extras one step of
      `cell_fn` returns; derived by tracing `cell_fn` when None.
    max_input_length: Optional Python int or scalar int tensor: only the first
      `max_input_length` steps run; later accumulator rows and input
      gradients are zeros. A tensor out of [0, T] raises when the graph runs
      (eager, `tf.function`, TF1 graphs; XLA clips it).
    use_tpu: Build for XLA (TPU): in-place dynamic-update-slice
      accumulators. Under `jit_compile=True` this is detected without the
      flag.
    sequence_length: Optional `[B]` int lengths, as in `tf.nn.dynamic_rnn`:
      every state leaf is `[B, ...]` and every input leaf `[T, B, ...]`.
      Past its length an example's state is carried through unchanged, its
      accumulator rows are zeros and its gradients past the length are
      zeros; the loop stops after the longest length.
    checkpoint_every: Optional segment length k (an int >= 1, or "sqrt" for
      about sqrt(T)). With `accumulate_state=False` the forward pass keeps
      only every k-th state and the backward pass recomputes each segment
      from its checkpoint: about T/k + k states held instead of T, for one
      extra forward pass. With `accumulate_state=True` the returned states
      are all the backward pass keeps: a custom `cell_grad`'s extras are
      recomputed per step instead of stored.
    accumulate_state: Return every step's state (True) or only the final
      state (False, `acc_state` is None), which with `checkpoint_every`
      makes memory sublinear in T. Or a structure of bools like `state0`:
      only the True leaves are returned per step (the others are None in
      `acc_state`). The backward pass still keeps every leaf's rows, but the
      leaves not returned get no gradient tensor: TensorFlow would otherwise
      pass a `[T, ...]` tensor of zeros for each one the loss does not read.
    stop_fn: Optional `(t, theta, state) -> scalar bool`, called before step
      t with the state entering it; True ends the loop before step t runs.
      Rows from the stop on are zeros.
    time_major: Whether inputs are `[T, B, ...]` (True) or batch-major
      `[B, T, ...]` (False, and then `acc_state` is batch-major too).
    seed: Optional int `[2]` base seed for `step_seed()`; drawn at random
      per call when `cell_fn` uses `step_seed()` and no seed is given.
    xla_steps: Whether, in loops XLA does not compile (no `jit_compile`, no
      `use_tpu`), each step and each step's gradient run as one XLA cluster
      (one call instead of dozens of small ops). "auto" (the default) does
      where that computes what the plain step computes: not for steps that
      draw random numbers (XLA's generator draws others for the same seed),
      hold ops without XLA kernels (`tf.py_function`, strings), control
      flow, assertions or TensorLists, or too few ops to pay for a cluster
      launch; such steps run plain, logged once at INFO level.
      True compiles every step (XLA must support its ops), False none.
      Functions traced by `tf.saved_model.save` hold no clusters (one
      traced before saving keeps its own).

  Returns:
    `(acc_state, final_state)`: `acc_state` has the structure of `state0` with
    a leading `[T]` axis (or `[B, T]` when not `time_major`), row t being the
    state after step t, or is None when `accumulate_state` is False (a leaf
    is None where a structure of bools says False);
    `final_state` is the state after the last step run.

  Raises:
    TypeError: If `cell_fn`, `cell_grad` or `stop_fn` is not callable, or a
      leaf is not convertible to a tensor; called eagerly,
      `UntraceableStepError` if the step uses a tensor as only an eager one
      can be used (an eager TensorArray read at a tensor index, say).
    ValueError: If inputs disagree on T or have rank 0, if `cell_fn` or
      `cell_grad` return structures, dtypes or shapes unlike their arguments
      (naming the leaf), if `stop_fn` returns anything but a scalar bool, if
      `max_input_length` or `sequence_length` is out of range or of the
      wrong shape, if `xla_steps` is not "auto", True or False, if
      `checkpoint_every` is not an int >= 1 or "sqrt", if
      `accumulate_state` is neither a bool nor a structure of bools like
      `state0` (naming the leaf), or if the default gradient cannot
      reproduce `cell_fn` (stateful randomness).

  Example:

  >>> import tf_recurrent
  >>> def cell_fn(theta, state, x):
  ...   return {"h": theta["a"] * state["h"] + x}, []
  >>> acc, final = tf_recurrent.recurrent(
  ...     theta={"a": tf.constant(2.0)}, state0={"h": tf.constant(0.0)},
  ...     inputs=tf.constant([1.0, 1.0, 1.0]), cell_fn=cell_fn)
  >>> acc["h"].numpy().tolist(), float(final["h"])
  ([1.0, 3.0, 7.0], 7.0)

  Per-example lengths, batch-major inputs, final state only:

  >>> def add(theta, state, x):
  ...   return state + x, []
  >>> _, final = tf_recurrent.recurrent(
  ...     theta=(), state0=tf.zeros([2]), inputs=tf.ones([2, 4]),
  ...     cell_fn=add, sequence_length=[1, 3], time_major=False,
  ...     accumulate_state=False, checkpoint_every="sqrt")
  >>> final.numpy().tolist()
  [1.0, 3.0]

  Only some state leaves per step:

  >>> acc, _ = tf_recurrent.recurrent(
  ...     theta=(), state0={"h": tf.zeros([]), "n": tf.zeros([])},
  ...     inputs=tf.ones([3]), cell_fn=lambda _, s, x: (
  ...         {"h": s["h"] + x, "n": s["n"] + 1.0}, []),
  ...     accumulate_state={"h": True, "n": False})
  >>> acc["h"].numpy().tolist(), acc["n"]
  ([1.0, 2.0, 3.0], None)
  """
  for name, fn, optional in (("cell_fn", cell_fn, False),
                             ("cell_grad", cell_grad, True),
                             ("stop_fn", stop_fn, True)):
    if not callable(fn) and not (optional and fn is None):
      raise TypeError(f"{name} must be callable{' or None' if optional else ''}"
                      f"; got {type(fn).__name__}.")
  cell_fn, cell_grad, stop_fn = (unconverted.like_caller(fn) for fn in
                                 (cell_fn, cell_grad, stop_fn))
  return _recurrent(theta, state0, inputs, cell_fn, cell_grad, extras,
                    max_input_length, use_tpu, sequence_length,
                    checkpoint_every, accumulate_state, stop_fn, time_major,
                    seed, step_clusters.check_setting(xla_steps))


Recurrent = recurrent


def _recurrent(theta, state0, inputs, cell_fn, cell_grad, extras,
               max_input_length, use_tpu, sequence_length, checkpoint_every,
               accumulate_state, stop_fn, time_major, seed, xla_steps):
  """`recurrent` once the user's callables are set."""
  theta = structs.to_tensors(theta, "theta")
  state0 = structs.to_tensors(state0, "state0")
  inputs = structs.to_tensors(inputs, "inputs")
  if extras is not None:
    extras = structs.to_tensors(extras, "extras")
  if not time_major:
    inputs = structs.swap_batch_and_time(inputs, "inputs")
  static_length = _check_inputs(inputs)
  max_input_length = _check_max_input_length(max_input_length, static_length)
  if sequence_length is not None:
    sequence_length = lengths_lib.check_sequence_length(
        sequence_length, state0, inputs, static_length)
  returned_rows = _check_accumulate_state(accumulate_state, state0)
  options = loops.Options(
      use_xla=bool(use_tpu), returned_rows=returned_rows,
      checkpoint_every=_check_checkpoint_every(checkpoint_every),
      xla_steps=xla_steps)
  if seed is not None:
    seed = tf.convert_to_tensor(seed)
    if seed.dtype not in (tf.int32, tf.int64) or seed.shape != [2]:
      raise ValueError(
          f"seed must be an int32 or int64 tensor of shape [2]; got "
          f"{structs.describe(seed)}.")

  probe_lib.settle_in_tf1_graph(cell_fn, theta, state0, inputs)
  step = probe_lib.probe_step(cell_fn, cell_grad, theta, state0, inputs,
                              extras, stop_fn)
  _check_gradient_is_computable(step, cell_grad)

  if static_length == 0:
    acc_state, final_state = _no_steps(state0, returned_rows)
  elif (cell_grad is None and static_length == 1 and
        _is_none_or(max_input_length, 1) and sequence_length is None and
        stop_fn is None):
    acc_state, final_state = _single_step(theta, state0, inputs, cell_fn,
                                          seed, returned_rows)
  elif tf.executing_eagerly():
    traced = _eager_function(cell_fn, cell_grad, stop_fn, options, step)
    if max_input_length is not None:
      max_input_length = tf.convert_to_tensor(max_input_length, tf.int32)
    # One trace for every T: the inputs' leading axis is left unknown.
    acc_state, final_state = traced(theta, state0, inputs, extras,
                                    max_input_length, sequence_length, seed,
                                    unknown=(0, 0, 1, 0, 0, 0, 0))
  else:
    acc_state, final_state = loops.build(
        theta, state0, inputs, cell_fn, cell_grad, stop_fn, step, options,
        max_input_length, sequence_length, seed)
  if accumulate_state is False:
    return None, final_state
  if not time_major:
    acc_state = structs.swap_batch_and_time(acc_state, "acc_state")
  return acc_state, final_state


def _is_none_or(value, python_int: int) -> bool:
  """Whether `value` is None or that Python int; False for a tensor (whose
  value is known only at run time: `in` or `==` would raise in a graph)."""
  return value is None or (not isinstance(value, tf.Tensor) and
                           value == python_int)


def _check_inputs(inputs: Any) -> Optional[int]:
  """Checks that inputs are non-empty, of rank >= 1 and agree on T."""
  flat = tf.nest.flatten(inputs)
  if not flat:
    raise ValueError(
        "inputs must hold at least one tensor: its leading axis is the "
        "number of steps.")
  paths = structs.leaf_paths(inputs, "inputs")
  known = None
  for path, x in zip(paths, flat):
    if x.shape.rank == 0:
      raise ValueError(
          f"{path} is a scalar; every input leaf must be time-major with "
          f"shape [T, ...].")
    size = x.shape[0] if x.shape.rank is not None else None
    if size is None:
      continue
    if known is None:
      known = (path, size)
    elif size != known[1]:
      raise ValueError(
          f"inputs disagree on the number of steps T: {known[0]} has "
          f"{known[1]} and {path} has {size}.")
  return None if known is None else known[1]


def _check_max_input_length(max_input_length, static_length):
  """Validates a Python max_input_length; tensors are checked at run time."""
  if max_input_length is None:
    return None
  value = tf.get_static_value(max_input_length)
  if isinstance(max_input_length, tf.Tensor) and value is None:
    if max_input_length.shape.rank not in (None, 0) or not (
        max_input_length.dtype.is_integer):
      raise ValueError(
          "max_input_length must be a scalar integer; got "
          f"{structs.describe(max_input_length)}.")
    return max_input_length
  if value is None or getattr(value, "ndim", 0) != 0 or not float(
      value).is_integer():
    raise ValueError(
        f"max_input_length must be a scalar integer; got {max_input_length!r}.")
  value = int(value)
  if value < 0 or (static_length is not None and value > static_length):
    raise ValueError(
        f"max_input_length must be in [0, T={static_length}]; got {value}.")
  return value


def _check_gradient_is_computable(step: probe_lib.StepProbe, cell_grad):
  """Rejects cells whose gradient the op would get wrong."""
  if cell_grad is None and step.stateful_random_ops:
    raise UnrecomputableStepError(
        "cell_fn uses stateful random ops "
        f"({', '.join(step.stateful_random_ops)}); the default gradient "
        "recomputes each step and would draw different numbers. Use "
        "tf.random.stateless_* ops seeded with tf_recurrent.step_seed(), or "
        "pass a cell_grad.")
  if cell_grad is None and step.variable_writes:
    raise UnrecomputableStepError(
        f"cell_fn assigns to variables ({', '.join(step.variable_writes)}); "
        "the default gradient recomputes each step and would repeat the "
        "assignment and see other values. Keep cell_fn free of side effects "
        "(draw random numbers with tf_recurrent.step_seed()), or pass a "
        "cell_grad.")
  if cell_grad is not None and step.variables:
    raise ValueError(
        "cell_fn reads trainable variables "
        f"{[v.name for v in step.variables]} that are not in theta; a custom "
        "cell_grad can only return gradients for theta. Pass them in theta.")
  if cell_grad is not None and step.captured:
    names = [getattr(c, "name", None) or structs.describe(c)
             for c in step.captured]
    raise ValueError(
        f"cell_fn closes over tensors {names} that may need gradients; a "
        "custom cell_grad can only return gradients for theta, state0 and "
        "inputs. Pass them in theta.")


def _check_accumulate_state(accumulate_state, state0) -> Tuple[bool, ...]:
  """Which flat state leaves are returned per step, from a bool or a
  structure of bools like state0."""
  n_state = len(tf.nest.flatten(state0))
  if isinstance(accumulate_state, bool):
    return (accumulate_state,) * n_state
  structs.check_same_structure(state0, accumulate_state, "state0",
                               "accumulate_state")
  flags = tf.nest.flatten(accumulate_state)
  for path, flag in zip(structs.leaf_paths(accumulate_state,
                                           "accumulate_state"), flags):
    if not isinstance(flag, bool):
      raise ValueError(
          f"{path} must be a bool (return this state leaf per step or not); "
          f"got {flag!r}.")
  return tuple(flags)


def _check_checkpoint_every(checkpoint_every):
  """Validates `checkpoint_every`: None, an int >= 1, or "sqrt"."""
  if checkpoint_every is None or checkpoint_every == "sqrt":
    return checkpoint_every
  if (isinstance(checkpoint_every, bool) or
      not isinstance(checkpoint_every, int) or checkpoint_every < 1):
    raise ValueError(
        "checkpoint_every must be None, an int >= 1 or \"sqrt\"; got "
        f"{checkpoint_every!r}.")
  return checkpoint_every


def _returned(rows, returned_rows):
  """`rows` with the leaves not returned per step set to None."""
  return tf.nest.pack_sequence_as(rows, [
      r if returned else None
      for r, returned in zip(tf.nest.flatten(rows), returned_rows)])


def _single_step(theta, state0, inputs, cell_fn, seed, returned_rows):
  """T is statically 1: one call of cell_fn, differentiated by autodiff."""
  inputs_t = tf.nest.map_structure(lambda x: x[0], inputs)
  with seeds.seeded_step(seeds.seed_source(seed), 0):
    state1, _ = cell_fn(theta, state0, inputs_t)
  state1 = tf.nest.pack_sequence_as(state0, tf.nest.flatten(state1))
  rows = tf.nest.map_structure(lambda x: tf.expand_dims(x, 0), state1)
  return _returned(rows, returned_rows), state1


def _no_steps(state0, returned_rows):
  """T is statically 0: empty accumulators, and state0 passed through."""
  rows = tf.nest.map_structure(
      lambda s: tf.zeros(tf.concat([[0], tf.shape(s)], 0), s.dtype), state0)
  return (_returned(rows, returned_rows),
          tf.nest.map_structure(tf.identity, state0))


def _eager_function(cell_fn, cell_grad, stop_fn, options, step):
  """The traced function that runs the op eagerly, cached per computation.

  An eager call must compute what running `cell_fn` eagerly would compute
  now. The probe traced one step of this very call; its fingerprint (the
  step's graph with its constants, and the identities of the tensors and
  variables it reads) tells whether an earlier trace computes the same thing.
  A variable swapped on an object, a Python global or flag the cell reads, or
  a rebound closed-over tensor all change it, and the call traces anew.
  """
  key = (options, step.fingerprint)
  entry = _eager_cache.get(key)
  if entry is None:
    # The traced function reads the callables from `entry`, so a later
    # retrace (a new T, say) uses this call's callables, which the
    # fingerprint shows compute the same step.
    entry = {}

    def run(theta, state0, inputs, extras, max_input_length, sequence_length,
            seed):
      fns = entry["callables"]
      step = probe_lib.probe_step(fns[0], fns[1], theta, state0, inputs,
                                  extras, fns[2])
      with tf.name_scope("recurrent"):  # Not the root: see probe.py.
        return loops.build(theta, state0, inputs, *fns, step, options,
                           max_input_length, sequence_length, seed)

    entry["traced"] = tracing.RelaxedFunction(
        run, autograph=False, jit_compile=options.use_xla or None)
    # Holding the closure keeps the ids in the fingerprint from being reused.
    entry["closure"] = step.closure
    _eager_cache[key] = entry
    while len(_eager_cache) > _EAGER_CACHE_SIZE:
      _eager_cache.popitem(last=False)
  _eager_cache.move_to_end(key)
  entry["callables"] = (cell_fn, cell_grad, stop_fn)
  return entry["traced"]
