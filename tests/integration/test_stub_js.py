"""The bundled stub (stub_js) on real Node.js, against the real node and Synapse."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import uuid
from pathlib import Path

import pytest

from adapter.storage import migrate

from ..conftest import Databases, NodeFactory

pytestmark = [pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def node_js() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.skip("Node.js is not installed")
    if not (ROOT / "stub_js" / "node_modules" / "ws").exists():
        pytest.fail("stub_js dependencies missing: run `npm ci` in stub_js (scripts/test.sh does)")
    return path


async def test_conformance_through_the_bundled_stub(
    node_js: str, start_node: NodeFactory, databases: Databases
) -> None:
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = await start_node(url)
    env = {
        **os.environ,
        "MN_STUB_URL": f"ws://127.0.0.1:{node.stub_port}/stub/connect",
        "MN_DOMAIN": "mn.test",
        "MN_RUN": uuid.uuid4().hex[:8],
    }
    proc = await asyncio.create_subprocess_exec(
        node_js,
        "--test",
        "--test-reporter=tap",
        "tests/stub_e2e/conformance.test.mjs",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 180)
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text
    passed = re.search(r"^# pass (\d+)$", text, re.M)
    failed = re.search(r"^# fail (\d+)$", text, re.M)
    assert passed and failed, text
    assert int(passed.group(1)) >= 9 and int(failed.group(1)) == 0, text
