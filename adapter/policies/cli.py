"""`rethink-mn policy ...`: the operator's policy API from the command line.

    policy list                  the rules and the combining algorithm (JSON on stdout)
    policy add FILE              add the rule, policy or policy set in FILE (or each of an array)
    policy replace ID FILE       create or replace rule ID with the one in FILE
    policy remove ID             remove rule ID
    policy algorithm NAME        deny-overrides | permit-overrides | first-applicable

Documents are validated here first, so a file with a mistake changes nothing. Exit codes: 0 done,
1 the node failed or refused at run time (unreachable, unknown id), 2 bad usage (unreadable file,
invalid document, unknown algorithm), 3 bad configuration (no token, or the node refused it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import aiohttp
from rich.console import Console
from rich.markup import escape

from ..config import ConfigError, NodeConfig
from .api import PREFIX
from .elements import ALGORITHMS, compile_element
from .issues import Issue, PolicyValidationError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CONFIG = 0, 1, 2, 3
TIMEOUT: Final = aiohttp.ClientTimeout(total=30)


def add_parser(sub: Any) -> None:
    policy = sub.add_parser("policy", help="manage the message policies of a running node")
    actions = policy.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    actions.add_parser("list", help="show the rules and the combining algorithm (JSON)")
    add = actions.add_parser("add", help="add the rule(s) in a JSON file; the node assigns ids")
    add.add_argument("file", type=Path, help="a rule, policy or policy set, or an array of them")
    replace = actions.add_parser("replace", help="create or replace one rule by id")
    replace.add_argument("id", help="the rule's id")
    replace.add_argument("file", type=Path, help="the rule, policy or policy set (JSON)")
    remove = actions.add_parser("remove", help="remove one rule by id")
    remove.add_argument("id", help="the rule's id")
    algorithm = actions.add_parser("algorithm", help="set the top-level combining algorithm")
    algorithm.add_argument("name", help=", ".join(ALGORITHMS))


class _Exit(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def run(args: argparse.Namespace, config: NodeConfig, err: Console) -> int:
    token = config.policy_api.token
    if not token:
        raise ConfigError(
            f"{args.config}: policy_api.token is not set (set it in the file or in "
            "$RETHINK_MN_POLICY_TOKEN, the same as the node's)"
        )
    client = _Client(config.policy_api_url, token)
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            return await _dispatch(args, client, http, err)
    except _Exit as exc:
        err.print(f"[bold red]error[/]: {escape(exc.message)}")
        return exc.code


async def _dispatch(
    args: argparse.Namespace, client: _Client, http: aiohttp.ClientSession, err: Console
) -> int:
    command = args.policy_command
    if command == "list":
        listing = await client.call(http, "GET", "/rules")
        print(json.dumps(listing, indent=2))
        err.print(f"{len(listing['rules'])} rule(s), algorithm {listing['algorithm']}")
        return EXIT_OK
    if command == "add":
        document = _read(args.file)
        items = document if isinstance(document, list) else [document]
        if not items:
            raise _Exit(EXIT_USAGE, f"{args.file}: the array holds no rule")
        _validate(args.file, items, numbered=isinstance(document, list))
        for item in items:
            added = await client.call(http, "POST", "/rules", item)
            err.print(f"added rule {escape(added['id'])}")
        return EXIT_OK
    if command == "replace":
        document = _read(args.file)
        candidate = {**document, "id": args.id} if isinstance(document, dict) else document
        _validate(args.file, [candidate], numbered=False)
        stored = await client.call(http, "PUT", f"/rules/{_quote(args.id)}", document)
        err.print(f"rule {escape(stored['id'])} stored")
        return EXIT_OK
    if command == "remove":
        await client.call(http, "DELETE", f"/rules/{_quote(args.id)}")
        err.print(f"removed rule {escape(args.id)}")
        return EXIT_OK
    if command == "algorithm":
        if args.name not in ALGORITHMS:
            raise _Exit(
                EXIT_USAGE, f"unknown algorithm {args.name!r}; known: {', '.join(ALGORITHMS)}"
            )
        answer = await client.call(http, "PUT", "/algorithm", {"algorithm": args.name})
        err.print(f"combining algorithm is now {answer['algorithm']}")
        return EXIT_OK
    raise AssertionError(f"unhandled policy command {command}")


class _Client:
    def __init__(self, base_url: str, token: str) -> None:
        self._base = base_url.rstrip("/") + PREFIX
        self._headers = {"Authorization": f"Bearer {token}"}

    async def call(
        self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None
    ) -> Any:
        url = self._base + path
        try:
            async with http.request(
                method, url, headers=self._headers, json=body if body is not None else None
            ) as resp:
                status = resp.status
                try:
                    answer: Any = await resp.json(content_type=None)
                except ValueError:
                    answer = None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Exit(
                EXIT_FAILURE, f"the node's policy API at {url} is unreachable: {exc}"
            ) from None
        if 200 <= status < 300 and isinstance(answer, dict):
            return answer
        message = answer.get("error") if isinstance(answer, dict) else None
        message = f"HTTP {status}: {message or 'unexpected answer'}"
        if status == 400:
            issues = answer.get("issues") if isinstance(answer, dict) else None
            details = "".join(
                f"\n  {i.get('path') or '(document)'}: {i.get('reason')}" for i in issues or []
            )
            raise _Exit(EXIT_USAGE, f"the node refused the request ({message}){details}")
        if status in (401, 403):
            raise _Exit(
                EXIT_CONFIG,
                f"the node refused the token ({message}): policy_api.token must be the node's",
            )
        raise _Exit(EXIT_FAILURE, message)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _Exit(EXIT_USAGE, f"{path}: cannot read: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Exit(EXIT_USAGE, f"{path}: not JSON: {exc}") from None


def _validate(path: Path, items: list[Any], *, numbered: bool) -> None:
    problems: list[Issue] = []
    for index, item in enumerate(items):
        # The node assigns ids on add: a missing one is no mistake of the file's.
        candidate = {"id": "1", **item} if isinstance(item, dict) else item
        try:
            compile_element(candidate)
        except PolicyValidationError as exc:
            prefix = f"[{index}]" if numbered else ""
            problems += [
                Issue(f"{prefix}.{i.path}" if prefix and i.path else prefix + i.path, i.reason)
                for i in exc.issues
            ]
    if problems:
        lines = "".join(f"\n  {issue}" for issue in problems)
        raise _Exit(EXIT_USAGE, f"{path}: not a valid policy document:{lines}")


def _quote(rule_id: str) -> str:
    return quote(rule_id, safe="")
