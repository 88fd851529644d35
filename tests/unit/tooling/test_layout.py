"""Unit tests are laid out as the code is (issue 44): the tests of a module of the package
``adapter/<name>/`` live in ``tests/unit/<name>/``, as Synapse keeps the tests of
``synapse/handlers`` in ``tests/handlers``. Tests of a top-level module, or of several packages
at once, stay in ``tests/unit/``; ``appservice/`` has its own directory; ``tooling/`` holds the
tests of the project's own tools (benchmarks, the test support, the checks on the docs)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "tests" / "unit"
NOT_ADAPTER = {"appservice", "tooling"}


def adapter_packages() -> set[str]:
    return {p.parent.name for p in (ROOT / "adapter").glob("*/__init__.py")}


def packages_imported(test: Path) -> set[str]:
    """The packages of adapter/ a test module imports from (``adapter.routing.x`` →
    ``routing``); a top-level module of adapter/ counts as ``""``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(test.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "adapter" and len(parts) > 1:
                found.add(parts[1] if parts[1] in adapter_packages() else "")
    return found


def test_every_directory_of_unit_tests_mirrors_a_package() -> None:
    directories = {p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert directories - adapter_packages() - NOT_ADAPTER == set()
    for directory in directories:
        assert (UNIT / directory / "__init__.py").exists(), directory


def test_a_test_of_one_package_lives_in_its_directory() -> None:
    misplaced = {
        test.name: packages.pop()
        for test in UNIT.glob("test_*.py")
        if len(packages := packages_imported(test)) == 1 and "" not in packages
    }
    assert misplaced == {}, "move each into tests/unit/<package>/"


def test_the_check_reads_imports(tmp_path: Path) -> None:
    test = tmp_path / "test_x.py"
    test.write_text("from adapter.routing.lanes import X\nimport adapter.retry\n")
    assert packages_imported(test) == {"routing", ""}
