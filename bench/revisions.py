"""Two revisions of the node measured in one run: did a change cost anything?

A reshaping that should change nothing (issue 44) is checked by running the same benchmark on
the code before and after it, alternately (base, head, base, head, ...) so that whatever else
the machine does falls on both alike, and comparing the medians. Each revision runs its own
benchmark (bench/run.py) from a checkout of its own (a git worktree made for the run, removed
after), with the same interpreter, virtual environment and Node.js modules as this checkout. Run
it as a module from the repository's root:

    .venv/bin/python -m bench.revisions --base 043b097 --rounds 2 -- \\
        --only crowd --crowd 200,5 --crowd-targets node

prints, for each figure the rows share (latency percentiles, the node's CPU per message, lost,
duplicates), the base's and the head's medians and their ratio, and writes them with the
commits, the command and the machine's load to bench/results/revisions-*.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.provenance import Source, write_results

ROOT = Path(__file__).resolve().parents[1]
# Figures compared, where a row has them: (name, how to read it from the row).
FIGURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("p50_ms", ("p50_ms",)),
    ("p99_ms", ("p99_ms",)),
    ("node_cpu_us_per_msg", ("cpu_us_per_msg", "node")),
    ("lost", ("lost",)),
    ("duplicates", ("duplicates",)),
)


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _checkout(revision: str, into: Path) -> Path:
    """A worktree of ``revision`` sharing this checkout's Node.js modules."""
    _git("worktree", "add", "--detach", str(into), revision)
    for modules in ("bench/node_modules", "stub_js/node_modules"):
        (into / modules).symlink_to(ROOT / modules, target_is_directory=True)
    return into


def bench_command(checkout: Path) -> list[str]:
    """How ``checkout`` runs its benchmark: as a module where bench/ is a package, by path in
    a revision older than that (the base may be one)."""
    if (checkout / "bench" / "__init__.py").exists():
        return [sys.executable, "-m", "bench.run"]
    return [sys.executable, "bench/run.py"]


def _run(checkout: Path, bench_args: list[str], out: Path) -> dict[str, Any]:
    # The checkout's own code: PYTHONPATH puts it before the virtual environment's editable
    # install of this checkout, for the benchmark and the node processes it starts.
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [*bench_command(checkout), *bench_args, "--out", str(out)]
    subprocess.run(command, cwd=checkout, env=env, check=True)
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def _figure(row: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = row
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) else None


def compare(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One line per (row, figure) both revisions measured: medians over the rounds."""
    lines: list[dict[str, Any]] = []
    first = runs["base"][0]["rows"]
    for row in first:
        test = row.get("test")
        for name, path in FIGURES:
            medians: dict[str, float] = {}
            for side, results in runs.items():
                values = [
                    v
                    for result in results
                    for other in result["rows"]
                    if other.get("test") == test and (v := _figure(other, path)) is not None
                ]
                if values:
                    medians[side] = statistics.median(values)
            if len(medians) == 2:
                base, head = medians["base"], medians["head"]
                ratio = head / base if base else None
                lines.append(
                    {"test": test, "figure": name, "base": base, "head": head, "ratio": ratio}
                )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision before the change")
    parser.add_argument("--head", default="HEAD", help="the revision after it (default HEAD)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each, alternating")
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then bench/run.py's")
    args = parser.parse_args()
    source = Source.begin()
    bench_args = [a for a in args.bench_args if a != "--"]
    commits = {"base": _git("rev-parse", args.base), "head": _git("rev-parse", args.head)}
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="revisions-") as scratch:
        checkouts = {
            side: _checkout(commit, Path(scratch) / side) for side, commit in commits.items()
        }
        try:
            for round_ in range(args.rounds):
                for side in ("base", "head"):
                    print(f"== round {round_ + 1}: {side} {commits[side][:10]}", flush=True)
                    out = Path(scratch) / f"{side}-{round_}.json"
                    runs[side].append(_run(checkouts[side], bench_args, out))
        finally:
            for checkout in checkouts.values():
                _git("worktree", "remove", "--force", str(checkout))
    lines = compare(runs)
    print(f"{'test':<28} {'figure':<22} {'base':>10} {'head':>10} {'head/base':>10}")
    for line in lines:
        ratio = "-" if line["ratio"] is None else f"{line['ratio']:.3f}"
        print(
            f"{line['test']:<28} {line['figure']:<22} {line['base']:>10.2f} "
            f"{line['head']:>10.2f} {ratio:>10}"
        )
    out = (
        args.out or ROOT / "bench" / "results" / f"revisions-{time.strftime('%Y%m%dT%H%M%S')}.json"
    )
    write_results(
        out,
        {
            "commits": commits,
            "rounds": args.rounds,
            "bench_args": bench_args,
            "lines": lines,
            "runs": runs,
        },
        source,
    )
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
