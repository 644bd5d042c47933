#!/usr/bin/env bash
# Writes .bazelrc.local: the python3 on PATH (the one with TensorFlow and the
# test extra installed) for Bazel's Python targets, and the absolute paths of
# the local stand-ins for Bazel's own external repositories (Bazel 4 takes
# only absolute paths there, and would otherwise download them).
set -euo pipefail
cd "$(dirname "$0")/.."
python="$(python3 -c 'import sys; print(sys.executable)')"
stand_ins="$(pwd)/third_party/bazel"
{
  printf 'build --python_path=%s\n' "$python"
  for repo in rules_cc rules_java remote_coverage_tools; do
    printf 'common --override_repository=%s=%s/%s\n' "$repo" "$stand_ins" "$repo"
  done
} > .bazelrc.local
echo "Bazel will run Python targets with $python"
