"""The default per-step gradient: recompute the step under a tape.

The backward loop calls one function per step that maps
`(theta, state0, inputs_t, extras_t, dstate1)` to
`(dtheta, dstate0, dinputs_t)`. Without a user `cell_grad` the step is
recomputed under a `tf.GradientTape`, which also yields gradients for the
variables and closed-over tensors `cell_fn` reads.

Recomputing a step must reproduce the forward step exactly, randomness
included: `seeds.py` gives `cell_fn` the seeds that make it so.
"""

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from tf_recurrent import structs


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
