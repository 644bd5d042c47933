"""The README's examples run as written."""

import pathlib
import re

import pytest
import tensorflow as tf

from conftest import tflite_unavailable_reason

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
  assert len(BLOCKS) >= 3


@pytest.mark.parametrize("block", range(len(BLOCKS)))
def test_readme_example_runs(block):
  code = BLOCKS[block]
  if "tf.lite." in code and tflite_unavailable_reason():
    pytest.skip(tflite_unavailable_reason())
  namespace = {}
  exec(compile(code, str(README), "exec"), namespace)  # pylint: disable=exec-used
  if "model" in namespace:
    assert namespace["model"](tf.ones([2, 5, 8])).shape == (2, 1)
  if "grads" in namespace:
    assert all(g is not None for g in namespace["grads"].values())
