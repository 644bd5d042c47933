"""The README's example runs as written."""

import pathlib
import re

import tensorflow as tf


def test_readme_example_runs():
  readme = pathlib.Path(__file__).parent.parent / "README.md"
  blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
  assert blocks
  for block in blocks:
    namespace = {}
    exec(compile(block, str(readme), "exec"), namespace)  # pylint: disable=exec-used
    if "model" in namespace:
      assert namespace["model"](tf.ones([2, 5, 8])).shape == (2, 1)
    if "grads" in namespace:
      assert all(g is not None for g in namespace["grads"].values())
