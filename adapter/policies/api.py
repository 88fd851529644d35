"""The operator's HTTP API for policy rules, mounted by the node on its appservice listener.

    GET    /_rethink/policy/rules            {"algorithm", "rules": [...]}
    GET    /_rethink/policy/rules/{id}       one rule (404 if unknown)
    POST   /_rethink/policy/rules            add; the node assigns the id (201)
    PUT    /_rethink/policy/rules/{id}       create (201) or replace (200)
    DELETE /_rethink/policy/rules/{id}       remove (404 if unknown)
    PUT    /_rethink/policy/algorithm        {"algorithm": "deny-overrides" | ...}

Every request carries ``Authorization: Bearer <policy_api.token>`` (401 without, 403 when
wrong). Errors are JSON ``{"errcode", "error"}``, a refused document also lists
``"issues": [{"path", "reason"}]``. After each change the injected ``on_change(action, rule_id,
document)`` is awaited (action ``add``, ``replace``, ``remove`` or ``algorithm``), so the node
can record who changed what.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
import structlog
from aiohttp import web

from .issues import PolicyValidationError
from .store import PolicyStore, StoredRule, check_rule_id

log = structlog.get_logger(__name__)

PREFIX: Final = "/_rethink/policy"
MAX_BODY_BYTES: Final = 256 * 1024
# Deeper than any rule the language can express usefully; checked before anything walks it.
MAX_DEPTH: Final = 64

OnChange = Callable[[str, str | None, Any], Awaitable[None]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, errcode: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"errcode": errcode, "error": message, **extra}, status=status)


class PolicyApi:
    def __init__(self, store: PolicyStore, token: str, on_change: OnChange) -> None:
        if len(token) < 16:
            raise ValueError("the policy API token must have at least 16 characters")
        self._store = store
        self._token = token.encode()
        self._on_change = on_change

    def routes(self) -> list[web.RouteDef]:
        guard = self._guarded
        return [
            web.get(f"{PREFIX}/rules", guard(self._list)),
            web.post(f"{PREFIX}/rules", guard(self._add)),
            web.get(PREFIX + "/rules/{id}", guard(self._get)),
            web.put(PREFIX + "/rules/{id}", guard(self._put)),
            web.delete(PREFIX + "/rules/{id}", guard(self._remove)),
            web.put(f"{PREFIX}/algorithm", guard(self._algorithm)),
        ]

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            header = request.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not given.strip():
                return error(401, "M_MISSING_TOKEN", "an Authorization: Bearer token is required")
            if not hmac.compare_digest(given.strip().encode(), self._token):
                return error(403, "M_FORBIDDEN", "wrong policy API token")
            try:
                return await handler(request)
            except _BadBody as exc:
                return exc.response
            except PolicyValidationError as exc:
                return error(
                    400,
                    "M_INVALID_POLICY",
                    "the policy document is not valid",
                    issues=[issue.as_dict() for issue in exc.issues],
                )

        return guarded

    async def _list(self, request: web.Request) -> web.Response:
        algorithm, rules = await self._store.list()
        return web.json_response({"algorithm": algorithm, "rules": [r.document for r in rules]})

    async def _get(self, request: web.Request) -> web.Response:
        rule = await self._store.get(request.match_info["id"])
        if rule is None:
            return _unknown(request.match_info["id"])
        return web.json_response(rule.document)

    async def _add(self, request: web.Request) -> web.Response:
        rule = await self._store.add(await _json_body(request))
        await self._changed("add", rule.id, rule.document)
        return _rule_response(rule, 201)

    async def _put(self, request: web.Request) -> web.Response:
        rule_id = request.match_info["id"]
        check_rule_id(rule_id)
        rule, created = await self._store.put(rule_id, await _json_body(request))
        await self._changed("add" if created else "replace", rule.id, rule.document)
        return _rule_response(rule, 201 if created else 200)

    async def _remove(self, request: web.Request) -> web.Response:
        rule_id = request.match_info["id"]
        if not await self._store.remove(rule_id):
            return _unknown(rule_id)
        await self._changed("remove", rule_id, None)
        return web.json_response({"id": rule_id})

    async def _algorithm(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        name = body.get("algorithm") if isinstance(body, dict) else body
        algorithm = await self._store.set_algorithm(name)
        await self._changed("algorithm", None, {"algorithm": algorithm})
        return web.json_response({"algorithm": algorithm})

    async def _changed(self, action: str, rule_id: str | None, document: Any) -> None:
        try:
            await self._on_change(action, rule_id, document)
        except Exception:
            # The change is made and in force: a failed record of it must not report otherwise.
            log.exception("policy_change_callback_failed", action=action, rule_id=rule_id)


class _BadBody(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


async def _json_body(request: web.Request) -> Any:
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _BadBody(error(413, "M_TOO_LARGE", f"body larger than {MAX_BODY_BYTES} bytes"))
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _BadBody(error(400, "M_NOT_JSON", f"the body is not JSON: {exc}")) from None
    if _depth_exceeds(body, MAX_DEPTH):
        raise _BadBody(error(400, "M_BAD_JSON", f"the body nests deeper than {MAX_DEPTH} levels"))
    return body


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _unknown(rule_id: str) -> web.Response:
    return error(404, "M_NOT_FOUND", f"no policy rule {rule_id!r}")


def _rule_response(rule: StoredRule, status: int) -> web.Response:
    return web.json_response({"id": rule.id, "rule": rule.document}, status=status)
