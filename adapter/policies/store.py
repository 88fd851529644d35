"""The policy rules in the database, and the engine kept in step with them.

Each change is validated (compiled) first, written in one transaction, and only then applied to
the engine, in place: the next message is decided by the new rules, no restart. Changes are
serialized, so the engine's order of elements is the database's.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, delete, func, insert, select, update

from ..storage.clock import utcnow
from ..storage.database import ConstraintViolation, Database
from ..storage.policy_models import PolicyRuleRow, PolicySetting
from .elements import Algorithm, Element, compile_element, parse_algorithm
from .engine import RuleEngine
from .issues import Issue, PolicyValidationError

_R = PolicyRuleRow
ALGORITHM_SETTING: Final = "algorithm"
MAX_ID_LENGTH: Final = 64
_ID_RETRIES: Final = 5


@dataclass(frozen=True, slots=True)
class StoredRule:
    id: str
    document: dict[str, Any]


class PolicyStoreError(Exception):
    """The stored rules cannot be used (a document that no longer compiles)."""


def check_rule_id(rule_id: str) -> None:
    if not rule_id or len(rule_id) > MAX_ID_LENGTH or "/" in rule_id or not rule_id.isprintable():
        raise PolicyValidationError(
            [Issue("id", f"an id has 1 to {MAX_ID_LENGTH} printable characters and no '/'")]
        )


class PolicyStore:
    def __init__(self, db: Database, engine: RuleEngine) -> None:
        self._db = db
        self._engine = engine
        self._lock = asyncio.Lock()

    @property
    def engine(self) -> RuleEngine:
        return self._engine

    async def load(self) -> None:
        """Install the stored rules and algorithm into the engine (at start)."""

        def read(conn: Connection) -> tuple[str | None, list[tuple[str, str]]]:
            algorithm = conn.execute(
                select(PolicySetting.value).where(PolicySetting.name == ALGORITHM_SETTING)
            ).scalar()
            rows = conn.execute(select(_R.id, _R.document).order_by(_R.position)).all()
            return algorithm, [(str(r[0]), str(r[1])) for r in rows]

        async with self._lock:
            name, rows = await self._db.run(read)
            elements: list[Element] = []
            for rule_id, text in rows:
                try:
                    elements.append(compile_element(json.loads(text)))
                except (ValueError, PolicyValidationError) as exc:
                    # Refusing to start beats silently dropping what may be a deny rule.
                    raise PolicyStoreError(
                        f"stored policy rule {rule_id!r} is unusable: {exc}"
                    ) from None
            try:
                algorithm = parse_algorithm(name) if name is not None else self._engine.algorithm
            except PolicyValidationError:
                raise PolicyStoreError(f"stored combining algorithm {name!r} is unknown") from None
            self._engine.replace_all(elements, algorithm)

    async def list(self) -> tuple[Algorithm, list[StoredRule]]:
        def read(conn: Connection) -> list[StoredRule]:
            rows = conn.execute(select(_R.id, _R.document).order_by(_R.position)).all()
            return [StoredRule(str(r[0]), json.loads(r[1])) for r in rows]

        return self._engine.algorithm, await self._db.run(read)

    async def get(self, rule_id: str) -> StoredRule | None:
        def read(conn: Connection) -> str | None:
            return conn.execute(select(_R.document).where(_R.id == rule_id)).scalar()

        text = await self._db.run(read)
        return StoredRule(rule_id, json.loads(text)) if text is not None else None

    async def add(self, document: Any) -> StoredRule:
        """Store a new element under a fresh id (the next unused integer); an ``id`` in the
        document is replaced by it."""
        # Validate before touching the database: any id will do, it is not part of the checks.
        compile_element({**document, "id": "1"} if isinstance(document, dict) else document)
        assert isinstance(document, dict)

        def write(conn: Connection) -> tuple[str, dict[str, Any]]:
            rule_id = _next_id(conn)
            stored = {**document, "id": rule_id}
            _insert(conn, rule_id, stored)
            return rule_id, stored

        async with self._lock:
            for _ in range(_ID_RETRIES):
                try:
                    rule_id, stored = await self._db.run(write)
                except ConstraintViolation:
                    continue  # another node sharing the database took the id meanwhile
                self._engine.put(compile_element(stored))
                return StoredRule(rule_id, stored)
        raise PolicyStoreError("could not allocate a rule id")

    async def put(self, rule_id: str, document: Any) -> tuple[StoredRule, bool]:
        """Create or replace the element ``rule_id``; True when it was created."""
        check_rule_id(rule_id)
        if isinstance(document, dict) and "id" in document and str(document["id"]) != rule_id:
            raise PolicyValidationError(
                [Issue("id", f"{document['id']!r} differs from the id in the URL ({rule_id!r})")]
            )
        stored = {**document, "id": rule_id} if isinstance(document, dict) else document
        element = compile_element(stored)
        async with self._lock:
            created = await self._db.run(lambda conn: _upsert(conn, rule_id, stored))
            self._engine.put(element)
        return StoredRule(rule_id, stored), created

    async def remove(self, rule_id: str) -> bool:
        async with self._lock:
            deleted = await self._db.run(
                lambda conn: conn.execute(delete(_R).where(_R.id == rule_id)).rowcount > 0
            )
            self._engine.remove(rule_id)
        return bool(deleted)

    async def set_algorithm(self, name: Any) -> Algorithm:
        algorithm = parse_algorithm(name)

        def write(conn: Connection) -> None:
            now = utcnow()
            where = PolicySetting.name == ALGORITHM_SETTING
            if not conn.execute(
                update(PolicySetting).where(where).values(value=algorithm, updated_at=now)
            ).rowcount:
                conn.execute(
                    insert(PolicySetting).values(
                        name=ALGORITHM_SETTING, value=algorithm, updated_at=now
                    )
                )

        async with self._lock:
            await self._db.run(write)
            self._engine.set_algorithm(algorithm)
        return algorithm


def _next_id(conn: Connection) -> str:
    ids = conn.execute(select(_R.id)).scalars().all()
    numbers = [int(i) for i in ids if i.isdigit() and len(i) < 19]
    return str(max(numbers, default=0) + 1)


def _next_position(conn: Connection) -> int:
    return int(conn.execute(select(func.coalesce(func.max(_R.position), 0))).scalar_one()) + 1


def _insert(conn: Connection, rule_id: str, document: dict[str, Any]) -> None:
    now = utcnow()
    conn.execute(
        insert(_R).values(
            id=rule_id,
            position=_next_position(conn),
            document=json.dumps(document),
            created_at=now,
            updated_at=now,
        )
    )


def _upsert(conn: Connection, rule_id: str, document: dict[str, Any]) -> bool:
    replaced = conn.execute(
        update(_R)
        .where(_R.id == rule_id)
        .values(document=json.dumps(document), updated_at=utcnow())
    ).rowcount
    if replaced:
        return False
    _insert(conn, rule_id, document)
    return True
