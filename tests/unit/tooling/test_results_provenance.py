"""Every results file says where its figures come from (bench/provenance.py): the commit, the
command and the machine's load; the files written before that are listed in
docs/results/sources.json with what can be known of them, and nothing more."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from bench.provenance import INDEX, Source, command_line, index, write_results

ROOT = Path(__file__).resolve().parents[3]

RESULTS = ROOT / "docs" / "results"


def test_a_results_file_records_the_commit_the_command_and_the_load(tmp_path: Path) -> None:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    source = Source.begin(["--quick", "--out", "x.json"])
    path = write_results(tmp_path / "r.json", {"rows": [1]}, source)
    data = json.loads(path.read_text())
    assert list(data) == ["source", "rows"]
    recorded = data["source"]
    assert recorded["commit"] == head and isinstance(recorded["dirty"], bool)
    assert recorded["command"].endswith("--quick --out x.json")
    assert recorded["cpus"] >= 1
    for key in ("loadavg_at_start", "loadavg_at_end"):
        assert len(recorded[key]) == 3 and all(x >= 0 for x in recorded[key])


def test_a_script_run_as_a_module_is_recorded_as_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m bench.run --quick` is what was typed, not the module's file path."""
    main = types.ModuleType("__main__")
    main.__spec__ = ModuleSpec("bench.run", None)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "run.py"), "--quick"])
    assert command_line().split()[1:] == ["-m", "bench.run", "--quick"]


def test_every_bench_writer_writes_through_the_shared_helper() -> None:
    """A script that writes into bench/results (or takes --out/--json for a results file) uses
    write_results, so that none writes a file without its source."""
    writers = []
    for script in sorted((ROOT / "bench").glob("*.py")):
        text = script.read_text()
        if script.name == "provenance.py":
            continue
        if re.search(r'"results"|--out|--json', text):
            writers.append(script.name)
            assert "write_results(" in text, f"{script.name} writes results without its source"
    assert {"run.py", "faults.py", "analytics_bench.py", "window_merge.py"} <= set(writers)


def test_every_results_file_in_docs_has_a_source() -> None:
    """Its own (written by bench/provenance.py), or the index's entry for older files: the
    commit that added the file, marked as such, never an invented one."""
    listed = json.loads((RESULTS / INDEX).read_text())["files"]
    for path in sorted(RESULTS.iterdir()):
        if path.name == INDEX:
            continue
        own = json.loads(path.read_text()).get("source") if path.suffix == ".json" else None
        if path.suffix == ".txt" and text_source(path) is not None:
            continue  # its header says where it comes from
        if own is not None:
            assert re.fullmatch(r"[0-9a-f]{40}", own["commit"] or ""), path.name
            assert own["command"] and own["loadavg_at_start"], path.name
        else:
            assert path.name in listed, f"{path.name}: no source (bench/provenance.py docs/results)"
            assert re.fullmatch(r"[0-9a-f]{40}", listed[path.name]["added_in_commit"]), path.name


def text_source(path: Path) -> dict[str, str] | None:
    """A text results file's own header (a run's log with its source written first, as the
    fuzz runs are): ``command:``, ``commit:`` and the load as it began."""
    head = "\n".join(path.read_text().splitlines()[:5])
    commit = re.search(r"^commit: ([0-9a-f]{40})", head, re.M)
    command = re.search(r"^command: (.+)$", head, re.M)
    load = re.search(r"loadavg at start: ([\d. ]+)", head)
    if not (commit and command and load):
        return None  # an older log: the index says what is known of it
    return {"commit": commit[1], "command": command[1], "load": load[1]}


@pytest.mark.parametrize("name", ["faults-20261125.json", "bench-20261126.json"])
def test_the_index_records_only_what_a_file_itself_says(name: str) -> None:
    entry = index(RESULTS, {name})[name]
    data = json.loads((RESULTS / name).read_text())
    assert entry["command"] == data.get("command")
    machine = data.get("machine", {})
    recorded = entry["load_recorded"] or {}
    assert recorded == {
        k: machine[k] for k in ("loadavg_at_start", "loadavg_at_end") if k in machine
    }
