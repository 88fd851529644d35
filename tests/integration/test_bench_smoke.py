"""`bench/run.py --quick` runs end to end: every scenario against the node, the relay and the
bare pipeline, nothing lost. (The figures themselves are the benchmark's business, not a test's.)"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]


async def test_quick_benchmark_smoke(tmp_path: Path, synapse_python: Path) -> None:
    if not (ROOT / "bench" / "node_modules" / "ws").exists():
        pytest.fail("bench dependencies missing: run `npm ci` in bench (scripts/test.sh does)")
    out = tmp_path / "bench.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "bench/run.py",
        "--quick",
        "--out",
        str(out),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 900)
    assert proc.returncode == 0, output.decode(errors="replace")[-4000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    targets = {r["target"] for r in rows}
    assert targets == {"node", "relay", "bare"}
    tests = {(r["test"], r["target"]) for r in rows}
    for target in ("node", "relay"):
        for test in (
            "alloc_hyperty_1_100",
            "alloc_object_3k_100",
            "msg_100_1000",
            "msg_10000_100",
            "pub_10000_100",
            "latency",
            "memory_idle",
        ):
            assert (test, target) in tests, (test, target)
    assert all(r.get("lost", 0) == 0 and r.get("out_of_order", 0) == 0 for r in rows), rows
    assert {c["check"] for c in report["checks"]} >= {"msg_100_10000", "latency_p50_vs_bare"}


async def test_unknown_benchmark_group_is_refused() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "bench/run.py",
        "--only",
        "messaging,bogus",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "--only takes allocation, bare, latency, memory, messaging, publication" in err.decode()
