"""Statements compiled once for the database's dialect and run straight on the driver.

For the few writes on a request's hot path (an allocation's insert, a subscription): running them
through SQLAlchemy's per-execution machinery costs as much as SQLite's insert itself, and on
PostgreSQL they go to the server over an async connection SQLAlchemy does not manage (see
``DirectPostgres``). Values still go through the columns' bind processors, so they are stored
exactly as through SQLAlchemy.

A write of several rows (an allocation of three addresses) can also be given as one statement
for ``n`` rows (``block``): on PostgreSQL every statement is a network round trip and a lone
statement is atomic without BEGIN and COMMIT, so one multi-row statement costs what a single
row costs, where BEGIN, the rows and COMMIT cost three round trips or more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Insert

if TYPE_CHECKING:
    from .database import Database

# A statement's parameters: one row, or several.
Rows = dict[str, Any] | list[dict[str, Any]]

# Multi-row forms are compiled for blocks up to this many rows (each size once); larger lists
# run row by row in one transaction.
MAX_BLOCK = 32


class Bound(NamedTuple):
    """A statement ready for the driver: its SQL and its arguments, or (``many``) a list of
    argument sets to run as one transaction. ``prepare``: whether the server may keep the
    statement prepared, with a plan reused for every later execution."""

    sql: str
    args: Any
    many: bool = False
    prepare: bool = True


class _Form:
    __slots__ = ("order", "plan_free", "returns", "sql")

    def __init__(self, statement: Any, dialect: Any) -> None:
        # An INSERT ... VALUES has one possible plan; anything with a WHERE has several.
        self.plan_free = isinstance(statement, Insert)
        if isinstance(statement, Insert):
            # Compiled on its own an INSERT asks for the new primary key back (RETURNING id) on
            # PostgreSQL; nothing here reads it.
            statement = statement.inline()
        compiled = statement.compile(dialect=dialect)
        self.returns = bool(getattr(compiled, "returning", None))
        self.sql = str(compiled)
        self.order = list(compiled.positiontup or []) if dialect.positional else None


class Prepared:
    """One write, compiled once. ``columns`` name the parameters (by column key) whose values
    need the column type's bind processing; ``block(n)``, if given, builds the same write for
    ``n`` rows as one statement, with row ``i``'s parameters named ``<key>_<i>``.
    ``groupable``: the block form treats every row on its own, so concurrent writes (of other
    sessions) may share one statement (group commit on PostgreSQL, see ``DirectPostgres``);
    never for a statement with RETURNING, whose rows must go back to the write they belong to."""

    def __init__(
        self,
        db: Database,
        statement: Any,
        columns: Iterable[Any],
        block: Callable[[int], Any] | None = None,
        groupable: bool = False,
    ) -> None:
        self._dialect = db.engine.dialect
        self._one = _Form(statement, self._dialect)
        self.groupable = groupable and block is not None and not self._one.returns
        self._block = block
        self._blocks: dict[int, _Form] = {}
        self._processors = {
            column.key: processor
            for column in columns
            if (processor := column.type.dialect_impl(self._dialect).bind_processor(self._dialect))
        }

    def bound(self, params: Rows) -> Bound:
        """The SQL and arguments for ``params``: one statement whenever it can be."""
        if isinstance(params, dict):
            return Bound(self._one.sql, self._args(self._one, params))
        if len(params) == 1:
            return Bound(self._one.sql, self._args(self._one, params[0]))
        if self._block is not None and 1 < len(params) <= MAX_BLOCK:
            form = self._blocks.get(len(params))
            if form is None:
                form = self._blocks[len(params)] = _Form(self._block(len(params)), self._dialect)
            merged = {
                f"{name}_{index}": value
                for index, row in enumerate(params)
                for name, value in self._processed(row).items()
            }
            # A block's WHERE is not kept prepared: PostgreSQL may then settle on a generic plan,
            # and one made while the table was nearly empty scans it (`address IN (...)` by
            # sequential scan); kept as the table grew, 10,000 deletes of 3-address blocks took
            # 33-132 s instead of ~1 s. Planned with its values each time, it uses the index.
            return Bound(form.sql, self._ordered(form, merged), prepare=form.plan_free)
        return Bound(self._one.sql, [self._args(self._one, row) for row in params], many=True)

    def execute_on_driver(self, dbapi: Any, params: Rows) -> list[tuple[Any, ...]]:
        """Run on a DB-API connection, inside whatever transaction it is in (SQLite's inline
        path, where ``executemany`` of a few rows is cheap: no round trips). Returns the rows a
        one-row statement returned (RETURNING), as the driver gives them."""
        cursor = dbapi.cursor()
        try:
            if isinstance(params, dict):
                cursor.execute(self._one.sql, self._args(self._one, params))
                return [tuple(r) for r in cursor.fetchall()] if cursor.description else []
            cursor.executemany(self._one.sql, [self._args(self._one, row) for row in params])
            return []
        finally:
            cursor.close()

    def execute(self, conn: Any, params: Rows) -> list[tuple[Any, ...]]:
        """Run on a SQLAlchemy Connection, inside its transaction (``Database.run``)."""
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        return self.execute_on_driver(dbapi, params)

    def _args(self, form: _Form, params: dict[str, Any]) -> Any:
        return self._ordered(form, self._processed(params))

    def _processed(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            name: processor(value) if (processor := self._processors.get(name)) else value
            for name, value in params.items()
        }

    @staticmethod
    def _ordered(form: _Form, args: dict[str, Any]) -> Any:
        return tuple(args[n] for n in form.order) if form.order is not None else args
