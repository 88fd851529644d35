"""No function in adapter/ longer than 80 lines (issue 44): a function that long does several
things, and the next change to it touches all of them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MAX_LINES = 80


def long_functions(root: Path) -> dict[str, int]:
    """Every function of the package under ``root`` over MAX_LINES lines (from its ``def`` to
    its last line), by ``path::Class.function``."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                lines = child.end_lineno - child.lineno + 1
                if lines > MAX_LINES:
                    found[f"{path}::{name}"] = lines
                visit(child, path, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, prefix)

    for source in sorted((root / "adapter").rglob("*.py")):
        path = source.relative_to(root).as_posix()
        visit(ast.parse(source.read_text(encoding="utf-8")), path, "")
    return found


def test_no_function_in_adapter_is_over_80_lines() -> None:
    assert long_functions(ROOT) == {}, f"functions over {MAX_LINES} lines: split them"


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    package = tmp_path / "adapter"
    package.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    (package / "long.py").write_text(f"class C:\n    def f(self) -> None:\n{body}\n")
    assert long_functions(tmp_path) == {"adapter/long.py::C.f": MAX_LINES + 1}
