"""Acting in Matrix as a user of the appservice's namespace.

Request shapes come from matrix-nio's sans-I/O ``Api`` builders and answers are checked with its
response classes; the transport is the appservice's shared ``HomeserverClient``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import orjson
from nio import Api, ErrorResponse, RoomCreateResponse, RoomSendResponse, UploadResponse
from nio.api import RoomPreset, RoomVisibility

from .api import HomeserverClient, MatrixError

# The builders want a token; ours travels in the Authorization header and this one is stripped.
_NO_TOKEN = ""


class Intent:
    """One Matrix user the appservice acts as (the bot or a runtime's virtual user)."""

    def __init__(self, appservice: AppserviceAPI, user_id: str, *, is_bot: bool = False) -> None:
        self._as = appservice
        self.user_id = user_id
        self._is_bot = is_bot

    def new_txn_id(self) -> str:
        return self._as.client.new_txn_id()

    @property
    def localpart(self) -> str:
        return self.user_id[1:].split(":", 1)[0]

    async def _request(self, method: str, path: str, endpoint: str, **kwargs: Any) -> Any:
        # The bot is the appservice's own user: no masquerading parameter needed.
        user_id = None if self._is_bot else self.user_id
        return await self._as.client.request(
            method, path, endpoint=endpoint, user_id=user_id, **kwargs
        )

    async def ensure_registered(self) -> None:
        """Register the user once (idempotent; M_USER_IN_USE means it already exists)."""
        if self._is_bot or self.user_id in self._as.registered:
            return
        body = {
            "type": "m.login.application_service",
            "username": self.localpart,
            "inhibit_login": True,
        }
        try:
            await self._as.client.request(
                "POST", "/_matrix/client/v3/register", endpoint="register", json_body=body
            )
        except MatrixError as exc:
            if exc.errcode != "M_USER_IN_USE":
                raise
        self._as.registered.add(self.user_id)

    async def create_room(
        self,
        *,
        alias_localpart: str | None = None,
        name: str | None = None,
        topic: str | None = None,
        invite: Sequence[str] = (),
        initial_state: Sequence[dict[str, Any]] = (),
        power_level_override: dict[str, Any] | None = None,
        federate: bool = False,
    ) -> str:
        """Create a private room, unfederated unless ``federate``; if the alias is taken, return
        the room it names."""
        await self.ensure_registered()
        method, path, data = Api.room_create(
            _NO_TOKEN,
            visibility=RoomVisibility.private,
            alias=alias_localpart,
            name=name,
            topic=topic,
            federate=federate,
            preset=RoomPreset.private_chat,
            invite=invite,
            initial_state=initial_state,
            power_level_override=power_level_override,
        )
        try:
            parsed = await self._request(
                method, path, "createRoom", data=data, content_type="application/json"
            )
        except MatrixError as exc:
            if exc.errcode == "M_ROOM_IN_USE" and alias_localpart:
                room_id = await self.resolve_alias(self._as.alias(alias_localpart))
                if room_id:
                    return room_id
            raise
        response = RoomCreateResponse.from_dict(parsed)
        if isinstance(response, ErrorResponse):
            raise MatrixError(200, "M_BAD_RESPONSE", str(response), "createRoom")
        return str(response.room_id)

    async def join(self, room_id_or_alias: str) -> str:
        await self.ensure_registered()
        method, path = Api.join(_NO_TOKEN, room_id_or_alias)
        parsed = await self._request(method, path, "join", json_body={})
        return str(parsed.get("room_id", room_id_or_alias))

    async def put_alias(self, alias: str, room_id: str) -> bool:
        """Point ``alias`` at ``room_id``; False if the alias already names another room."""
        method, path, data = Api.room_put_alias(_NO_TOKEN, alias, room_id)
        try:
            await self._request(
                method, path, "putAlias", data=data, content_type="application/json"
            )
        except MatrixError as exc:
            if exc.status != 409:
                raise
            # Taken: by another room, or by this one (a retry whose first attempt went through
            # and whose answer was lost).
            return await self.resolve_alias(alias) == room_id
        return True

    async def leave_and_forget(self, room_id: str) -> None:
        for (method, path), endpoint in (
            (Api.room_leave(_NO_TOKEN, room_id), "leave"),
            (Api.room_forget(_NO_TOKEN, room_id), "forget"),
        ):
            await self._request(method, path, endpoint, json_body={})

    async def invite(self, room_id: str, user_id: str) -> None:
        method, path, data = Api.room_invite(_NO_TOKEN, room_id, user_id)
        try:
            await self._request(method, path, "invite", data=data, content_type="application/json")
        except MatrixError as exc:
            # Already invited or joined: the state we wanted.
            if exc.status != 403 or "already" not in exc.message.lower():
                raise

    async def send_event(
        self,
        room_id: str,
        event_type: str,
        content: dict[str, Any] | bytes,
        txn_id: str | None = None,
    ) -> str:
        """Send a message event. ``content`` may be pre-serialised JSON (the node builds large
        batch contents as bytes without a second serialisation). Retrying with the same
        ``txn_id`` is idempotent: the homeserver returns the event it already created."""
        txn_id = txn_id or self._as.client.new_txn_id()
        path = f"/_matrix/client/v3/rooms/{_quote(room_id)}/send/{_quote(event_type)}/{txn_id}"
        if isinstance(content, bytes):
            parsed = await self._request(
                "PUT", path, "send", data=content, content_type="application/json"
            )
        else:
            parsed = await self._request("PUT", path, "send", json_body=content)
        response = RoomSendResponse.from_dict(parsed, room_id)
        if isinstance(response, ErrorResponse):
            raise MatrixError(200, "M_BAD_RESPONSE", str(response), "send")
        return str(response.event_id)

    async def send_receipt(self, room_id: str, event_id: str) -> None:
        """Mark ``event_id`` and everything before it in the room as read (``m.read``, not
        threaded): the receipt travels to the room's other servers and their appservices."""
        path = f"/_matrix/client/v3/rooms/{_quote(room_id)}/receipt/m.read/{_quote(event_id)}"
        await self._request("POST", path, "receipt", json_body={})

    async def upload(self, data: bytes, content_type: str, filename: str | None = None) -> str:
        """Store bytes in the media repository; returns the mxc:// URI."""
        await self.ensure_registered()
        method, path = Api.upload(_NO_TOKEN, filename)
        parsed = await self._request(method, path, "upload", data=data, content_type=content_type)
        response = UploadResponse.from_dict(parsed)
        if isinstance(response, ErrorResponse):
            raise MatrixError(200, "M_BAD_RESPONSE", str(response), "upload")
        return str(response.content_uri)

    async def download(self, mxc_uri: str) -> bytes:
        """Fetch media through the authenticated media API (Matrix v1.11)."""
        if not mxc_uri.startswith("mxc://") or mxc_uri.count("/") != 3:
            raise ValueError(f"not an mxc URI: {mxc_uri!r}")
        server_name, media_id = mxc_uri[len("mxc://") :].split("/", 1)
        # Media of another homeserver (a peer domain's batch) comes through ours, over federation.
        method, path = Api.download(server_name, media_id, allow_remote=True)
        return await self._as.client.request_bytes(
            method, path, endpoint="download", user_id=None if self._is_bot else self.user_id
        )

    async def resolve_alias(self, alias: str) -> str | None:
        method, path = Api.room_resolve_alias(alias)
        try:
            parsed = await self._request(method, path, "resolveAlias")
        except MatrixError as exc:
            if exc.status == 404:
                return None
            raise
        room_id = parsed.get("room_id")
        return str(room_id) if room_id else None

    async def messages(
        self,
        room_id: str,
        *,
        start: str | None = None,
        direction: str = "f",
        limit: int = 100,
        event_filter: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One page of a room's history, raw (the caller decodes the events it carries)."""
        method, path = Api.room_messages(
            _NO_TOKEN,
            room_id,
            start=start,
            direction=direction,
            limit=limit,
            message_filter=event_filter,
        )
        parsed = await self._request(method, path, "messages")
        if not isinstance(parsed, dict) or not isinstance(parsed.get("chunk"), list):
            raise MatrixError(200, "M_BAD_RESPONSE", "messages without a chunk", "messages")
        return parsed

    async def sync(
        self, since: str | None, event_filter: dict[str, Any], timeout_ms: int
    ) -> dict[str, Any]:
        """One /sync: what is new in the user's rooms since ``since`` (None: the latest of
        each), waiting up to ``timeout_ms`` for something. Raw; the caller reads the rooms."""
        query = {"filter": orjson.dumps(event_filter).decode(), "timeout": str(timeout_ms)}
        if since is not None:
            query["since"] = since
        parsed = await self._request("GET", "/_matrix/client/v3/sync", "sync", query=query)
        if not isinstance(parsed, dict) or not isinstance(parsed.get("next_batch"), str):
            raise MatrixError(200, "M_BAD_RESPONSE", "sync without next_batch", "sync")
        return parsed

    async def joined_members(self, room_id: str) -> set[str]:
        """The users joined to a room (as this server sees it)."""
        method, path = Api.joined_members(_NO_TOKEN, room_id)
        parsed = await self._request(method, path, "joinedMembers")
        joined = parsed.get("joined") if isinstance(parsed, dict) else None
        return set(joined) if isinstance(joined, dict) else set()

    async def state(self, room_id: str, event_type: str, state_key: str = "") -> dict[str, Any]:
        """The content of one state event of a room."""
        path = (
            f"/_matrix/client/v3/rooms/{_quote(room_id)}/state/{_quote(event_type)}/"
            f"{_quote(state_key)}"
        )
        parsed = await self._request("GET", path, "state")
        return parsed if isinstance(parsed, dict) else {}

    async def put_state(
        self, room_id: str, event_type: str, content: dict[str, Any], state_key: str = ""
    ) -> str:
        path = (
            f"/_matrix/client/v3/rooms/{_quote(room_id)}/state/{_quote(event_type)}/"
            f"{_quote(state_key)}"
        )
        parsed = await self._request("PUT", path, "putState", json_body=content)
        return str(parsed.get("event_id", "")) if isinstance(parsed, dict) else ""

    async def context(self, room_id: str, event_id: str) -> dict[str, Any] | None:
        """The event and a pagination token just after it (``end``: reading forward from it
        starts with the next event); None when the room has no such event."""
        # Asked with no events around it: Synapse's `end` then points just after the event
        # itself (with its default of 10 it points after the 5 events that follow, and a
        # forward read from it skips them; matrix-nio's builder drops a limit of 0).
        path = f"/_matrix/client/v3/rooms/{_quote(room_id)}/context/{_quote(event_id)}"
        try:
            parsed = await self._request("GET", path, "context", query={"limit": "0"})
        except MatrixError as exc:
            if exc.status == 404:
                return None
            raise
        return parsed if isinstance(parsed, dict) else None


def _quote(part: str) -> str:
    return quote(part, safe="")


class AppserviceAPI:
    """The appservice's view of the homeserver: the shared client and the intents built on it."""

    def __init__(self, client: HomeserverClient, server_name: str, sender_localpart: str) -> None:
        self.client = client
        self.server_name = server_name
        self.bot = Intent(self, self.user_id(sender_localpart), is_bot=True)
        # Users known to exist; registration is attempted once per process and user.
        self.registered: set[str] = set()

    def user_id(self, localpart: str) -> str:
        return f"@{localpart}:{self.server_name}"

    def alias(self, localpart: str) -> str:
        return f"#{localpart}:{self.server_name}"

    def intent(self, user_id: str) -> Intent:
        if user_id == self.bot.user_id:
            return self.bot
        return Intent(self, user_id)

    async def ping(self, appservice_id: str) -> float:
        """Ask the homeserver to ping us back (MSC2659): confirms both directions work and makes
        the homeserver retry its queued transactions at once. Returns its round-trip in ms."""
        txn_id = self.client.new_txn_id()
        parsed = await self.client.request(
            "POST",
            f"/_matrix/client/v1/appservice/{_quote(appservice_id)}/ping",
            endpoint="ping",
            json_body={"transaction_id": txn_id},
        )
        return float(parsed.get("duration_ms", 0))

    async def versions(self) -> dict[str, Any]:
        parsed = await self.client.request(
            "GET", "/_matrix/client/versions", endpoint="versions", retry=False
        )
        return parsed if isinstance(parsed, dict) else {}
