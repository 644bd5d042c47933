"""The default per-step gradient: recompute the step and differentiate it.

The backward loop calls one function per step that maps
`(theta, state0, inputs_t, extras_t, dstate1)` to
`(dtheta, dstate0, dinputs_t)`. Without a user `cell_grad` the step is
recomputed in the reverse loop's graph and differentiated there with
`tf.gradients`, which also yields gradients for the variables and
closed-over tensors `cell_fn` reads.

Recomputing a step must reproduce the forward step exactly, randomness
included: `seeds.py` gives `cell_fn` the seeds that make it so.
"""

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from tf_recurrent.op import structs


def recompute_grad(cell_fn: Callable[..., Any], theta: Any, state0: Any,
                   inputs_t: Any, dstate1: Sequence[Optional[tf.Tensor]],
                   captured: Sequence[tf.Tensor],
                   variables: Sequence[tf.Variable]):
  """The default per-step gradient: recompute the step, differentiate it.

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
  # Cut from whatever computed them: the step's partial derivatives only.
  theta, state0, inputs_t = tf.nest.map_structure(
      tf.stop_gradient, (theta, state0, inputs_t))
  sources = [tf.nest.flatten(theta), tf.nest.flatten(state0),
             tf.nest.flatten(inputs_t)]
  graph = tf.compat.v1.get_default_graph()
  # Capturing first gives us the very placeholders cell_fn will read
  # (captures are memoized per graph): the closed-over tensors, and the
  # handles its variable reads read.
  capture = graph.capture if hasattr(graph, "capture") else (lambda c: c)
  inner_captured = [capture(c) for c in captured]
  handles = [capture(v.handle) for v in variables]
  # tf.gradients, not a GradientTape: under a second tape (a persistent
  # tape recording the caller's tf.function) TensorFlow wraps every tf.cond
  # the step builds in a function whose tape gradient is zero for the
  # cond's captured inputs.
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
  wrt = diff_sources + inner_captured + handles
  grads = (tf.gradients(targets, wrt, grad_ys=seeds) if targets and wrt
           else [None] * len(wrt))
  # Zeros where the step does not depend on a source (a variable's are
  # shaped like its value, not its handle).
  likes = wrt[:len(wrt) - len(handles)] + [v.read_value() for v in variables]
  grads = [tf.zeros_like(like) if g is None else g
           for g, like in zip(grads, likes)]
  flat_grads: List[Optional[tf.Tensor]] = [None] * len(all_sources)
  for i, g in zip(diff_index, grads[:len(diff_index)]):
    flat_grads[i] = g
  n_theta, n_state = len(sources[0]), len(sources[1])
  rest = grads[len(diff_index):]
  return (flat_grads[:n_theta], flat_grads[n_theta:n_theta + n_state],
          flat_grads[n_theta + n_state:], rest[:len(captured)],
          rest[len(captured):])
