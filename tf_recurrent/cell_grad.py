"""Per-step gradients: the default recomputing cell_grad, and step seeds.

The backward loop calls one function per step that maps
`(theta, state0, inputs_t, extras_t, dstate1)` to
`(dtheta, dstate0, dinputs_t)`. Without a user `cell_grad` the step is
recomputed under a `tf.GradientTape`, which also yields gradients for the
variables and closed-over tensors `cell_fn` reads.

Recomputing a step must reproduce the forward step exactly, randomness
included. `step_seed()` gives `cell_fn` a seed for stateless RNG ops that is a
pure function of the op's base seed and the step index, so the recompute
draws the very numbers the forward pass drew.
"""

import contextlib
import threading
from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from tf_recurrent import structs

_scope = threading.local()


def step_seed() -> tf.Tensor:
  """Returns the seed of the current step, for `tf.random.stateless_*` ops.

  Valid only while `cell_fn` runs inside `tf_recurrent.recurrent`. The seed is
  derived from the op's `seed` argument (drawn at random once per call when
  not given) and the step index, so the default gradient's recompute of a
  step sees exactly the random numbers its forward pass saw.

  Returns:
    An int32 tensor of shape [2].

  Raises:
    RuntimeError: When called outside a `cell_fn` run by the op.

  Example:

  >>> import tf_recurrent
  >>> def cell_fn(theta, state, x):
  ...   keep = tf.random.stateless_uniform(
  ...       tf.shape(x), seed=tf_recurrent.step_seed()) < 0.5
  ...   h = state["h"] + tf.where(keep, 2.0 * x, 0.0)
  ...   return {"h": h}, []
  >>> acc, final = tf_recurrent.recurrent(
  ...     theta={}, state0={"h": tf.zeros([3])}, inputs=tf.ones([4, 3]),
  ...     cell_fn=cell_fn, seed=[1, 2])
  >>> acc["h"].shape
  TensorShape([4, 3])
  """
  stack = getattr(_scope, "stack", None)
  if not stack:
    raise RuntimeError(
        "tf_recurrent.step_seed() was called outside a cell_fn run by "
        "tf_recurrent.recurrent; it has no step to seed.")
  frame = stack[-1]
  frame.used = True
  if frame.seed is None:
    base = tf.cast(frame.base_seed(), tf.int32)
    frame.seed = tf.random.experimental.stateless_fold_in(
        base, tf.cast(frame.step, tf.int32))
  return frame.seed


class _SeedFrame:
  """One `cell_fn` invocation's seed: a base seed and a step index."""

  def __init__(self, base_seed: Callable[[], tf.Tensor], step):
    self.base_seed = base_seed
    self.step = step
    self.seed = None
    self.used = False


@contextlib.contextmanager
def seeded_step(base_seed: Callable[[], tf.Tensor], step):
  """Makes `step_seed()` available while `cell_fn` runs for step `step`.

  Args:
    base_seed: A callable returning the op's base seed (int [2]); called
      only if `cell_fn` asks for a seed.
    step: The step index (scalar int tensor or Python int).

  Yields:
    The frame; its `used` attribute tells whether `cell_fn` asked for a seed.
  """
  stack = getattr(_scope, "stack", None)
  if stack is None:
    stack = _scope.stack = []
  frame = _SeedFrame(base_seed, step)
  stack.append(frame)
  try:
    yield frame
  finally:
    stack.pop()


def recompute_grad(cell_fn: Callable[..., Any], theta: Any, state0: Any,
                   inputs_t: Any, dstate1: Sequence[Optional[tf.Tensor]],
                   captured: Sequence[tf.Tensor],
                   variables: Sequence[tf.Variable]):
  """The default per-step gradient: recompute the step under a tape.

  Extras are ignored; only the state the step returns is differentiated.

  Args:
    cell_fn: The user's step function.
    theta: Structure of tensors, as the forward pass saw it.
    state0: Structure of tensors, the state entering the step.
    inputs_t: Structure of tensors, the step's input slice.
    dstate1: Flat list (one per state leaf) of gradients of the state leaving
      the step; None for leaves that carry no gradient (integer leaves).
    captured: Tensors from an outer graph that `cell_fn` closes over and that
      may need gradients.
    variables: Trainable variables `cell_fn` reads.

  Returns:
    A tuple of flat lists `(dtheta, dstate0, dinputs, dcaptured, dvariables)`;
    entries for non-differentiable leaves are None, the others are tensors
    (zeros where the step does not depend on a leaf).
  """
  sources = [tf.nest.flatten(theta), tf.nest.flatten(state0),
             tf.nest.flatten(inputs_t)]
  graph = tf.compat.v1.get_default_graph()
  with tf.GradientTape(watch_accessed_variables=False) as tape:
    # Capturing first gives us the very placeholders cell_fn will read, so
    # the tape can watch them; captures are memoized per graph.
    inner_captured = [graph.capture(c) if hasattr(graph, "capture") else c
                      for c in captured]
    for flat in sources:
      tape.watch([x for x in flat if structs.is_differentiable(x.dtype)])
    tape.watch(inner_captured)
    for v in variables:
      tape.watch(v)
    state1, _ = cell_fn(theta, state0, inputs_t)
  flat_state1 = tf.nest.flatten(state1)
  targets, seeds = [], []
  for y, dy in zip(flat_state1, dstate1):
    if dy is not None and structs.is_differentiable(y.dtype):
      targets.append(y)
      seeds.append(tf.cast(dy, y.dtype))
  all_sources = [x for flat in sources for x in flat]
  diff_index = [i for i, x in enumerate(all_sources)
                if structs.is_differentiable(x.dtype)]
  diff_sources = [all_sources[i] for i in diff_index]
  wrt = diff_sources + list(inner_captured) + list(variables)
  if targets and wrt:
    grads = tape.gradient(
        targets, wrt, output_gradients=seeds,
        unconnected_gradients=tf.UnconnectedGradients.ZERO)
  else:
    grads = [tf.zeros_like(x) if not isinstance(x, tf.Variable)
             else tf.zeros_like(x.read_value()) for x in wrt]
  flat_grads: List[Optional[tf.Tensor]] = [None] * len(all_sources)
  for i, g in zip(diff_index, grads[:len(diff_index)]):
    flat_grads[i] = g
  n_theta, n_state = len(sources[0]), len(sources[1])
  rest = grads[len(diff_index):]
  return (flat_grads[:n_theta], flat_grads[n_theta:n_theta + n_state],
          flat_grads[n_theta + n_state:], rest[:len(captured)],
          rest[len(captured):])
