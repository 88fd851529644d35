"""bench/revisions.py runs each checkout's benchmark the way that checkout can: as the module
bench.run where bench/ is a package, by path in a revision from before that."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.revisions import bench_command


def test_a_checkout_with_the_bench_package_runs_the_benchmark_as_a_module(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    assert bench_command(tmp_path) == [sys.executable, "-m", "bench.run"]


def test_an_older_checkout_runs_the_benchmark_by_path(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "run.py").write_text("")
    assert bench_command(tmp_path) == [sys.executable, "bench/run.py"]
