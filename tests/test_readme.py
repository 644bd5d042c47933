"""The README's and the docs pages' examples run as written, and their links
lead somewhere."""

import os
import pathlib
import re

import pytest
import tensorflow as tf

from conftest import tflite_unavailable_reason

ROOT = pathlib.Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README] + DOCS
FENCE = re.compile(r"```.*?```", re.S)


def _name(page):
  return page.relative_to(ROOT).as_posix()


def _blocks(page):
  return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


BLOCKS = [(page, index, code)
          for page in PAGES for index, code in enumerate(_blocks(page))]
# The pages on which code is the subject; the others (benchmarks, training
# jobs) give commands to run.
PAGES_WITH_EXAMPLES = ["docs/op.md", "docs/keras.md", "docs/migrating.md",
                       "docs/export.md", "docs/seq2seq.md", "docs/linear.md"]


def test_readme_has_examples():
  blocks = _blocks(README)
  assert len(blocks) >= 3
  # One for the op, one for a Keras layer, one for a migration.
  assert any("tf_recurrent.recurrent(" in code for code in blocks)
  assert any("keras.Sequential(" in code and "tf_recurrent.LSTM(" in code
             for code in blocks)
  assert any(re.search(r"^from tf_recurrent import .*# was: ", code, re.M)
             for code in blocks)


def test_readme_table_names_every_docs_page():
  linked = set(re.findall(r"^\| \[(docs/[\w.]+\.md)\]\(\1\)",
                          README.read_text(), re.M))
  assert linked == {_name(page) for page in DOCS}
  assert set(PAGES_WITH_EXAMPLES) <= linked
  for name in PAGES_WITH_EXAMPLES:
    assert _blocks(ROOT / name), f"{name} has no python example"


def _anchors(page):
  headings = re.findall(r"^#+ (.*)$", FENCE.sub("", page.read_text()), re.M)
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
          for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_links_resolve(page):
  text = FENCE.sub("", page.read_text())
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+:", target):
      continue
    path, _, anchor = target.partition("#")
    # A link is relative to its page, ".." taken as written (not through
    # the symlinks of Bazel's runfiles).
    linked = (pathlib.Path(os.path.normpath(page.parent / path)) if path
              else page)
    assert linked.exists(), f"{_name(page)} links {target}"
    if anchor:
      assert anchor in _anchors(linked), f"{_name(page)} links {target}"


@pytest.mark.parametrize(
    "page,code", [pytest.param(page, code, id=f"{_name(page)}-{index}")
                  for page, index, code in BLOCKS])
def test_readme_example_runs(page, code):
  if "tf.lite." in code and tflite_unavailable_reason():
    pytest.skip(tflite_unavailable_reason())
  namespace = {}
  exec(compile(code, str(page), "exec"), namespace)  # pylint: disable=exec-used
  if "model" in namespace:
    assert namespace["model"](tf.ones([2, 5, 8])).shape == (2, 1)
  if "grads" in namespace:
    assert all(g is not None for g in namespace["grads"].values())
