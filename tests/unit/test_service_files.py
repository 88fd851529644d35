"""The systemd units of contrib/systemd/: systemd's own check finds nothing to say about them,
and the command line each starts is one the node's CLI takes."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adapter.cli import _build_parser

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "contrib" / "systemd"
INSTALLED = "/opt/rethink-mn/bin/rethink-mn"  # where the units expect the node
# The units as `systemd-analyze verify` reads them: a template by one of its instances.
UNIT_FILES = {
    "rethink-mn.service": "rethink-mn.service",
    "rethink-mn@.service": "rethink-mn@p1.service",
}


def _exec_start(text: str) -> list[str]:
    [line] = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


@pytest.mark.parametrize("unit", sorted(UNIT_FILES))
def test_systemd_analyze_verify_finds_nothing_to_say(unit: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    text = (UNITS / unit).read_text(encoding="utf-8")
    assert INSTALLED in text
    # systemd checks that the command exists: this checkout's, where the unit names /opt's.
    here = str(Path(sys.executable).with_name("rethink-mn"))
    path = tmp_path / UNIT_FILES[unit]
    path.write_text(text.replace(INSTALLED, here), encoding="utf-8")
    done = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    # A unit systemd half understands (an unknown key, a bad value) is only a warning.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@pytest.mark.parametrize("unit", sorted(UNIT_FILES))
def test_the_unit_starts_a_command_the_cli_takes(unit: str) -> None:
    program, *args = _exec_start((UNITS / unit).read_text(encoding="utf-8"))
    assert program == INSTALLED
    parsed = _build_parser().parse_args([arg.replace("%i", "p1") for arg in args])
    assert parsed.command == "run"
    assert parsed.config == Path("/etc/rethink-mn/config.yaml")
    assert parsed.process == ("p1" if "@" in unit else None)
