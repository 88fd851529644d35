"""Answers the homeserver's questions about users and aliases in the appservice's namespaces.

The homeserver blocks the request that caused a query until we answer, so answers come from one
indexed lookup; a user we own is registered before we say it exists, as the AS API requires.
"""

from __future__ import annotations

from appservice.intent import AppserviceAPI

from .storage.sessions import SessionStore


class NamespaceQueries:
    def __init__(self, api: AppserviceAPI, sessions: SessionStore, user_prefix: str) -> None:
        self._api = api
        self._sessions = sessions
        self._user_prefix = f"@{user_prefix}"
        self._suffix = f":{api.server_name}"

    async def user_exists(self, user_id: str) -> bool:
        if not (user_id.startswith(self._user_prefix) and user_id.endswith(self._suffix)):
            return False
        if not await self._sessions.has_user(user_id):
            return False
        await self._api.intent(user_id).ensure_registered()
        return True

    async def alias_exists(self, alias: str) -> bool:
        # The node creates every room it uses itself, with its alias, before using it; an alias
        # the homeserver does not know is one we never made.
        return False
