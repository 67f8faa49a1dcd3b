"""The packages import in one direction (docs/architecture.md): hdl <- sim <- firmware,
boards -> hdl, and nothing outside tests/ imports from tests/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What each package may import of the project's packages.
ALLOWED = {
    "hdl": {"hdl"},
    "sim": {"hdl", "sim"},
    "firmware": {"hdl", "sim", "firmware"},
    "boards": {"hdl", "boards"},
    "bench": {"hdl", "sim", "firmware", "boards", "bench"},
}
PROJECT = {"hdl", "sim", "firmware", "boards", "bench", "tests"}


def _imports(path: Path) -> set[str]:
    """Top-level project packages a file imports (absolute imports)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & PROJECT


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_import_direction(package: str):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        extra = _imports(path) - ALLOWED[package]
        if extra:
            bad.append(f"{path.relative_to(ROOT)} imports {', '.join(sorted(extra))}")
    assert not bad, (f"{package}/ may import only {', '.join(sorted(ALLOWED[package]))}:\n"
                     + "\n".join(bad))
