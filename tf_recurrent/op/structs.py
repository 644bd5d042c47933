"""Nested-structure helpers and the checks that name the leaf at fault.

Everything the op takes (theta, state0, inputs, extras) is an arbitrary
`tf.nest` structure. The loops work on flat lists of tensors; these helpers
flatten, repack, and compare structures, and turn a mismatch into one
sentence that names the argument and the leaf path (`state0['h']`,
`inputs.x[1]`) together with what was expected.
"""

import collections.abc
from typing import Any, List

import tensorflow as tf


def leaf_paths(struct: Any, root: str) -> List[str]:
  """Returns a readable path for every leaf of `struct`, in `tf.nest` order.

  Args:
    struct: A nested structure (dicts, namedtuples, lists, tuples).
    root: The name of the argument, used as the start of every path.

  Returns:
    A list of strings such as `"state0['h']"` or `"inputs.x[1]"`, one per leaf
    of `tf.nest.flatten(struct)` and in the same order.
  """
  paths = []

  def visit(node, path):
    if isinstance(node, collections.abc.Mapping):
      for key in sorted(node):
        visit(node[key], f"{path}[{key!r}]")
    elif isinstance(node, tuple) and hasattr(node, "_fields"):
      for field in node._fields:
        visit(getattr(node, field), f"{path}.{field}")
    elif isinstance(node, (list, tuple)):
      for i, item in enumerate(node):
        visit(item, f"{path}[{i}]")
    else:
      paths.append(path)

  visit(struct, root)
  if len(paths) != len(tf.nest.flatten(struct)):
    # A container type tf.nest knows but we do not (attrs classes, say):
    # fall back to positional names, which are still unambiguous.
    paths = [f"{root}<leaf {i}>" for i in range(len(tf.nest.flatten(struct)))]
  return paths


def to_tensors(struct: Any, name: str) -> Any:
  """Converts every leaf to a tensor; variables are read, ints stay ints.

  Args:
    struct: A nested structure of tensors, variables, numpy arrays or numbers.
    name: The argument's name, for the error message.

  Returns:
    The same structure with `tf.Tensor` leaves.

  Raises:
    TypeError: If a leaf cannot be converted, naming its path.
  """
  flat = tf.nest.flatten(struct)
  paths = leaf_paths(struct, name)
  out = []
  for path, leaf in zip(paths, flat):
    try:
      out.append(tf.convert_to_tensor(leaf))
    except (TypeError, ValueError) as e:
      raise TypeError(
          f"{path} must be a tensor or convertible to one; got "
          f"{type(leaf).__name__}: {e}") from None
  return tf.nest.pack_sequence_as(struct, out)


def is_differentiable(dtype: tf.DType) -> bool:
  """True for dtypes that carry gradients (floating and complex)."""
  return dtype.is_floating or dtype.is_complex


def describe(value: Any) -> str:
  """A short `shape dtype` description of a tensor-like value."""
  shape = getattr(value, "shape", None)
  dtype = getattr(value, "dtype", None)
  if shape is None or dtype is None:
    return type(value).__name__
  dtype_name = getattr(dtype, "name", str(dtype))
  shape = tf.TensorShape(shape)
  if shape.rank is None:
    return f"{dtype_name} of unknown rank"
  return f"{dtype_name}{shape.as_list()}"


def check_same_structure(expected: Any, actual: Any, expected_name: str,
                         actual_name: str) -> None:
  """Raises a ValueError naming the leaves by which two structures differ.

  Container types may differ (a list where a tuple was given); keys, fields
  and lengths may not.

  Args:
    expected: The reference structure.
    actual: The structure to check.
    expected_name: Name of the reference, e.g. `"state0"`.
    actual_name: Name of the checked value, e.g. `"the state cell_fn returned"`.

  Raises:
    ValueError: If the structures differ.
  """
  want = leaf_paths(expected, "")
  got = leaf_paths(actual, "")
  try:
    tf.nest.assert_same_structure(expected, actual, check_types=False)
    # Without type checks tf.nest ignores dict keys; the paths do not.
    if _positional(want) == _positional(got):
      return
  except (ValueError, TypeError):
    pass
  missing = [p or "<root>" for p in want if p not in got]
  extra = [p or "<root>" for p in got if p not in want]
  detail = []
  if missing:
    detail.append(f"missing leaves {missing}")
  if extra:
    detail.append(f"unexpected leaves {extra}")
  if not detail:
    detail.append(
        f"{len(want)} leaves were expected and {len(got)} were found")
  raise ValueError(
      f"{actual_name} does not match the structure of {expected_name}: "
      f"{'; '.join(detail)}. Expected {_outline(expected)}, got "
      f"{_outline(actual)}.")


def _positional(paths: List[str]) -> List[str]:
  """Paths with namedtuple fields dropped, so a tuple matches a namedtuple."""
  return [p if "[" in p else "" for p in paths]


def _outline(struct: Any) -> str:
  """The structure with each leaf replaced by its shape and dtype."""
  text = repr(tf.nest.map_structure(lambda x: _Leaf(describe(x)), struct))
  return text if len(text) <= 300 else text[:297] + "..."


class _Leaf:
  """Prints as its description, for structure outlines in messages."""

  def __init__(self, text):
    self._text = text

  def __repr__(self):
    return self._text


def check_leaves_match(expected: Any, actual: Any, expected_name: str,
                       actual_name: str, allow_none: bool = False) -> None:
  """Checks structure, then dtype and static shape of every leaf.

  Args:
    expected: The reference structure of tensors (or TensorSpecs).
    actual: The structure to check.
    expected_name: The reference's argument name, used in leaf paths.
    actual_name: What `actual` is, for the message.
    allow_none: Whether a None leaf in `actual` is accepted (a gradient that
      is zero).

  Raises:
    ValueError: Listing every leaf whose dtype or shape differs, and how to
      fix it.
  """
  check_same_structure(expected, actual, expected_name, actual_name)
  paths = leaf_paths(expected, expected_name)
  problems = []
  for path, want, got in zip(paths, tf.nest.flatten(expected),
                             tf.nest.flatten(actual)):
    if got is None and allow_none:
      continue
    got_dtype = getattr(got, "dtype", None)
    if got_dtype is None:
      problems.append(f"the leaf at {path} should be a tensor like "
                      f"{describe(want)}, got {type(got).__name__}")
    elif tf.as_dtype(got_dtype) != tf.as_dtype(want.dtype):
      problems.append(
          f"the leaf at {path} has dtype {tf.as_dtype(got_dtype).name}, "
          f"expected {tf.as_dtype(want.dtype).name} ({describe(want)} vs "
          f"{describe(got)})")
    elif not tf.TensorShape(want.shape).is_compatible_with(got.shape):
      problems.append(
          f"the leaf at {path} has shape {tf.TensorShape(got.shape)}, "
          f"expected {tf.TensorShape(want.shape)}")
  if problems:
    count = f"{len(problems)} lea{'f' if len(problems) == 1 else 'ves'}"
    raise ValueError(
        f"{actual_name} differs from {expected_name} in {count}: "
        f"{'; '.join(problems)}. Return one tensor per leaf of "
        f"{expected_name}, of its dtype (tf.cast) and a compatible static "
        f"shape{' (None for a zero gradient)' if allow_none else ''}.")


def swap_batch_and_time(struct: Any, name: str) -> Any:
  """Transposes every leaf `[B, T, ...]` <-> `[T, B, ...]`.

  Args:
    struct: A nested structure of tensors of rank >= 2 (None leaves pass
      through).
    name: The argument's name, for the error message.

  Returns:
    The structure with the two leading axes of every leaf swapped.

  Raises:
    ValueError: If a leaf has rank < 2, naming it.
  """
  def swap(path, x):
    if x is None:  # A state leaf not accumulated.
      return None
    if x.shape.rank is not None and x.shape.rank < 2:
      raise ValueError(
          f"With time_major=False, {path} must have shape [batch, T, ...]; "
          f"got {describe(x)}.")
    if x.shape.rank is not None:  # A static perm keeps the static shape.
      return tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))
    return tf.transpose(x, tf.concat([[1, 0], tf.range(2, tf.rank(x))], 0))

  flat = tf.nest.flatten(struct)
  return tf.nest.pack_sequence_as(
      struct, [swap(p, x) for p, x in zip(leaf_paths(struct, name),
                                         flat)])
