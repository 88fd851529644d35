"""`rethink-mn policy ...` against the policy API served on 127.0.0.1 over a real database."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from adapter.policies import RuleEngine
from adapter.policies.api import PolicyApi
from adapter.policies.store import PolicyStore
from adapter.storage import migrate
from adapter.storage.database import Database

from ..conftest import Databases

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TOKEN = "cli-policy-token-0123456789"


async def nothing(action: str, rule_id: str | None, document: Any) -> None:
    return None


@pytest_asyncio.fixture(loop_scope="session")
async def served(databases: Databases) -> AsyncIterator[tuple[str, RuleEngine]]:
    url = databases.sqlite()
    await migrate.upgrade(url)
    db = Database(url)
    engine = RuleEngine()
    app = web.Application()
    app.add_routes(PolicyApi(PolicyStore(db, engine), TOKEN, nothing).routes())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", engine
    await runner.cleanup()
    await db.dispose()


def write_config(tmp_path: Path, api_url: str, token: str | None = TOKEN) -> Path:
    config = tmp_path / "config.yaml"
    lines = ["appservice:", "  as_token: aaaaaaaaaaaaaaaaaaaa", "  hs_token: hhhhhhhhhhhhhhhhhhhh"]
    lines += ["policy_api:", f"  url: {api_url}"]
    if token is not None:
        lines.append(f"  token: {token}")
    config.write_text("\n".join(lines) + "\n")
    return config


async def cli(config: Path, *args: str) -> tuple[int, str, str]:
    # A child process, awaited without blocking: the API it talks to runs on this event loop.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "adapter.cli",
        "-c",
        str(config),
        "policy",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_policy_commands(served: tuple[str, RuleEngine], tmp_path: Path) -> None:
    url, engine = served
    config = write_config(tmp_path, url)
    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            [
                {
                    "id": 2,
                    "target": {"actionType": {"in": ["create", "update", "subscribe"]}},
                    "condition": {"srcUsername": {"like": "*@gmail.com"}},
                    "effect": "deny",
                    "priority": 0,
                },
                {"condition": {"authenticated": {"equals": False}}, "effect": "deny"},
            ]
        )
    )
    code, _, err = await cli(config, "add", str(rules))
    assert code == 0, err
    assert "added rule 1" in err and "added rule 2" in err
    assert engine.ids() == ["1", "2"]

    code, out, err = await cli(config, "list")
    assert code == 0, err
    listing = json.loads(out)
    assert [r["id"] for r in listing["rules"]] == ["1", "2"]
    assert listing["algorithm"] == "deny-overrides"

    one = tmp_path / "one.json"
    one.write_text(json.dumps({"effect": "permit", "priority": 5}))
    code, _, err = await cli(config, "replace", "2", str(one))
    assert code == 0, err
    assert engine.ids() == ["1", "2"]

    code, _, err = await cli(config, "algorithm", "first-applicable")
    assert code == 0, err
    assert engine.algorithm == "first-applicable"

    code, _, err = await cli(config, "remove", "1")
    assert code == 0, err
    assert engine.ids() == ["2"]
    code, _, err = await cli(config, "remove", "1")
    assert code == 1 and "no policy rule '1'" in err


async def test_policy_command_errors(served: tuple[str, RuleEngine], tmp_path: Path) -> None:
    url, engine = served
    config = write_config(tmp_path, url)
    before = engine.ids()

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"effect": "deny"}, {"effect": "deny", "condition": {"tim": {}}}]))
    code, _, err = await cli(config, "add", str(bad))
    assert code == 2
    assert "[1].condition.tim" in err and "unknown attribute" in err
    assert engine.ids() == before  # nothing of the file was added

    code, _, err = await cli(config, "add", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read" in err
    bad.write_text("{not json")
    code, _, err = await cli(config, "add", str(bad))
    assert code == 2 and "not JSON" in err
    code, _, err = await cli(config, "algorithm", "majority")
    assert code == 2 and "unknown algorithm" in err
    code, _, err = await cli(config)
    assert code == 2

    code, _, err = await cli(write_config(tmp_path, url, "wrong-token-0123456789"), "list")
    assert code == 3 and "refused the token" in err
    code, _, err = await cli(write_config(tmp_path, url, token=None), "list")
    assert code == 3 and "policy_api.token" in err
    code, _, err = await cli(write_config(tmp_path, "http://127.0.0.1:9"), "list")
    assert code == 1 and "unreachable" in err
