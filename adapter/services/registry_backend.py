"""The built-in domain registry: dev-registry-domain's REST resources answered from the node's
database, in process.

``call`` takes the same ``RestCall`` the relay sends over HTTP and returns the ``RestAnswer``
dev-registry-domain would give, so composing it with ``domain_call``/``domain_reply`` answers
reTHINK messages exactly as the relay does with an external registry, and the HTTP API
(``registry_rest``) serves the same resources. Status changes are published once committed.

Sources (reTHINK-project/dev-registry-domain, server/src/main/java/domainregistry/):
HypertyController.java (routes, codes, answers), HypertyService.java and DataObjectService.java
(404 / 408 rules, create-or-replace, keep-alive), RamClient.java (delete marks disconnected).

Beyond the reference, entries belong to the credential of the runtime that registered them (its
claim on its runtimeURL, which outlives its session while the entries do), and a hyperty's user
is the registering runtime's verified identity when it has one (DESIGN.md section 10): a write
from a runtime that breaks either rule is 403 and changes nothing. What a runtime may register
at all (addresses allocated to it, under its own runtimeURL) the reference monitor decides
before a request reaches here (access.py, "Register"). A call without a runtime is
the operator's (the REST API) and is not checked. docs/registry-connector.md, "Who may change
an entry", states the rule.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson
import structlog

from ..identity.model import Identity, identity_name
from ..storage.database import StorageError
from ..storage.registry_models import DISCONNECTED, EntryKind
from ..storage.registry_store import Registered, RegistryStore, StatusChange, Written
from .registry_fields import (
    FILTERS,
    InvalidRecord,
    Lifetimes,
    creation,
    data_object_json,
    hyperty_json,
    matches,
    update,
    user_email,
    valid_key,
)
from .registry_http import RestAnswer, RestCall

log = structlog.get_logger(__name__)

NOT_FOUND: Final = "Not Found"
StatusCallback = Callable[[str, str], Awaitable[None]]
Filters = Mapping[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Writer:
    """The runtime a registry request comes through the MN from."""

    runtime_url: str  # the `runtime` of what it registers without naming one
    claim: str  # what its entries are owned by: its credential's claim on the runtimeURL
    identity: Identity | None = None  # what it proved when it connected


class RegistryBackend(Protocol):
    """A domain registry answering dev-registry-domain's REST resources. ``writer`` is the
    runtime a request comes from, when known (the MN's requester); None: the operator. With
    ``changes``, the status changes a write makes are left there, for ``publish`` once the
    caller has answered; with ``created``, the URLs of the entries a write created (not
    replaced)."""

    async def call(
        self,
        call: RestCall,
        *,
        writer: Writer | None = None,
        changes: list[StatusChange] | None = None,
        created: list[str] | None = None,
    ) -> RestAnswer: ...

    async def publish(self, changes: Sequence[StatusChange]) -> None: ...

    async def holds(self, call: RestCall, claim: str) -> bool:
        """Whether the entry a registration ``call`` names is ``claim``'s already."""
        ...


class StatusNotifier:
    """Hands each status change to the node's callback, in order; a failing callback is logged
    and costs that notification only."""

    def __init__(self, callback: StatusCallback | None) -> None:
        self._callback = callback

    async def publish(self, changes: Sequence[StatusChange]) -> None:
        if self._callback is None:
            return
        for change in changes:
            try:
                await self._callback(change.url, change.status)
            except Exception:  # a notification must not undo a committed registration
                log.exception("registry_status_notification_failed", url=change.url)


Publish = Callable[[Sequence[StatusChange]], Awaitable[None]]


def _collect(into: list[StatusChange]) -> Publish:
    async def collect(changes: Sequence[StatusChange]) -> None:
        into.extend(changes)

    return collect


class _Answer(Exception):
    """Ends a request early with ``status`` and a ``{"message": ...}`` body."""

    def __init__(self, status: int, message: str = NOT_FOUND) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _answer(status: int, value: Any) -> RestAnswer:
    return RestAnswer(status, orjson.dumps(value))


def _message(status: int, message: str) -> RestAnswer:
    return _answer(status, {"message": message})


class BuiltinRegistryBackend:
    def __init__(
        self, store: RegistryStore, notifier: StatusNotifier, lifetimes: Lifetimes
    ) -> None:
        self._store = store
        self._notifier = notifier
        self._lifetimes = lifetimes

    async def call(
        self,
        call: RestCall,
        *,
        writer: Writer | None = None,
        changes: list[StatusChange] | None = None,
        created: list[str] | None = None,
    ) -> RestAnswer:
        """Never raises: bad requests are 400, unknown resources 404, writes to what another
        runtime registered 403, storage failures 503. The status changes a write makes are
        published at once, or with ``changes`` left there for the caller to publish once it
        has answered. ``created``: the URLs of the entries the call created (not replaced)."""
        publish = self._notifier.publish if changes is None else _collect(changes)
        try:
            return await self._route(call, writer, publish, created)
        except _Answer as early:
            return _message(early.status, early.message)
        except InvalidRecord as bad:
            return _message(400, bad.desc)
        except StorageError:
            log.exception("registry_storage_failed", method=call.method, path=call.path_qs())
            return _message(503, "the registry's storage is unavailable")
        except Exception:  # a bug must cost one answer, not the caller
            log.exception("registry_failed", method=call.method, path=call.path_qs())
            return _message(500, "Internal Server Error")

    async def publish(self, changes: Sequence[StatusChange]) -> None:
        await self._notifier.publish(changes)

    async def holds(self, call: RestCall, claim: str) -> bool:
        match call.segments:
            case ("hyperty", "user", _, url):
                kind = EntryKind.HYPERTY
            case ("hyperty", "dataobject", url):
                kind = EntryKind.DATA_OBJECT
            case _:
                return False
        found = await self._store.find(kind, "url", url)
        return bool(found) and found[0].owner == claim

    async def claim_in_use(self, claim: str) -> bool:
        """Whether entries owned by ``claim`` are still answered (or about to be)."""
        return await self._store.owned_by(claim)

    async def _route(
        self,
        call: RestCall,
        writer: Writer | None,
        publish: Publish,
        created: list[str] | None = None,
    ) -> RestAnswer:
        """``writer``: the runtime writes are checked against; None, the operator's."""
        query = dict(call.query)
        requester = writer.claim if writer is not None else None
        match call.method, call.segments:
            case "GET", ("hyperty", ("user" | "email" | "guid") as by, key):
                return await self._hyperties(_HYPERTY_KEYS[by], key, None)
            case "GET", ("hyperty", ("user" | "email") as by, key, "hyperty"):
                return await self._hyperties(_HYPERTY_KEYS[by], key, _filters(query))
            case "GET", ("hyperty", "url", url):
                return await self._hyperty(url)
            case "PUT", ("hyperty", "user", user, url):
                return await self._register_hyperty(
                    user, url, _body(call), writer, publish, created
                )
            case "PUT", ("hyperty", "url", url):
                return await self._refresh(
                    EntryKind.HYPERTY, url, _body(call), "Hyperty updated", requester, publish
                )
            case "DELETE", ("hyperty", "user", user, url):
                written = await self._store.unregister(
                    EntryKind.HYPERTY, url, user, requester=requester
                )
                return await self._written(written, url, "Hyperty deleted", publish)
            case "PUT", ("hyperty", "dataobject", url):
                return await self._register_object(url, _body(call), writer, publish, created)
            case "PUT", ("dataobject", "url", url):
                return await self._refresh(
                    EntryKind.DATA_OBJECT,
                    url,
                    _body(call),
                    "data object updated",
                    requester,
                    publish,
                )
            case "GET", ("hyperty", "dataobject", "url", url):
                return await self._object(url)
            case "GET", ("hyperty", "dataobject", ("url" | "name" | "reporter") as by, key, "do"):
                return await self._objects(by, key, _filters(query))
            case "GET", ("hyperty", "dataobject", ("name" | "reporter") as by, key):
                return await self._objects(by, key, None)
            case "DELETE", ("hyperty", "dataobject", "url", url):
                # The user manual documents this route; the latest HypertyController has it
                # commented out (404), which leaves runtimes no way to unregister an object.
                written = await self._store.unregister(
                    EntryKind.DATA_OBJECT, url, requester=requester
                )
                return await self._written(written, url, "Data object deleted", publish)
        raise _Answer(404)

    # -- hyperties ----------------------------------------------------------------------------

    async def _hyperties(self, by: str, key: str, filters: Filters | None) -> RestAnswer:
        found = await self._store.find(EntryKind.HYPERTY, by, key)
        if filters is not None:
            found = [entry for entry in found if matches(entry, filters)]
        if not found:
            raise _Answer(404)
        # 408 when every match is disconnected: the caller learns they exist but cannot be
        # reached now (the entries still come with it).
        status = 408 if all(entry.status == DISCONNECTED for entry in found) else 200
        return _answer(status, {entry.url: hyperty_json(entry) for entry in found})

    async def _hyperty(self, url: str) -> RestAnswer:
        found = await self._store.find(EntryKind.HYPERTY, "url", url)
        if not found:
            raise _Answer(404)
        entry = found[0]
        return _answer(408 if entry.status == DISCONNECTED else 200, hyperty_json(entry))

    async def _register_hyperty(
        self,
        user: str,
        url: str,
        body: Any,
        writer: Writer | None,
        publish: Publish,
        created: list[str] | None = None,
    ) -> RestAnswer:
        values = creation(EntryKind.HYPERTY, body, self._lifetimes, _runtime(writer))
        url = valid_key("the hyperty URL", url)
        user = valid_key("the user", user)
        verified = writer is not None and _user_is_verified(user, writer.identity)
        outcome, changes = await self._store.register(
            EntryKind.HYPERTY,
            url,
            values,
            requester=writer.claim if writer is not None else None,
            user_url=user,
            email=user_email(user),
            user_verified=verified,
        )
        if outcome is Registered.CREATED and created is not None:
            created.append(url)
        await publish(changes)
        if outcome is Registered.FOREIGN:
            raise _Answer(403, _foreign(url))
        if outcome is Registered.USER_HELD:
            raise _Answer(
                403,
                f"{user} is held by another runtime's registrations: one user on several "
                "devices needs verified identities",
            )
        if outcome is Registered.OTHER_USER:
            raise _Answer(404)
        return _message(200, "Hyperty created")

    # -- data objects -------------------------------------------------------------------------

    async def _object(self, url: str) -> RestAnswer:
        found = await self._store.find(EntryKind.DATA_OBJECT, "url", url)
        if not found:
            raise _Answer(404)
        # Data-object lookups answer 200 whatever the status (DataObjectService has no 408);
        # the entry's status says whether it is disconnected.
        return _answer(200, data_object_json(found[0]))

    async def _objects(self, by: str, key: str, filters: Filters | None) -> RestAnswer:
        found = await self._store.find(EntryKind.DATA_OBJECT, by, key)
        if filters is not None:
            found = [entry for entry in found if matches(entry, filters)]
        if not found:
            raise _Answer(404)
        return _answer(200, {entry.url: data_object_json(entry) for entry in found})

    async def _register_object(
        self,
        url: str,
        body: Any,
        writer: Writer | None,
        publish: Publish,
        created: list[str] | None = None,
    ) -> RestAnswer:
        values = creation(EntryKind.DATA_OBJECT, body, self._lifetimes, _runtime(writer))
        url = valid_key("the data object URL", url)
        outcome, changes = await self._store.register(
            EntryKind.DATA_OBJECT,
            url,
            values,
            requester=writer.claim if writer is not None else None,
        )
        if outcome is Registered.CREATED and created is not None:
            created.append(url)
        await publish(changes)
        if outcome is Registered.FOREIGN:
            raise _Answer(403, _foreign(url))
        return _message(200, "Data object created")

    # -- both ---------------------------------------------------------------------------------

    async def _refresh(
        self,
        kind: EntryKind,
        url: str,
        body: Any,
        updated: str,
        requester: str | None,
        publish: Publish,
    ) -> RestAnswer:
        """``{}`` is the keep-alive; anything else updates the fields it names."""
        if body == {}:
            written = await self._store.keep_alive(kind, url, requester=requester)
            message = "Keep alive"
        else:
            values = update(kind, body, self._lifetimes)
            written = await self._store.update(kind, url, values, requester=requester)
            message = updated
        await publish(written.changes)
        if not written.found:
            raise _Answer(404)
        if written.refused:
            raise _Answer(403, _foreign(url))
        if kind is EntryKind.DATA_OBJECT:
            return _message(200, message)
        # The reference's hyperty answers carry statusChanged, as a string.
        changed = str(written.status_changed).lower()
        return _answer(200, {"statusChanged": changed, "message": message})

    async def _written(
        self, written: Written, url: str, message: str, publish: Publish
    ) -> RestAnswer:
        await publish(written.changes)
        if not written.found:
            raise _Answer(404)
        if written.refused:
            raise _Answer(403, _foreign(url))
        return _message(200, message)


def _runtime(writer: Writer | None) -> str | None:
    """The ``runtime`` of a registration through the MN that names none: its runtime's URL
    (stored, so checked as a key); None for the operator's, which must name one."""
    return None if writer is None else valid_key("the requesting runtime", writer.runtime_url)


def _foreign(url: str) -> str:
    return (
        f"{url} is registered by another runtime: only the runtime that registered it may "
        "replace, update, keep alive or delete it"
    )


def _user_is_verified(user: str, identity: Identity | None) -> bool:
    """Whether ``user`` is the runtime's verified identity (one of its spellings, compared
    exactly: see ``Identity.aliases``). A runtime with a verified identity registers under that
    identity only: any other user is 403."""
    if identity is None or not identity.authenticated:
        return False
    if identity_name(user) in identity.aliases():
        return True
    raise _Answer(
        403,
        f"the runtime is authenticated as {identity.user_url}: it registers hyperties under "
        f"that user, not {user}",
    )


_HYPERTY_KEYS: Final = {"user": "user_url", "email": "email", "guid": "guid"}


def _filters(query: Mapping[str, tuple[str, ...]]) -> Filters:
    """The advanced search's query: ``resources`` and/or ``dataSchemes``, nothing else; the
    reference answers 404 otherwise."""
    if not query or not set(query) <= set(FILTERS):
        raise _Answer(404)
    return query


def _body(call: RestCall) -> Any:
    # Parsed as JSON whatever its declared type, as the reference does.
    if not call.body:
        raise InvalidRecord("missing request body")
    try:
        return orjson.loads(call.body)
    except orjson.JSONDecodeError:
        raise InvalidRecord("the request body is not valid JSON") from None
