"""Runs pytest on the paths given as arguments (the Bazel py_test entry)."""

import sys

import pytest

if __name__ == "__main__":
  sys.exit(pytest.main(sys.argv[1:] + ["-p", "no:cacheprovider"]))
