"""Seeds for randomness inside `cell_fn`, reproducible by the backward pass.

The default gradient recomputes every step, so a step that draws random
numbers (dropout, noise) must draw the very same numbers again. Stateless
random ops do, given the same seed: `step_seed()` hands `cell_fn` seeds that
are pure functions of the op's base seed, the step index and how many seeds
this invocation of `cell_fn` has asked for before. The n-th call (counting
from 0) of `step_seed()` while `cell_fn` runs step t returns

    tf.random.experimental.stateless_fold_in(
        tf.random.experimental.stateless_fold_in(base_seed, t), n)

so two masks drawn in one step differ, every step gets its own numbers, and
the recompute of step t (which calls `cell_fn` again, in the same order)
gets the seeds the forward pass got. `base_seed` is the op's `seed`
argument, or drawn at random once per call of the op when it is None; pass
the same `seed` on every replica for identical draws across replicas.
"""

import contextlib
import threading
from typing import Callable, Optional

import tensorflow as tf

from tf_recurrent.op import unconverted

_scope = threading.local()


@unconverted.entry_point
def step_seed() -> tf.Tensor:
  """Returns a fresh seed for a `tf.random.stateless_*` op in this step.

  Valid only while `cell_fn` runs inside `tf_recurrent.recurrent`. The n-th
  call (from 0) in step t returns
  `stateless_fold_in(stateless_fold_in(base_seed, t), n)`, where
  `base_seed` is the op's `seed` argument (drawn at random once per call of
  the op when not given). Each call within a step thus gets its own seed,
  and the default gradient's recompute of a step, calling `cell_fn` again,
  sees exactly the random numbers its forward pass saw.

  Returns:
    An int32 tensor of shape [2].

  Raises:
    RuntimeError: When called outside a `cell_fn` run by the op.

  Example:

  >>> import tf_recurrent
  >>> def cell_fn(theta, state, x):
  ...   keep = tf.random.stateless_uniform(
  ...       tf.shape(x), seed=tf_recurrent.step_seed()) < 0.5
  ...   noise = tf.random.stateless_normal(
  ...       tf.shape(x), seed=tf_recurrent.step_seed())  # another seed
  ...   h = state["h"] + tf.where(keep, 2.0 * x, 0.0) + 0.1 * noise
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
  return stack[-1].next_seed()


def in_step() -> bool:
  """Whether a `cell_fn` run by `tf_recurrent.recurrent` is being traced
  here, where `step_seed()` gives seeds.

  Example:

  >>> import tf_recurrent
  >>> seen = []
  >>> def cell_fn(theta, state, x):
  ...   seen.append(in_step())
  ...   return state, []
  >>> _ = tf_recurrent.recurrent({}, {"h": tf.zeros([2])}, tf.ones([3, 2]),
  ...                            cell_fn)
  >>> in_step(), all(seen), len(seen) > 0
  (False, True, True)
  """
  return bool(getattr(_scope, "stack", None))


class _SeedFrame:
  """One `cell_fn` invocation: its base seed, step index and calls so far."""

  def __init__(self, base_seed: Callable[[], tf.Tensor], step):
    self._base_seed = base_seed
    self._step = step
    self._step_seed: Optional[tf.Tensor] = None
    self.calls = 0

  @property
  def used(self) -> bool:
    return self.calls > 0

  def next_seed(self) -> tf.Tensor:
    if self._step_seed is None:
      base = tf.cast(self._base_seed(), tf.int32)
      self._step_seed = tf.random.experimental.stateless_fold_in(
          base, tf.cast(self._step, tf.int32))
    seed = tf.random.experimental.stateless_fold_in(self._step_seed,
                                                    self.calls)
    self.calls += 1
    return seed


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


def seed_source(seed) -> Callable[[], tf.Tensor]:
  """A callable giving the base seed: `seed`, or one drawn at most once."""
  drawn = []

  def source():
    if seed is not None:
      return seed
    if not drawn:
      drawn.append(tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int32))
    return drawn[0]

  return source
