"""The operator's policy API on aiohttp's test server, over real SQLite and PostgreSQL databases
with the migrations applied: changes are stored, take effect at once and survive a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import update

from adapter.identity import Identity
from adapter.policies import PolicyRequest, RuleEngine
from adapter.policies.api import PolicyApi
from adapter.policies.store import PolicyStore, PolicyStoreError
from adapter.storage.database import Database
from adapter.storage.policy_models import PolicyRuleRow

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TOKEN = "policy-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GMAIL_RULE = {
    "id": 2,
    "target": {"actionType": {"in": ["create", "update", "subscribe"]}},
    "condition": {"srcUsername": {"like": "*@gmail.com"}},
    "effect": "deny",
    "priority": 0,
}
ALICE = Identity("user://gmail.com/alice", "accounts.google.com", "oidc", True, "alice@gmail.com")


def create(identity: Identity | None = ALICE, msg_type: str = "create") -> PolicyRequest:
    return PolicyRequest(
        msg_type,
        "hyperty://mn.test/a",
        ("hyperty://mn.test/b",),
        identity,
        datetime(2026, 11, 24, 10),
    )


@dataclass
class Api:
    client: TestClient[web.Request, web.Application]
    engine: RuleEngine
    db: Database
    changes: list[tuple[str, str | None, Any]] = field(default_factory=list)


@pytest_asyncio.fixture(loop_scope="session")
async def api(database_url: str) -> AsyncIterator[Api]:
    db = Database(database_url)
    engine = RuleEngine()
    store = PolicyStore(db, engine)
    await store.load()
    changes: list[tuple[str, str | None, Any]] = []

    async def on_change(action: str, rule_id: str | None, document: Any) -> None:
        changes.append((action, rule_id, document))

    app = web.Application()
    app.add_routes(PolicyApi(store, TOKEN, on_change).routes())
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield Api(client, engine, db, changes)
    finally:
        await client.close()
        await db.dispose()


async def test_the_token_guards_every_route(api: Api) -> None:
    routes = [
        ("GET", "/_rethink/policy/rules"),
        ("POST", "/_rethink/policy/rules"),
        ("GET", "/_rethink/policy/rules/1"),
        ("PUT", "/_rethink/policy/rules/1"),
        ("DELETE", "/_rethink/policy/rules/1"),
        ("PUT", "/_rethink/policy/algorithm"),
    ]
    for method, path in routes:
        for headers, status in (
            ({}, 401),
            ({"Authorization": f"Basic {TOKEN}"}, 401),
            ({"Authorization": "Bearer "}, 401),
            ({"Authorization": "Bearer wrong-token-0123456789"}, 403),
            ({"Authorization": f"Bearer {TOKEN}x"}, 403),
        ):
            resp = await api.client.request(method, path, headers=headers, json=GMAIL_RULE)
            assert resp.status == status, (method, path, headers)
            assert (await resp.json())["errcode"] in ("M_MISSING_TOKEN", "M_FORBIDDEN")
    assert api.changes == [] and api.engine.ids() == []


async def test_changes_take_effect_at_once_and_are_reported(api: Api) -> None:
    c = api.client
    assert api.engine.decide(create()).permitted

    resp = await c.put("/_rethink/policy/rules/2", headers=AUTH, json=GMAIL_RULE)
    assert resp.status == 201, await resp.text()
    assert (await resp.json())["id"] == "2"
    denied = api.engine.decide(create())
    assert (denied.effect, denied.rule) == ("deny", "2")
    assert api.changes[-1] == ("add", "2", {**GMAIL_RULE, "id": "2"})

    relaxed = {**GMAIL_RULE, "target": {"actionType": {"in": ["update"]}}}
    resp = await c.put("/_rethink/policy/rules/2", headers=AUTH, json=relaxed)
    assert resp.status == 200
    assert api.engine.decide(create()).permitted
    assert api.engine.decide(create(msg_type="update")).rule == "2"
    assert api.changes[-1][0:2] == ("replace", "2")

    resp = await c.post(
        "/_rethink/policy/rules",
        headers=AUTH,
        json={"id": "ignored", "condition": {"authenticated": {"equals": False}}, "effect": "deny"},
    )
    assert resp.status == 201
    added = await resp.json()
    assert added["id"] == "3" and added["rule"]["id"] == "3"
    assert api.engine.decide(create(identity=None)).rule == "3"
    assert api.changes[-1][0:2] == ("add", "3")

    resp = await c.get("/_rethink/policy/rules", headers=AUTH)
    listing = await resp.json()
    assert listing["algorithm"] == "deny-overrides"
    assert [r["id"] for r in listing["rules"]] == ["2", "3"]
    assert (await (await c.get("/_rethink/policy/rules/3", headers=AUTH)).json())[
        "effect"
    ] == "deny"
    assert (await c.get("/_rethink/policy/rules/9", headers=AUTH)).status == 404

    permit_all = {"effect": "permit", "priority": 10}
    assert (await c.put("/_rethink/policy/rules/all", headers=AUTH, json=permit_all)).status == 201
    assert api.engine.decide(create(identity=None)).rule == "3"
    resp = await c.put(
        "/_rethink/policy/algorithm", headers=AUTH, json={"algorithm": "permitOverrides"}
    )
    assert resp.status == 200 and (await resp.json())["algorithm"] == "permit-overrides"
    assert api.engine.decide(create(identity=None)).rule == "all"
    assert api.changes[-1] == ("algorithm", None, {"algorithm": "permit-overrides"})

    resp = await c.delete("/_rethink/policy/rules/all", headers=AUTH)
    assert resp.status == 200
    assert api.engine.decide(create(identity=None)).rule == "3"
    assert api.changes[-1] == ("remove", "all", None)
    resp = await c.delete("/_rethink/policy/rules/all", headers=AUTH)
    assert resp.status == 404 and (await resp.json())["errcode"] == "M_NOT_FOUND"


async def test_bad_documents_are_refused_with_their_problems(api: Api) -> None:
    c = api.client
    bad = {
        "condition": {"srcUsername": {"like": 3}, "time": {"between": "9 to 5"}},
        "effect": "allow",
    }
    resp = await c.put("/_rethink/policy/rules/x", headers=AUTH, json=bad)
    assert resp.status == 400
    body = await resp.json()
    assert body["errcode"] == "M_INVALID_POLICY"
    assert {i["path"] for i in body["issues"]} == {
        "condition.srcUsername.like",
        "condition.time.between",
        "effect",
    }
    resp = await c.post("/_rethink/policy/rules", headers=AUTH, json=["not", "an", "object"])
    assert resp.status == 400 and (await resp.json())["issues"]
    resp = await c.put("/_rethink/policy/rules/x", headers=AUTH, json={**GMAIL_RULE, "id": "y"})
    assert resp.status == 400 and (await resp.json())["issues"][0]["path"] == "id"
    resp = await c.put("/_rethink/policy/rules/x", headers=AUTH, data=b"{not json")
    assert resp.status == 400 and (await resp.json())["errcode"] == "M_NOT_JSON"
    for depth in (100_000, 1000, 65):  # beyond the parser's limit, Python's stack, the API's
        deep = b"[" * depth + b"]" * depth
        resp = await c.put("/_rethink/policy/rules/x", headers=AUTH, data=deep)
        assert resp.status == 400, depth
    for depth in (1000, 65):
        deep_rule = b'{"effect":"deny","condition":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"
        resp = await c.put("/_rethink/policy/rules/x", headers=AUTH, data=deep_rule)
        assert resp.status == 400, depth
    resp = await c.put("/_rethink/policy/rules/" + "x" * 65, headers=AUTH, json=GMAIL_RULE)
    assert resp.status == 400
    resp = await c.put("/_rethink/policy/rules/x", headers=AUTH, data=b" " * (300 * 1024))
    assert resp.status == 413
    resp = await c.put("/_rethink/policy/algorithm", headers=AUTH, json={"algorithm": "majority"})
    assert resp.status == 400
    assert "unknown combining algorithm" in (await resp.json())["issues"][0]["reason"]
    assert api.changes == [] and api.engine.ids() == []
    assert api.engine.algorithm == "deny-overrides"


async def test_rules_survive_a_restart(api: Api, database_url: str) -> None:
    c = api.client
    assert (await c.put("/_rethink/policy/rules/2", headers=AUTH, json=GMAIL_RULE)).status == 201
    assert (
        await c.post("/_rethink/policy/rules", headers=AUTH, json={"effect": "permit"})
    ).status == 201
    await c.put("/_rethink/policy/algorithm", headers=AUTH, json={"algorithm": "first-applicable"})

    restarted = RuleEngine()
    await PolicyStore(api.db, restarted).load()
    assert restarted.ids() == ["2", "3"]
    assert restarted.algorithm == "first-applicable"
    assert restarted.decide(create()).rule == "2"
    assert restarted.decide(create(msg_type="read")).rule == "3"

    # A stored document that no longer compiles stops the start rather than dropping a rule.
    await api.db.run(
        lambda conn: conn.execute(
            update(PolicyRuleRow).where(PolicyRuleRow.id == "2").values(document='{"id": "2"}')
        )
    )
    with pytest.raises(PolicyStoreError, match="'2'"):
        await PolicyStore(api.db, RuleEngine()).load()


async def test_a_failing_change_callback_does_not_undo_the_change(database_url: str) -> None:
    db = Database(database_url)
    engine = RuleEngine()

    async def broken(action: str, rule_id: str | None, document: Any) -> None:
        raise RuntimeError("journal unavailable")

    app = web.Application()
    app.add_routes(PolicyApi(PolicyStore(db, engine), TOKEN, broken).routes())
    async with TestClient(TestServer(app)) as client:
        resp = await client.put("/_rethink/policy/rules/2", headers=AUTH, json=GMAIL_RULE)
        assert resp.status == 201
    assert engine.decide(create()).rule == "2"
    await db.dispose()
