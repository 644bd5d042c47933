"""The forward loop, the reverse loop, and the custom gradient joining them.

`build` adds both loops for one call of `tf_recurrent.recurrent` to the
current graph. What the forward loop keeps, and how the reverse loop reads
the state entering step t from it, is one storage object used by both
passes (`_storage` picks it):

* `_Rows`: one row per step and state leaf, the returned accumulator (or,
  when only the final state is asked for, an internal one of the carried
  states).
* `_Checkpoints`: every k-th state. The reverse loop walks the segments of k
  steps last to first, recomputes each segment's states from its checkpoint,
  then backprops through it: about T/k + k states held instead of T, for one
  extra forward pass.

Per-example `sequence_length` and an early `stop_fn` act inside one step
(`_Program.step_fn` and `_Program.grad_step_fn`), so every variant shares
them. Outside XLA each step, and each step's gradient, runs as one XLA
cluster where that computes the same (`step_clusters`).
"""

import dataclasses
import math
from typing import Any, Callable, List, Optional, Tuple, Union

import tensorflow as tf

from tf_recurrent.op import accumulators
from tf_recurrent.op import first_order
from tf_recurrent.op import lengths as lengths_lib
from tf_recurrent.op import masks
from tf_recurrent.op import probe as probe_lib
from tf_recurrent.op import recompute
from tf_recurrent.op import seeds
from tf_recurrent.op import step_clusters
from tf_recurrent.op import structs


@dataclasses.dataclass(frozen=True)
class Options:
  """The static choices of one call (hashable: part of the eager cache key).

  Attributes:
    use_xla: Build for XLA whatever the tracing context says (the public
      `use_tpu`).
    returned_rows: Per flat state leaf, whether its rows are returned. Rows
      not returned are still kept for the backward pass (unless
      checkpointing), but get no incoming gradient.
    checkpoint_every: None, a segment length k >= 1, or "sqrt".
    xla_steps: "auto", True or False: whether each step, and each step's
      gradient, runs as one XLA cluster when the loops are not compiled
      (`step_clusters`).
  """
  use_xla: bool
  returned_rows: Tuple[bool, ...]
  checkpoint_every: Union[None, int, str] = None
  xla_steps: step_clusters.XlaSteps = "auto"

  @property
  def returns_rows(self) -> bool:
    return any(self.returned_rows)


def segment_length(checkpoint_every, total_steps):
  """k for `checkpoint_every` (an int, or "sqrt" of T, static when T is)."""
  if checkpoint_every != "sqrt":
    return checkpoint_every
  static_total = tf.get_static_value(total_steps)
  if static_total is not None:
    return max(1, math.isqrt(max(int(static_total) - 1, 0)) + 1)
  root = tf.math.ceil(tf.sqrt(tf.cast(total_steps, tf.float32)))
  return tf.maximum(tf.cast(root, tf.int32), 1)


def build(theta, state0, inputs, cell_fn, cell_grad, stop_fn,
          step: probe_lib.StepProbe, options: Options, max_input_length,
          sequence_length, seed):
  """Builds both loops in the current graph.

  Args:
    theta, state0, inputs: Checked structures of tensors (inputs
      time-major).
    cell_fn, cell_grad, stop_fn: The user's callables (the last two may be
      None).
    step: What probing one step of `cell_fn` revealed.
    options: The static choices of this call.
    max_input_length: None, or a scalar int (Python or tensor).
    sequence_length: None, or `[B]` int32 lengths.
    seed: None, or the int `[2]` base seed for `step_seed()`.

  Returns:
    `(acc_state, final_state)`; `acc_state` has the structure of `state0`,
    its leaves not in `options.returned_rows` being None.
  """
  use_xla = options.use_xla or accumulators.in_xla_context()
  program = _Program(theta, state0, inputs, cell_fn, cell_grad, stop_fn,
                     step, use_xla, sequence_length, seed, options.xla_steps)
  flat_theta = tf.nest.flatten(theta)
  flat_state0 = tf.nest.flatten(state0)
  flat_inputs = tf.nest.flatten(inputs)
  captured = list(step.captured)
  n_theta, n_state = len(flat_theta), len(flat_state0)
  n_inputs = len(flat_inputs)
  total_steps = tf.shape(flat_inputs[0], out_type=tf.int32)[0]
  limit = _step_limit(total_steps, flat_inputs, max_input_length,
                      program.lengths, use_xla)
  storage = _storage(options, total_steps)
  # With checkpointing asked for, a custom cell_grad's extras are recomputed
  # per step instead of kept, even when every state row is kept anyway.
  keep_extras = program.has_extras and options.checkpoint_every is None

  @tf.custom_gradient
  def forward(*args):
    flat_t = list(args[:n_theta])
    flat_s0 = list(args[n_theta:n_theta + n_state])
    flat_x = list(args[n_theta + n_state:n_theta + n_state + n_inputs])
    # The loop unrecorded: its gradient is grad_fn's (see first_order).
    with first_order.unrecorded():
      sinks = storage.sinks(flat_s0, total_steps, use_xla)
      extras_sinks = []
      if keep_extras:
        extras_sinks = [
            _RowSink(e, total_steps, use_xla, lambda s_in, out, i=i:
                     out.extras[i])
            for i, e in enumerate(program.extras_templates(flat_t, flat_s0,
                                                           flat_x))]
      n_run, final, handles = program.run_forward(
          flat_t, flat_x, 0, limit, flat_s0, sinks + extras_sinks,
          with_stop=True)
      kept = [sink.stack(h) for sink, h in zip(sinks + extras_sinks,
                                               handles)]
    kept, kept_extras = kept[:len(sinks)], kept[len(sinks):]
    returned_acc = storage.returned(kept)
    # What the reverse loop reads of the forward loop, behind an identity
    # TensorFlow does not differentiate past (see first_order).
    saved_for_backward = first_order.saved_for_backward(
        [n_run, kept, list(final), kept_extras])

    def grad_fn(*dys, variables=None):
      def reverse(dys, flat_t, flat_s0, flat_x, n_run, kept, final,
                  kept_extras):
        d_returned = list(dys[:len(returned_acc)])
        d_final = list(dys[len(returned_acc):])
        # Unrecorded as the forward loop (the user's step recorded).
        with first_order.unrecorded():
          carry = program.initial_grad_carry(flat_t, flat_s0, flat_x,
                                             d_final, variables)
          carry = storage.reverse(program, flat_t, flat_s0, flat_x, n_run,
                                  kept, final,
                                  kept_extras if keep_extras else None,
                                  d_returned, carry)
          return program.finish_grads(carry)

      # The reverse loop cuts each step's inputs from the graph: its own
      # gradient would be wrong, so it fails instead.
      return first_order.first_order_only(
          reverse, [list(dys), flat_t, flat_s0, flat_x,
                    *saved_for_backward],
          watch=[list(dys), flat_t, flat_s0, flat_x, captured],
          what="tf_recurrent.recurrent",
          remedy="For a second order differentiate a static unroll, "
          "tf.scan or a tf.while_loop with autodiff.")

    return returned_acc + list(final), grad_fn

  outs = forward(*(flat_theta + flat_state0 + flat_inputs + captured))
  n_acc = sum(options.returned_rows)
  acc_outs = iter(outs[:n_acc])
  acc_state = tf.nest.pack_sequence_as(
      state0, [next(acc_outs) if r else None for r in options.returned_rows])
  final_state = tf.nest.pack_sequence_as(state0, outs[n_acc:])
  return acc_state, final_state


def _storage(options: Options, total_steps):
  """How the forward pass keeps what the backward pass reads."""
  k = options.checkpoint_every
  if k is None or k == 1 or options.returns_rows:
    # Rows are kept anyway (returned, or k=1): checkpoints would hold no less.
    return _Rows(options.returned_rows)
  return _Checkpoints(segment_length(k, total_steps))


class _RowSink:
  """One accumulator written every step: `acc[index(t)] = value(s_in, out)`."""

  def __init__(self, template, num_rows, use_xla, value_fn,
               index_fn=lambda t: t):
    self.acc = accumulators.RowAccumulator(template, num_rows, use_xla)
    self.value_fn, self.index_fn = value_fn, index_fn

  def empty(self):
    return self.acc.empty()

  def write(self, handle, t, state_in, out):
    return self.acc.write(handle, self.index_fn(t),
                          self.value_fn(state_in, out))

  def stack(self, handle):
    return self.acc.stack(handle)


class _Rows:
  """Storage: one row per step and state leaf.

  When any leaf is returned, every leaf's rows are the returned rows (zeros
  for an example past its length: `_StepOut.row`); otherwise they are
  internal and hold the carried state (`_StepOut.carry`). The reverse loop
  reads the state entering step t from row t - 1.
  """

  def __init__(self, returned_rows: Tuple[bool, ...]):
    self.returned_rows = returned_rows
    self.returns = any(returned_rows)

  def sinks(self, flat_s0, total_steps, use_xla):
    return [_RowSink(s, total_steps, use_xla,
                     (lambda s_in, out, i=i: out.row[i]) if self.returns else
                     (lambda s_in, out, i=i: out.carry[i]))
            for i, s in enumerate(flat_s0)]

  def returned(self, kept):
    return [rows for rows, r in zip(kept, self.returned_rows) if r]

  def reverse(self, program, flat_t, flat_s0, flat_x, n_run, kept, final,
              extras, d_returned, carry):
    d_iter = iter(d_returned)
    d_rows = [next(d_iter) if r else None for r in self.returned_rows]
    return program.reverse_rows(flat_t, flat_s0, flat_x, n_run, kept,
                                self.returns, final, extras, d_rows, carry)


class _Checkpoints:
  """Storage: the state entering every k-th step (final state only).

  Row t // k holds the state entering step t when t % k == 0; other steps
  write a spare last row. The reverse loop recomputes each segment of k
  steps from its checkpoint, then backprops through it.
  """

  returns = False

  def __init__(self, k):
    self.k = k

  def sinks(self, flat_s0, total_steps, use_xla):
    k = self.k
    num_segments = (total_steps + k - 1) // k
    return [_RowSink(s, num_segments + 1, use_xla,
                     lambda s_in, out, i=i: s_in[i],
                     # tf.equal, not ==: in a TF1 graph `==` compares
                     # tensors by identity and would always be False.
                     lambda t: tf.where(tf.equal(t % k, 0), t // k,
                                        num_segments))
            for i, s in enumerate(flat_s0)]

  def returned(self, kept):
    del kept
    return []

  def reverse(self, program, flat_t, flat_s0, flat_x, n_run, kept, final,
              extras, d_returned, carry):
    del flat_s0, final, extras, d_returned
    return program.reverse_segments(flat_t, flat_x, n_run, self.k, kept,
                                    carry)


def _step_limit(total_steps, flat_inputs, max_input_length, lengths,
                use_xla):
  """How many steps at most run: T, max_input_length, the longest length.

  Values known only at run time are checked then (XLA has no run-time
  assertions). The limit depends on those checks, so they run wherever the
  loops do: in a TF1 graph, where no automatic control dependencies exist,
  an assertion nothing depends on would never run.
  """
  limit = total_steps
  checks = []
  check_at_run_time = not use_xla
  if max_input_length is not None:
    limit = tf.cast(max_input_length, tf.int32)
    if check_at_run_time and tf.get_static_value(max_input_length) is None:
      checks.append(tf.debugging.assert_less_equal(
          limit, total_steps,
          message="max_input_length exceeds T, the number of steps of the inputs"))
      checks.append(tf.debugging.assert_non_negative(
          limit, message="max_input_length must be >= 0"))
    limit = tf.clip_by_value(limit, 0, total_steps)
  if lengths is not None:
    if check_at_run_time and tf.get_static_value(lengths) is None:
      checks += lengths_lib.assert_in_range(lengths, total_steps)
    limit = tf.minimum(limit, tf.reduce_max(
        tf.concat([lengths, [0]], 0)))
  if len(flat_inputs) > 1 and check_at_run_time:
    for x in flat_inputs[1:]:
      checks.append(tf.debugging.assert_equal(
          tf.shape(x, out_type=tf.int32)[0], total_steps,
          message="inputs disagree on the number of steps T"))
  checks = [c for c in checks if c is not None]  # None when run eagerly.
  if checks:
    with tf.control_dependencies(checks):
      limit = tf.identity(limit)
  return limit


@dataclasses.dataclass
class _StepOut:
  """What one forward step yields: the carried state, the row, the extras."""
  carry: List[tf.Tensor]
  row: List[tf.Tensor]
  extras: List[tf.Tensor]


@dataclasses.dataclass
class _GradCarry:
  """The reverse loop's running sums (differentiable leaves only)."""
  dstate: List[tf.Tensor]
  dtheta: List[tf.Tensor]
  dcaptured: List[tf.Tensor]
  dvars: List[tf.Tensor]
  dinput_handles: List[tf.Tensor]

  def as_list(self):
    return [self.dstate, self.dtheta, self.dcaptured, self.dvars,
            self.dinput_handles]


class _Program:
  """One call's step, per-step gradient, and loops over a range of steps."""

  def __init__(self, theta, state0, inputs, cell_fn, cell_grad, stop_fn,
               step, use_xla, lengths, seed, xla_steps):
    self.theta, self.state0, self.inputs = theta, state0, inputs
    self.cell_fn, self.cell_grad, self.stop_fn = cell_fn, cell_grad, stop_fn
    self.extras_spec = step.extras
    self.captured = list(step.captured)
    self.use_xla = use_xla
    self.xla_steps = xla_steps
    self.lengths = lengths
    self.has_extras = cell_grad is not None
    source = seeds.seed_source(seed)
    base_seed = source() if step.uses_step_seed else None
    self.seed_source = (lambda: base_seed) if base_seed is not None else (
        source)
    flat = [tf.nest.flatten(s) for s in (theta, state0, inputs)]
    self.diff_theta, self.diff_state, self.diff_inputs = (
        [structs.is_differentiable(x.dtype) for x in f] for f in flat)
    self.input_accs = []
    self.variables = []
  # The forward step.

  def pack(self, flat_t, flat_s, flat_x):
    return (tf.nest.pack_sequence_as(self.theta, flat_t),
            tf.nest.pack_sequence_as(self.state0, flat_s),
            tf.nest.pack_sequence_as(self.inputs, flat_x))

  def call_cell(self, flat_t, flat_s, flat_x_t, t):
    """`cell_fn` on flat lists; returns flat (state1, extras)."""
    with seeds.seeded_step(self.seed_source, t), first_order.recorded():
      state1, extras = self.cell_fn(*self.pack(flat_t, flat_s, flat_x_t))
    state1 = tf.nest.flatten(state1)
    for new, old in zip(state1, flat_s):
      new.set_shape(old.shape)
    return state1, tf.nest.flatten(extras)

  def step_fn(self) -> Callable[..., _StepOut]:
    """`step(flat_t, flat_x, t, state)` for one loop body (clustered or
    not, `step_clusters`)."""
    on_row = step_clusters.wrap(self._step_on_row, self.xla_steps,
                                self.use_xla, "forward step")

    def step(flat_t, flat_x, t, state):
      inputs_t = [accumulators.read_row(x, t) for x in flat_x]
      out = _StepOut(*on_row(flat_t, inputs_t, t, state))
      for new, old in zip(out.carry, state):
        new.set_shape(old.shape)
      return out

    return step

  def _step_on_row(self, flat_t, inputs_t, t, state):
    """Step t on its input row: examples past their length carry their
    state, write zeros. Returns `_StepOut`'s fields."""
    state1, extras = self.call_cell(flat_t, state, inputs_t, t)
    if self.lengths is None:
      return state1, state1, extras
    running = lengths_lib.step_mask(self.lengths, t)
    return ([masks.select(running, new, old)
             for new, old in zip(state1, state)],
            [masks.zero_where_off(running, new) for new in state1],
            extras)

  def extras_templates(self, flat_t, flat_s0, flat_x):
    """One tensor per extras leaf, shaped like a step's extras.

    Statically known shapes need no computation. Otherwise (an unknown batch
    size, say) one step of cell_fn runs on inputs[0] to learn the shapes at
    run time, as the tf.contrib op always did (XLA, knowing the shapes when it
    compiles, drops that step's arithmetic; the TF executor computes it).
    """
    flat_spec = tf.nest.flatten(self.extras_spec)
    if all(spec.shape.is_fully_defined() for spec in flat_spec):
      return [tf.zeros(spec.shape, spec.dtype) for spec in flat_spec]
    # The first row, or a row of zeros when T is 0 at run time.
    inputs_0 = [tf.pad(x[:1], [[0, 1 - tf.shape(x[:1])[0]]] +
                       [[0, 0]] * (x.shape.rank - 1))[0] for x in flat_x]
    return self.call_cell(flat_t, flat_s0, inputs_0, 0)[1]

  def run_forward(self, flat_t, flat_x, start, stop, state, sinks,
                  with_stop):
    """Runs steps [start, stop) (or until `stop_fn`), writing every sink.

    Args:
      sinks: `_RowSink`s, each written once per step.
      with_stop: Whether `stop_fn` may end the loop early.

    Returns:
      `(t_end, state, handles)`: the first step not run, the state entering
      it, and the sinks' accumulators.
    """
    def cond(t, state, handles):
      del handles
      running = t < stop
      if with_stop and self.stop_fn is not None:
        theta_, state_, _ = self.pack(flat_t, state, flat_x)
        with first_order.recorded():
          stop_now = tf.reshape(self.stop_fn(t, theta_, state_), [])
        running = tf.logical_and(running, tf.logical_not(stop_now))
      return running

    step = self.step_fn()

    def body(t, state, handles):
      out = step(flat_t, flat_x, t, state)
      handles = [sink.write(h, t, state, out)
                 for sink, h in zip(sinks, handles)]
      return t + 1, out.carry, handles

    return tf.while_loop(
        cond, body,
        (tf.convert_to_tensor(start, tf.int32), list(state),
         [sink.empty() for sink in sinks]),
        parallel_iterations=1)

  # The per-step gradient.

  def initial_grad_carry(self, flat_t, flat_s0, flat_x, d_final, variables):
    """The reverse loop's starting sums; also binds what only the gradient
    call knows (the variables read, the input-gradient accumulators)."""
    self.variables = list(variables or [])
    self.input_accs = [accumulators.RowAccumulator.like_rows_of(x, self.use_xla)
                       for x, ok in zip(flat_x, self.diff_inputs) if ok]
    return _GradCarry(
        dstate=[tf.cast(d, s.dtype) if d is not None else tf.zeros_like(s)
                for d, s, ok in zip(d_final, flat_s0, self.diff_state) if ok],
        dtheta=[tf.zeros_like(x) for x, ok in zip(flat_t, self.diff_theta)
                if ok],
        dcaptured=[tf.zeros_like(c) for c in self.captured],
        dvars=[tf.zeros_like(v.read_value()) for v in self.variables],
        dinput_handles=[acc.empty() for acc in self.input_accs])

  def grad_step_fn(self) -> Callable[..., _GradCarry]:
    """`grad_step(flat_t, flat_x, t, state_prev, extras_t, d_row, carry)`
    for one loop body: backprops step t, given the state entering it and
    d(row t). The step's gradients and the running sums are one XLA cluster
    or plain ops (`step_clusters`); the rows are read and written outside."""
    sums = step_clusters.wrap(self._grad_sums, self.xla_steps, self.use_xla,
                              "gradient step")

    def grad_step(flat_t, flat_x, t, state_prev, extras_t, d_row,
                  carry: _GradCarry) -> _GradCarry:
      inputs_t = [accumulators.read_row(x, t) for x in flat_x]
      dstate, dtheta, dcaptured, dvars, g_inputs = sums(
          flat_t, inputs_t, t, state_prev, extras_t, d_row, carry.dstate,
          carry.dtheta, carry.dcaptured, carry.dvars)
      for new, old in zip(dstate + dtheta + dcaptured + dvars,
                          carry.dstate + carry.dtheta + carry.dcaptured +
                          carry.dvars):
        new.set_shape(old.shape)
      return _GradCarry(
          dstate=dstate, dtheta=dtheta, dcaptured=dcaptured, dvars=dvars,
          dinput_handles=[acc.write(h, t, g) for acc, h, g in
                          zip(self.input_accs, carry.dinput_handles,
                              g_inputs)])

    return grad_step

  def _grad_sums(self, flat_t, inputs_t, t, state_prev, extras_t, d_row,
                 dstate, dtheta, dcaptured, dvars):
    """Step t's gradients added to the running sums (`_GradCarry`'s first
    four fields, in order); also returns d(inputs[t])."""
    dstate1 = _scatter(self.diff_state, dstate)
    dstate1 = [d if (d is None or r is None) else d + tf.cast(r, d.dtype)
               for d, r in zip(dstate1, d_row)]
    running = None
    dcell = dstate1
    if self.lengths is not None:
      running = lengths_lib.step_mask(self.lengths, t)
      dcell = [None if d is None else masks.zero_where_off(running, d)
               for d in dstate1]
    g_theta, g_state, g_inputs, g_captured, g_vars = self.step_grads(
        flat_t, state_prev, inputs_t, extras_t, dcell, t)
    if running is not None:
      # Finished examples pass their state gradient straight through.
      g_state = [masks.select(running, g, d) for g, d in zip(g_state, dstate)]
      g_inputs = [masks.zero_where_off(running, g) for g in g_inputs]
    return (g_state,
            [a + g for a, g in zip(dtheta, g_theta)],
            # add_n: it also sums TensorList gradients (variant tensors).
            [tf.math.add_n([a, g]) for a, g in zip(dcaptured, g_captured)],
            [a + g for a, g in zip(dvars, g_vars)],
            g_inputs)

  def step_grads(self, flat_t, state_prev, inputs_t, extras_t, dcell, t):
    """Step t's gradients, given d(state leaving it) (`dcell`, flat).

    Returns:
      Flat lists `(dtheta, dstate0, dinputs, dcaptured, dvariables)`,
      dense, for the differentiable leaves only.
    """
    theta_, s_prev, x_t = self.pack(flat_t, state_prev, inputs_t)
    with seeds.seeded_step(self.seed_source, t):
      if self.cell_grad is None:
        g_theta, g_state, g_inputs, g_captured, g_vars = (
            recompute.recompute_grad(self.cell_fn, theta_, s_prev, x_t,
                                     dcell, self.captured, self.variables))
      else:
        if extras_t is None:  # Recomputed rather than kept.
          extras_t = self.call_cell(flat_t, state_prev, inputs_t, t)[1]
        extras_t = tf.nest.pack_sequence_as(self.extras_spec, extras_t)
        dcell_struct = tf.nest.pack_sequence_as(
            self.state0, [tf.zeros_like(s) if d is None else d
                          for d, s in zip(dcell, state_prev)])
        # cell_grad sees values of this step only. In a TF1 graph the state
        # entering step t is still wired through the forward loop to theta
        # and the inputs, so a cell_grad that differentiates its recomputed
        # step with tf.gradients would get total derivatives through every
        # earlier step instead of the step's partial ones.
        with first_order.recorded():
          out = self.cell_grad(*_step_local(
              (theta_, s_prev, x_t, extras_t, dcell_struct)))
        g_theta, g_state, g_inputs = (tf.nest.flatten(o) for o in out)
        g_captured, g_vars = [], []
    return (_dense(g_theta, flat_t, self.diff_theta),
            _dense(g_state, state_prev, self.diff_state),
            _dense(g_inputs, inputs_t, self.diff_inputs),
            [_to_dense(g, c) for g, c in zip(g_captured, self.captured)],
            [_to_dense(g, v) for g, v in zip(g_vars, self.variables)])

  def run_reverse(self, flat_t, flat_x, start, stop, carry, state_prev_fn,
                  extras_fn, d_rows):
    """Backprops steps stop-1 down to start."""
    grad_step = self.grad_step_fn()

    def body(t, *parts):
      carry = _GradCarry(*parts)
      d_row = [None if d is None else accumulators.read_row(d, t)
               for d in d_rows]
      state_prev = state_prev_fn(t)
      for s, s0 in zip(state_prev, tf.nest.flatten(self.state0)):
        s.set_shape(s0.shape)
      carry = grad_step(flat_t, flat_x, t, state_prev, extras_fn(t), d_row,
                        carry)
      return [t - 1] + carry.as_list()

    out = tf.while_loop(lambda t, *_: t >= start, body,
                        [stop - 1] + carry.as_list(), parallel_iterations=1)
    return _GradCarry(*out[1:])

  def reverse_rows(self, flat_t, flat_s0, flat_x, n_run, rows, rows_zeroed,
                   final, extras, d_acc, carry):
    """The reverse loop over all steps, reading states from kept rows."""
    def state_prev_fn(t):
      # A select, not a tf.cond: a cond costs a function call per step in
      # the TF executor, a select of one row is cheaper.
      prev = [tf.where(tf.equal(t, 0), s0,
                       accumulators.read_row(r, tf.maximum(t - 1, 0)))
              for r, s0 in zip(rows, flat_s0)]
      if rows_zeroed and self.lengths is not None:
        # A finished example's row is zeros; its state is its final state.
        ran = lengths_lib.step_mask(self.lengths, t - 1)
        prev = [tf.where(tf.equal(t, 0), s0, masks.select(ran, p, f))
                for p, f, s0 in zip(prev, final, flat_s0)]
      return prev

    def extras_fn(t):
      if extras is None:
        return None
      return [accumulators.read_row(e, t) for e in extras]

    d_rows = [d if d is not None and ok else None
              for d, ok in zip(d_acc, self.diff_state)]
    return self.run_reverse(flat_t, flat_x, 0, n_run, carry, state_prev_fn,
                            extras_fn, d_rows)

  def reverse_segments(self, flat_t, flat_x, n_run, k, checkpoints, carry):
    """The reverse loop by segments of k steps, each recomputed first."""
    num_segments = (n_run + k - 1) // k

    def body(j, *parts):
      start = j * k
      stop = tf.minimum(start + k, n_run)
      ckpt = [accumulators.read_row(c, j) for c in checkpoints]
      at = lambda t: t - start  # Rows of this segment.
      sinks = [_RowSink(s, k, self.use_xla,
                        lambda s_in, out, i=i: out.carry[i], at)
               for i, s in enumerate(ckpt)]
      n_state = len(sinks)
      if self.has_extras:
        sinks += [_RowSink(e, k, self.use_xla,
                           lambda s_in, out, i=i: out.extras[i], at)
                  for i, e in enumerate(self.extras_templates(flat_t, ckpt,
                                                              flat_x))]
      _, _, handles = self.run_forward(flat_t, flat_x, start, stop, ckpt,
                                       sinks, with_stop=False)
      seg = [sink.stack(h) for sink, h in zip(sinks, handles)]
      seg_states, seg_extras = seg[:n_state], seg[n_state:]

      def state_prev_fn(t):
        return [tf.where(tf.equal(t, start), c,
                         accumulators.read_row(r, tf.maximum(t - start - 1, 0)))
                for r, c in zip(seg_states, ckpt)]

      def extras_fn(t):
        if not self.has_extras:
          return None
        return [accumulators.read_row(e, t - start) for e in seg_extras]

      out = self.run_reverse(flat_t, flat_x, start, stop, _GradCarry(*parts),
                             state_prev_fn, extras_fn,
                             [None] * len(self.diff_state))
      return [j - 1] + out.as_list()

    out = tf.while_loop(lambda j, *_: j >= 0, body,
                        [num_segments - 1] + carry.as_list(),
                        parallel_iterations=1)
    return _GradCarry(*out[1:])

  def finish_grads(self, carry: _GradCarry):
    """The custom gradient's `(input_grads, variable_grads)`."""
    dinputs = [acc.stack(h) for acc, h in
               zip(self.input_accs, carry.dinput_handles)]
    input_grads = (_scatter(self.diff_theta, carry.dtheta) +
                   _scatter(self.diff_state, carry.dstate) +
                   _scatter(self.diff_inputs, dinputs) +
                   list(carry.dcaptured))
    return input_grads, list(carry.dvars)


def _step_local(structure):
  """`structure` cut from the graph that computed it (tf.stop_gradient).

  Non-tensor leaves (None) pass through unchanged.
  """
  return tf.nest.map_structure(
      lambda x: x if x is None else tf.stop_gradient(x), structure)


def _scatter(flags, values) -> List[Optional[tf.Tensor]]:
  """Expands a differentiable-only list to full length with None."""
  it = iter(values)
  return [next(it) if ok else None for ok in flags]


def _to_dense(grad, like):
  """Densifies IndexedSlices (embedding lookups) and matches dtype."""
  return tf.cast(tf.convert_to_tensor(grad), like.dtype)


def _dense(grads, like, flags):
  """Keeps the differentiable leaves' gradients, None becoming zeros."""
  return [
      tf.zeros_like(x) if g is None else _to_dense(g, x)
      for g, x, ok in zip(grads, like, flags) if ok
  ]
