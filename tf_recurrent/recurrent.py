"""The recurrent op: a forward while loop, a reverse while loop, one gradient.

`recurrent` runs `state = cell_fn(theta, state, inputs[t])` for every step
and returns every step's state. Its gradient is not TensorFlow's autodiff of
the loop (which would keep every intermediate of every step alive until the
backward pass) but a reverse loop that, per step, calls the cell's gradient
with the state entering that step. Only the per-step states (and, with a
custom `cell_grad`, the extras it asks for) are kept between the passes.
"""

import collections
from typing import Any, Callable, Optional, Tuple

import tensorflow as tf

from tf_recurrent import accumulators
from tf_recurrent import cell_grad as cell_grad_lib
from tf_recurrent import probe as probe_lib
from tf_recurrent import structs

CellFn = Callable[[Any, Any, Any], Tuple[Any, Any]]
CellGrad = Callable[[Any, Any, Any, Any, Any], Tuple[Any, Any, Any]]

# Eager calls run the loops as one traced function. A handful of recent
# (cell_fn, cell_grad, closure) combinations stay traced.
_EAGER_CACHE_SIZE = 32
_eager_cache: "collections.OrderedDict[Any, Any]" = collections.OrderedDict()


def recurrent(theta: Any,
              state0: Any,
              inputs: Any,
              cell_fn: CellFn,
              cell_grad: Optional[CellGrad] = None,
              extras: Any = None,
              max_input_length: Any = None,
              use_tpu: bool = False,
              *,
              seed: Any = None) -> Tuple[Any, Any]:
  """Runs a recurrent cell over time-major inputs, with a lean gradient.

  Computes, in one `tf.while_loop`:

      state = state0
      for t in range(T):
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
      variables and outer tensors it closes over; both get gradients. For
      randomness use stateless ops seeded by `tf_recurrent.step_seed()`.
    cell_grad: Optional `(theta, state0, inputs_t, extras, dstate1) ->
      (dtheta, dstate0, dinputs_t)`; None leaves mean zeros. Without it each
      step is recomputed under a `tf.GradientTape`.
    extras: Optional structure of tensors shaped like the extras one step of
      `cell_fn` returns; derived by tracing `cell_fn` when None.
    max_input_length: Optional Python int or scalar int tensor: only the first
      `max_input_length` steps run; later accumulator rows and input
      gradients are zeros.
    use_tpu: Build for XLA (TPU): int32 counters and in-place
      dynamic-update-slice accumulators. Under `jit_compile=True` this is
      detected without the flag.
    seed: Optional int `[2]` base seed for `step_seed()`; drawn at random
      per call when `cell_fn` uses `step_seed()` and no seed is given.

  Returns:
    `(acc_state, final_state)`: `acc_state` has the structure of `state0` with
    a leading `[T]` axis, row t being the state after step t; `final_state`
    is the state after the last step run.

  Raises:
    TypeError: If `cell_fn` or `cell_grad` is not callable, or a leaf is not
      convertible to a tensor.
    ValueError: If inputs disagree on T or have rank 0, if `cell_fn` or
      `cell_grad` return structures, dtypes or shapes unlike their arguments
      (naming the leaf), if `max_input_length` is out of range, or if the
      default gradient cannot reproduce `cell_fn` (stateful randomness).

  Example:

  >>> import tf_recurrent
  >>> def cell_fn(theta, state, x):
  ...   return {"h": theta["a"] * state["h"] + x}, []
  >>> acc, final = tf_recurrent.recurrent(
  ...     theta={"a": tf.constant(2.0)}, state0={"h": tf.constant(0.0)},
  ...     inputs=tf.constant([1.0, 1.0, 1.0]), cell_fn=cell_fn)
  >>> acc["h"].numpy().tolist(), float(final["h"])
  ([1.0, 3.0, 7.0], 7.0)
  """
  if not callable(cell_fn):
    raise TypeError(
        f"cell_fn must be callable; got {type(cell_fn).__name__}.")
  if cell_grad is not None and not callable(cell_grad):
    raise TypeError(
        f"cell_grad must be callable or None; got {type(cell_grad).__name__}.")
  theta = structs.to_tensors(theta, "theta")
  state0 = structs.to_tensors(state0, "state0")
  inputs = structs.to_tensors(inputs, "inputs")
  if extras is not None:
    extras = structs.to_tensors(extras, "extras")
  static_length = _check_inputs(inputs)
  max_input_length = _check_max_input_length(max_input_length, static_length)
  if seed is not None:
    seed = tf.convert_to_tensor(seed)
    if seed.dtype not in (tf.int32, tf.int64) or seed.shape != [2]:
      raise ValueError(
          f"seed must be an int32 or int64 tensor of shape [2]; got "
          f"{structs.describe(seed)}.")

  step = probe_lib.probe_step(cell_fn, cell_grad, theta, state0, inputs,
                              extras)
  _check_gradient_is_computable(step, cell_grad)

  if static_length == 0:
    return _no_steps(state0)
  if (cell_grad is None and static_length == 1 and
      max_input_length in (None, 1)):
    return _single_step(theta, state0, inputs, cell_fn, seed)

  if tf.executing_eagerly():
    traced = _eager_function(cell_fn, cell_grad, use_tpu, step.captured)
    if max_input_length is not None:
      max_input_length = tf.convert_to_tensor(max_input_length, tf.int32)
    return traced(theta, state0, inputs, extras, max_input_length, seed)
  return _build(theta, state0, inputs, cell_fn, cell_grad, step,
                max_input_length, use_tpu, seed)


Recurrent = recurrent


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
    raise ValueError(
        "cell_fn uses stateful random ops "
        f"{step.stateful_random_ops[:3]}; the default gradient recomputes each "
        "step and would draw different numbers. Use tf.random.stateless_* ops "
        "seeded with tf_recurrent.step_seed(), or pass a cell_grad.")
  if cell_grad is None and step.variable_writes:
    raise ValueError(
        f"cell_fn assigns to variables {step.variable_writes[:3]}; the default "
        "gradient recomputes each step and would repeat the assignment and "
        "see other values. Keep cell_fn free of side effects (draw random "
        "numbers with tf_recurrent.step_seed()), or pass a cell_grad.")
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


def _single_step(theta, state0, inputs, cell_fn, seed):
  """T is statically 1: one call of cell_fn, differentiated by autodiff."""
  inputs_t = tf.nest.map_structure(lambda x: x[0], inputs)
  with cell_grad_lib.seeded_step(_seed_source(seed), 0):
    state1, _ = cell_fn(theta, state0, inputs_t)
  state1 = tf.nest.pack_sequence_as(state0, tf.nest.flatten(state1))
  return tf.nest.map_structure(lambda x: tf.expand_dims(x, 0), state1), state1


def _no_steps(state0):
  """T is statically 0: empty accumulators, and state0 passed through."""
  acc = tf.nest.map_structure(
      lambda s: tf.zeros(tf.concat([[0], tf.shape(s)], 0), s.dtype), state0)
  return acc, tf.nest.map_structure(tf.identity, state0)


def _seed_source(seed):
  """A callable giving the base seed, drawn at most once."""
  drawn = []

  def source():
    if seed is not None:
      return seed
    if not drawn:
      drawn.append(tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int32))
    return drawn[0]

  return source


def _eager_function(cell_fn, cell_grad, use_tpu, captured):
  """The traced function that runs the op eagerly, cached per closure."""
  try:
    key = (cell_fn, cell_grad, bool(use_tpu), tuple(id(c) for c in captured))
    hash(key)
  except TypeError:  # An unhashable callable: trace for this call only.
    key = None
  if key is not None and key in _eager_cache:
    _eager_cache.move_to_end(key)
    return _eager_cache[key][0]

  def run(theta, state0, inputs, extras, max_input_length, seed):
    step = probe_lib.probe_step(cell_fn, cell_grad, theta, state0, inputs,
                                extras)
    return _build(theta, state0, inputs, cell_fn, cell_grad, step,
                  max_input_length, use_tpu, seed)

  traced = tf.function(run, autograph=False, jit_compile=use_tpu or None)
  if key is not None:
    # Holding the captured tensors keeps their ids from being reused.
    _eager_cache[key] = (traced, list(captured))
    while len(_eager_cache) > _EAGER_CACHE_SIZE:
      _eager_cache.popitem(last=False)
  return traced


def _build(theta, state0, inputs, cell_fn, cell_grad, step, max_input_length,
           use_tpu, seed):
  """Builds both loops in the current graph; returns (acc_state, final)."""
  use_xla = bool(use_tpu) or accumulators.in_xla_context()
  flat_theta = tf.nest.flatten(theta)
  flat_state0 = tf.nest.flatten(state0)
  flat_inputs = tf.nest.flatten(inputs)
  captured = list(step.captured)
  n_theta, n_state, n_inputs = (len(flat_theta), len(flat_state0),
                                len(flat_inputs))
  total_steps = tf.shape(flat_inputs[0], out_type=tf.int32)[0]
  if max_input_length is None:
    num_steps = total_steps
  else:
    num_steps = tf.cast(max_input_length, tf.int32)
    if not use_xla and tf.get_static_value(max_input_length) is None:
      tf.debugging.assert_less_equal(
          num_steps, total_steps,
          message="max_input_length exceeds the inputs' number of steps T")
      tf.debugging.assert_non_negative(
          num_steps, message="max_input_length must be >= 0")
    num_steps = tf.clip_by_value(num_steps, 0, total_steps)
  if len(flat_inputs) > 1 and not use_xla:
    for x in flat_inputs[1:]:
      tf.debugging.assert_equal(
          tf.shape(x, out_type=tf.int32)[0], total_steps,
          message="inputs disagree on the number of steps T")
  seed_source = _seed_source(seed)
  base_seed = seed_source() if step.uses_step_seed else None
  if base_seed is not None:
    seed_source = lambda: base_seed
  keep_extras = cell_grad is not None

  def call_cell(theta_, state_, inputs_t, t):
    with cell_grad_lib.seeded_step(seed_source, t):
      state1, step_extras = cell_fn(theta_, state_, inputs_t)
    return tf.nest.flatten(state1), tf.nest.flatten(step_extras)

  def pack(flat_t, flat_s, flat_x):
    return (tf.nest.pack_sequence_as(theta, flat_t),
            tf.nest.pack_sequence_as(state0, flat_s),
            tf.nest.pack_sequence_as(inputs, flat_x))

  @tf.custom_gradient
  def forward(*args):
    flat_t = list(args[:n_theta])
    flat_s0 = list(args[n_theta:n_theta + n_state])
    flat_x = list(args[n_theta + n_state:n_theta + n_state + n_inputs])
    state_accs = [accumulators.RowAccumulator(s, total_steps, use_xla)
                  for s in flat_s0]
    extras_accs = [accumulators.RowAccumulator(e, total_steps, use_xla)
                   for e in _extras_templates(step.extras, call_cell, pack,
                                              flat_t, flat_s0, flat_x)
                  ] if keep_extras else []

    def body(t, state, state_handles, extras_handles):
      inputs_t = [accumulators.read_row(x, t) for x in flat_x]
      state1, step_extras = call_cell(*pack(flat_t, state, inputs_t), t)
      for new, old in zip(state1, state):
        new.set_shape(old.shape)
      state_handles = [acc.write(h, t, s) for acc, h, s in
                       zip(state_accs, state_handles, state1)]
      extras_handles = [acc.write(h, t, e) for acc, h, e in
                        zip(extras_accs, extras_handles,
                            step_extras if keep_extras else [])]
      return t + 1, state1, state_handles, extras_handles

    _, final, state_handles, extras_handles = tf.while_loop(
        lambda t, *_: t < num_steps, body,
        (tf.constant(0, tf.int32), flat_s0,
         [acc.empty() for acc in state_accs],
         [acc.empty() for acc in extras_accs]),
        parallel_iterations=1)
    acc_state = [acc.stack(h) for acc, h in zip(state_accs, state_handles)]
    acc_extras = [acc.stack(h) for acc, h in zip(extras_accs, extras_handles)]

    def grad_fn(*dys, variables=None):
      variables = list(variables or [])
      d_acc = list(dys[:n_state])
      d_final = list(dys[n_state:])
      return _backward(flat_t, flat_s0, flat_x, captured, variables, acc_state,
                       acc_extras, d_acc, d_final, num_steps, total_steps,
                       use_xla, pack, cell_fn, cell_grad, seed_source, theta,
                       state0, inputs, step.extras)

    return acc_state + list(final), grad_fn

  outs = forward(*(flat_theta + flat_state0 + flat_inputs + captured))
  acc_state = tf.nest.pack_sequence_as(state0, outs[:n_state])
  final_state = tf.nest.pack_sequence_as(state0, outs[n_state:])
  return acc_state, final_state


def _extras_templates(extras_spec, call_cell, pack, flat_t, flat_s0, flat_x):
  """One tensor per extras leaf, shaped like a step's extras.

  Statically known shapes need no computation. Otherwise (an unknown batch
  size, say) one step of cell_fn runs on inputs[0] to learn the shapes at run
  time, as the tf.contrib op always did (XLA, knowing the shapes when it
  compiles, drops that step's arithmetic; the TF executor computes it).
  """
  flat_spec = tf.nest.flatten(extras_spec)
  if all(spec.shape.is_fully_defined() for spec in flat_spec):
    return [tf.zeros(spec.shape, spec.dtype) for spec in flat_spec]
  # The first row, or a row of zeros when T is 0 at run time.
  inputs_0 = [tf.pad(x[:1], [[0, 1 - tf.shape(x[:1])[0]]] +
                     [[0, 0]] * (x.shape.rank - 1))[0] for x in flat_x]
  _, step_extras = call_cell(*pack(flat_t, flat_s0, inputs_0), 0)
  return step_extras


def _backward(flat_t, flat_s0, flat_x, captured, variables, acc_state,
              acc_extras, d_acc, d_final, num_steps, total_steps, use_xla,
              pack, cell_fn, cell_grad, seed_source, theta, state0, inputs,
              extras_spec):
  """The reverse loop: one per-step gradient call per step, last to first."""
  diff_state = [structs.is_differentiable(s.dtype) for s in flat_s0]
  diff_theta = [structs.is_differentiable(x.dtype) for x in flat_t]
  diff_inputs = [structs.is_differentiable(x.dtype) for x in flat_x]
  d_acc = [tf.cast(d, s.dtype) if d is not None and ok else None
           for d, s, ok in zip(d_acc, flat_s0, diff_state)]
  dstate_init = [
      tf.cast(d, s.dtype) if d is not None else tf.zeros_like(s)
      for d, s, ok in zip(d_final, flat_s0, diff_state) if ok
  ]
  input_accs = [accumulators.RowAccumulator.like_rows_of(x, use_xla)
                for x, ok in zip(flat_x, diff_inputs) if ok]

  def scatter(flags, values):
    """Expands the differentiable-only list to full length with None."""
    it = iter(values)
    return [next(it) if ok else None for ok in flags]

  def body(t, dstate, dtheta, dcaptured, dvars, dinput_handles):
    # A select, not a tf.cond: a cond costs a function call per step in the
    # TF executor, a select of one row is cheaper.
    first_step = tf.equal(t, 0)
    state_prev = [tf.where(first_step, s0,
                           accumulators.read_row(a, tf.maximum(t - 1, 0)))
                  for a, s0 in zip(acc_state, flat_s0)]
    for s, s0 in zip(state_prev, flat_s0):
      s.set_shape(s0.shape)
    inputs_t = [accumulators.read_row(x, t) for x in flat_x]
    dstate1 = scatter(diff_state, dstate)
    dstate1 = [d if (d is None or a is None) else d + accumulators.read_row(a, t)
               for d, a in zip(dstate1, d_acc)]
    theta_, s_prev, x_t = pack(flat_t, state_prev, inputs_t)
    with cell_grad_lib.seeded_step(seed_source, t):
      if cell_grad is None:
        g_theta, g_state, g_inputs, g_captured, g_vars = (
            cell_grad_lib.recompute_grad(cell_fn, theta_, s_prev, x_t,
                                         dstate1, captured, variables))
      else:
        extras_t = tf.nest.pack_sequence_as(
            extras_spec, [accumulators.read_row(e, t) for e in acc_extras])
        dstate1_struct = tf.nest.pack_sequence_as(
            state0, [tf.zeros_like(s) if d is None else d
                     for d, s in zip(dstate1, state_prev)])
        out = cell_grad(theta_, s_prev, x_t, extras_t, dstate1_struct)
        g_theta, g_state, g_inputs = (tf.nest.flatten(o) for o in out)
        g_captured, g_vars = [], []
    g_theta = _dense(g_theta, flat_t, diff_theta)
    g_state = _dense(g_state, flat_s0, diff_state)
    g_inputs = _dense(g_inputs, inputs_t, diff_inputs)
    dtheta = [a + g for a, g in zip(dtheta, g_theta)]
    dcaptured = [a + _to_dense(g, c) for a, g, c in
                 zip(dcaptured, g_captured, captured)]
    dvars = [a + _to_dense(g, a) for a, g in zip(dvars, g_vars)]
    dinput_handles = [acc.write(h, t, g) for acc, h, g in
                      zip(input_accs, dinput_handles, g_inputs)]
    return t - 1, g_state, dtheta, dcaptured, dvars, dinput_handles

  _, dstate0, dtheta, dcaptured, dvars, dinput_handles = tf.while_loop(
      lambda t, *_: t >= 0, body,
      (num_steps - 1, dstate_init,
       [tf.zeros_like(x) for x, ok in zip(flat_t, diff_theta) if ok],
       [tf.zeros_like(c) for c in captured],
       [tf.zeros_like(v.read_value()) for v in variables],
       [acc.empty() for acc in input_accs]),
      parallel_iterations=1)
  dinputs = [acc.stack(h) for acc, h in zip(input_accs, dinput_handles)]
  input_grads = (scatter(diff_theta, dtheta) + scatter(diff_state, dstate0) +
                 scatter(diff_inputs, dinputs) + list(dcaptured))
  return input_grads, list(dvars)


def _to_dense(grad, like):
  """Densifies IndexedSlices (embedding lookups) and matches dtype."""
  return tf.cast(tf.convert_to_tensor(grad), like.dtype)


def _dense(grads, like, flags):
  """Keeps the differentiable leaves' gradients, None becoming zeros."""
  return [
      tf.zeros_like(x) if g is None else _to_dense(g, x)
      for g, x, ok in zip(grads, like, flags) if ok
  ]
