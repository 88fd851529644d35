"""Secrets are not world-readable, end to end: `rethink-mn up` on an install whose state other
users could read, and the test suite's own homeserver."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from adapter.localstack.synapse import free_port

from ..conftest import Homeserver
from ..support.modes import exposed, mode

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_up_tightens_an_old_install_and_keeps_every_secret_owner_only(
    synapse_python: Path, tmp_path: Path
) -> None:
    hs_port, as_port, stub_port = free_port(), free_port(), free_port()
    # An install from before: the config, var/ and what was in it readable by everyone. The
    # database is the default one, var/rethink-mn.db.
    config = tmp_path / "config.yaml"
    config.write_text(
        f"homeserver:\n  url: http://127.0.0.1:{hs_port}\n"
        f"appservice:\n  as_token: private-as-token-00000000\n"
        f"  hs_token: private-hs-token-00000000\n  listen:\n    port: {as_port}\n"
        f"stub:\n  listen:\n    port: {stub_port}\n"
    )
    state = tmp_path / "var"
    (state / "synapse").mkdir(parents=True)
    (state / "synapse" / "homeserver.log").write_text("an old log line\n")
    (state / "rethink-mn.db").write_text("")  # an empty file is an empty SQLite database
    for path in (config, state / "synapse" / "homeserver.log", state / "rethink-mn.db"):
        path.chmod(0o644)
    for directory in (state, state / "synapse"):
        directory.chmod(0o755)

    proc = subprocess.Popen(
        [sys.executable, "-m", "adapter.cli", "up"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        healthy = False
        deadline = time.monotonic() + 120
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    async with session.get(f"http://127.0.0.1:{as_port}/health") as resp:
                        if resp.status == 200:
                            healthy = True
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.3)
        assert healthy, f"no healthy node; exit={proc.poll()}"
        # Running: Synapse and the node have created all they create at start.
        running = exposed(state)
        secrets = {
            "config": config,
            "registration": state / "registration.yaml",
            "homeserver config": state / "synapse" / "homeserver.yaml",
            "signing key": state / "synapse" / "signing.key",
            "Synapse's database": state / "synapse" / "homeserver.db",
            "Synapse's log": state / "synapse" / "homeserver.log",
            "node database": state / "rethink-mn.db",
            "node database WAL": state / "rethink-mn.db-wal",
            "node database shm": state / "rethink-mn.db-shm",
        }
        modes = {name: oct(mode(path)) for name, path in secrets.items()}
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, output
    assert running == [], running
    assert modes == dict.fromkeys(secrets, "0o600"), modes
    assert "registration_shared_secret" in secrets["homeserver config"].read_text()
    assert exposed(state) == []  # nothing left behind for others after the stop either
    assert mode(config) == 0o600
    # The operator is told what was tightened.
    tightened = [line for line in output.splitlines() if "owner-only" in line]
    assert tightened and any("var" in line for line in tightened), output
    assert any("config.yaml" in line for line in tightened), output


async def test_the_suites_homeserver_keeps_its_secrets_owner_only(
    homeserver: Homeserver,
) -> None:
    """The fixture's writers and Synapse itself, run from the test process (whose umask is the
    caller's, not the CLI's)."""
    settings = homeserver.process.settings
    data = settings.data_dir
    assert exposed(data) == []
    for path in (
        settings.config_file,
        settings.registration_file,
        data / "signing.key",
        data / "homeserver.db",
        settings.log_file,
    ):
        assert mode(path) == 0o600, path
