"""ARCHITECTURE.md's floors, checked on the sources: a folder of
`tf_recurrent/` imports only the folders its table lists (never one above
it), and no module reads another module's private (underscored) names."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).parent.parent / "tf_recurrent"

# ARCHITECTURE.md's table: each folder and the folders of ours it imports.
IMPORTS = {
    "op": set(),
    "linear": {"op"},
    "chunked": {"op"},
    "engine": {"chunked", "op"},
    "layers": {"engine", "linear", "op"},
    "compat": {"engine", "op"},
    "export": {"engine"},
    "seq2seq": {"engine", "op"},
}


def _imports(path):
  """(imported module, names taken from it) of each import in `path`."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield alias.name, ()
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.module, tuple(a.name for a in node.names)


def _ours(module):
  parts = module.split(".")
  return parts[1:] if parts[0] == "tf_recurrent" else None


@pytest.mark.parametrize("folder", sorted(IMPORTS))
def test_folder_imports_only_the_floors_below(folder):
  bad = []
  for path in sorted((PACKAGE / folder).glob("*.py")):
    for module, names in _imports(path):
      parts = _ours(module)
      if parts is None:
        continue
      # `from tf_recurrent import engine` names the folder in `names`.
      targets = [parts[0]] if parts else list(names)
      for target in targets:
        if target != folder and target not in IMPORTS[folder]:
          bad.append(f"{path.relative_to(PACKAGE)} imports {module} "
                     f"({target})")
  assert not bad, (f"{folder}/ may import only {sorted(IMPORTS[folder])}: "
                   + "; ".join(bad))


def test_no_module_reads_another_modules_private_names():
  bad = []
  for path in sorted(PACKAGE.rglob("*.py")):
    for module, names in _imports(path):
      if _ours(module) is None:
        continue
      bad += [f"{path.relative_to(PACKAGE)}: from {module} import {name}"
              for name in names if name.startswith("_")]
    tree = ast.parse(path.read_text())
    imported = {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module and
                node.module.startswith("tf_recurrent")
                for alias in node.names}
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and
          not node.attr.startswith("__") and
          isinstance(node.value, ast.Name) and node.value.id in imported):
        bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: "
                   f"{node.value.id}.{node.attr}")
  assert not bad, "; ".join(bad)
