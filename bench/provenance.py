"""Where a results file's figures come from: every writer under bench/ writes through here.

Each results file gets a ``source``: the commit measured (and whether the working tree had
uncommitted changes to tracked files), the command as it was typed, when it ran, and the
machine: its CPU count and its load average as the run began and as it ended (a figure taken
while something else ran on a 2-core machine is not the same figure).

    source = Source.begin()                  # first thing in main()
    ...
    write_results(path, {...}, source)       # the file, with "source" first

Files in docs/results/ written before this existed lack it; ``index`` records what can be known
of them honestly (the commit that added each file to the repository, which is not necessarily
the commit measured, and the command where the file itself recorded one):

    .venv/bin/python -m bench.provenance docs/results    # writes docs/results/sources.json
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INDEX = "sources.json"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed from the repository's root: the interpreter (relative to the root
    when it is inside), the script (``-m bench.X`` for a module of this package run as one)
    and its arguments (``argv`` when main() was given them)."""
    executable = Path(sys.executable)
    with_root = executable.is_relative_to(ROOT)
    interpreter = str(executable.relative_to(ROOT)) if with_root else executable.name
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = getattr(spec, "name", "")
    script = ["-m", module] if module.startswith("bench.") else [sys.argv[0]]
    return shlex.join([interpreter, *script, *(sys.argv[1:] if argv is None else argv)])


@dataclass
class Source:
    commit: str | None
    dirty: bool | None  # tracked files changed and not committed when the run began
    command: str
    started: str
    cpus: int | None
    loadavg_at_start: list[float]  # 1, 5 and 15 minutes, as os.getloadavg()
    system: str
    python: str

    @classmethod
    def begin(cls, argv: list[str] | None = None) -> Source:
        status = _git("status", "--porcelain", "--untracked-files=no")
        return cls(
            commit=_git("rev-parse", "HEAD"),
            dirty=None if status is None else bool(status),
            command=command_line(argv),
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            cpus=os.cpu_count(),
            loadavg_at_start=_load(),
            system=platform.platform(),
            python=platform.python_version(),
        )

    def finish(self) -> dict[str, Any]:
        """The record, with the load as the run ends."""
        return {
            **asdict(self),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg_at_end": _load(),
        }


def write_results(path: Path, results: dict[str, Any], source: Source) -> Path:
    """Write ``results`` as JSON to ``path`` with its ``source`` first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"source": source.finish(), **results}, indent=2) + "\n")
    return path


# -- files written before every writer recorded its source --------------------------------------


def index(folder: Path, names: set[str] | None = None) -> dict[str, Any]:
    """For each results file in ``folder`` (of ``names``, or all) without a ``source`` of its
    own: the commit that added it (marked as such: the code it measured may be older), the
    command if the file recorded one, and what of the machine's load it recorded. Nothing is
    inferred."""
    out: dict[str, Any] = {}
    for path in sorted(folder.iterdir()):
        if path.name == INDEX or not path.is_file() or (names and path.name not in names):
            continue
        recorded: dict[str, Any] = {}
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            if isinstance(data, dict) and "source" in data:
                continue  # it says where it comes from itself
            if isinstance(data, dict):
                recorded = _recorded(data)
        added = _git("log", "--diff-filter=A", "--format=%H", "--", str(path.relative_to(ROOT)))
        out[path.name] = {
            "added_in_commit": (added or "").splitlines()[-1] if added else None,
            "command": recorded.get("command"),
            "load_recorded": recorded.get("load"),
            "cpus_recorded": recorded.get("cpus"),
        }
    return out


def _recorded(data: dict[str, Any]) -> dict[str, Any]:
    """What an older results file says about its own origin, where it says it."""
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    load = {
        key: machine[key]
        for key in ("loadavg_at_start", "loadavg_at_end", "loadavg")
        if key in machine
    }
    return {
        "command": data.get("command") if isinstance(data.get("command"), str) else None,
        "load": load or None,
        "cpus": machine.get("cpus"),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.provenance RESULTS_FOLDER", file=sys.stderr)
        return 2
    folder = Path(argv[0]).resolve()
    target = folder / INDEX
    note = (
        "Results files written before bench/provenance.py: added_in_commit is the commit that "
        "added the file to the repository, not necessarily the commit measured; command, "
        "load_recorded and cpus_recorded are what the file itself recorded (null: it did not)."
    )
    target.write_text(json.dumps({"note": note, "files": index(folder)}, indent=2) + "\n")
    print(f"written: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
