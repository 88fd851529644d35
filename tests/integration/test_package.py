"""The package carries the node whole: a node installed from the wheel, outside the checkout,
migrates its database, runs against Synapse and serves the bundled stub in every form.

The wheel is built from a copy of the checkout (no `build/` left by an earlier build can slip
into it) and installed, without its dependencies, into a fresh virtual environment in a
temporary directory; the dependencies come from the checkout's virtual environment through a
`.pth` file naming its site-packages directory. A `.pth` line only adds a directory to
``sys.path``: the `.pth` files inside that directory, among them the one that makes the
checkout's `adapter` importable (the editable install), are not run, and the test checks that
`adapter` and `migrations` are the wheel's.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import aiohttp
import pytest

from adapter.localstack.synapse import free_port

from ..conftest import Homeserver

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
STUB_SOURCE = ROOT / "stub_js" / "src" / "index.js"
# What a checkout holds that is no part of the package's source.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "node_modules", "build", "dist", "var", "*.egg-info", "__pycache__",
    ".*_cache", ".hypothesis", "bench", "docs",
)  # fmt: skip


def _run(*args: str | Path, cwd: Path, timeout: float = 240) -> str:
    done = subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def install_wheel(tmp_path: Path) -> Path:
    """The wheel of this checkout in a fresh virtual environment; its `bin` directory."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCE)
    wheels = tmp_path / "wheels"
    pip = (sys.executable, "-m", "pip")
    _run(*pip, "wheel", "--no-deps", "--wheel-dir", wheels, source, cwd=tmp_path)
    [wheel] = wheels.glob("rethink_mn-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(*pip, "--python", python, "install", "--no-deps", wheel, cwd=tmp_path)
    site_packages = Path(
        _run(
            python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path
        ).strip()
    )
    (site_packages / "checkout-dependencies.pth").write_text(
        sysconfig.get_path("purelib") + "\n", encoding="utf-8"
    )
    return venv / "bin"


def write_config(run_dir: Path, homeserver: Homeserver, stub_port: int) -> Path:
    config = run_dir / "config.yaml"
    raw = {
        "domain": "mn.test",
        "homeserver": {"url": homeserver.url, "server_name": homeserver.server_name},
        "appservice": {
            "as_token": homeserver.as_token,
            "hs_token": homeserver.hs_token,
            "listen": {"host": "127.0.0.1", "port": homeserver.appservice_port},
        },
        "stub": {"listen": {"host": "127.0.0.1", "port": stub_port}},
        "database": {"url": f"sqlite:///{run_dir / 'node.db'}"},
        "dashboard": {"worker": False, "state_dir": str(run_dir / "dashboard")},
    }
    # JSON is YAML; the file holds the tokens, so only its owner reads it.
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(raw, out)
    return config


async def _until_healthy(proc: asyncio.subprocess.Process, as_port: int) -> None:
    async with asyncio.timeout(120), aiohttp.ClientSession() as session:
        while True:
            assert proc.returncode is None, "the installed node exited"
            try:
                async with session.get(f"http://127.0.0.1:{as_port}/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.2)


async def test_the_wheel_installed_outside_the_checkout_runs_and_serves_the_stub(
    homeserver: Homeserver, tmp_path: Path
) -> None:
    bin_dir = await asyncio.to_thread(install_wheel, tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    where = _run(
        bin_dir / "python",
        "-c",
        "import adapter, migrations; print(adapter.__file__); print(migrations.__file__)",
        cwd=run_dir,
    ).split()
    assert all(Path(path).is_relative_to(tmp_path / "venv") for path in where), where

    stub_port = free_port()
    config = write_config(run_dir, homeserver, stub_port)
    rethink_mn = bin_dir / "rethink-mn"
    await asyncio.to_thread(_run, rethink_mn, "-c", config, "db", "upgrade", cwd=run_dir)
    current = await asyncio.to_thread(_run, rethink_mn, "-c", config, "db", "current", cwd=run_dir)
    newest = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("0*.py"))[-1]
    assert current.strip() == newest.split("_")[0], current

    log = (tmp_path / "node.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        rethink_mn, "-c", config, "run", cwd=run_dir, stdout=log, stderr=log
    )
    try:
        await _until_healthy(proc, homeserver.appservice_port)
        node = f"http://127.0.0.1:{stub_port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{node}/stub/protostub.js") as resp:
                assert resp.status == 200
                assert await resp.text() == STUB_SOURCE.read_text(encoding="utf-8")
            async with session.get(f"{node}/.well-known/protocolstub/default.ps.js") as resp:
                assert resp.status == 200
                assert "System.register(" in await resp.text()
            async with session.get(f"{node}/.well-known/protocolstub/default.ps.json") as resp:
                assert resp.status == 200
                ps = await resp.json(content_type=None)
                assert (
                    ps["configuration"]["messagingnode"]
                    == f"ws://127.0.0.1:{stub_port}/stub/connect"
                )
            async with session.get(f"{node}/.well-known/protocolstub/default") as resp:
                assert resp.status == 200
                descriptor = await resp.json(content_type=None)
                assert "globalThis.activate" in descriptor["sourcePackage"]["sourceCode"]
            dashboard = f"http://127.0.0.1:{homeserver.appservice_port}/dashboard"
            for path in ("", "/dashboard.js", "/plotly.min.js"):
                async with session.get(f"{dashboard}{path}") as resp:
                    assert resp.status == 200, path
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), timeout=60)
        log.close()
    assert code == 0, (tmp_path / "node.log").read_text(errors="replace")[-4000:]
