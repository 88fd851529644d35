"""The policy engine: a hook on every message a runtime sends, before it is routed.

Three kinds of decision, in this order:
1. sender ownership: a runtime may not send from an address allocated to another runtime (403);
2. rate limiting: a token bucket per session (429), off unless configured;
3. operator rules: the first rule whose globs match the message's type, from and to decides
   (allow, or deny with a code and reason); no match allows.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass

from .config import PolicyConfig, PolicyRule
from .messages import Message
from .routing.table import RoutingTable


@dataclass(frozen=True, slots=True)
class Denial:
    code: int
    reason: str


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float) -> None:
        self.tokens = tokens
        self.stamp = time.monotonic()


class PolicyEngine:
    def __init__(self, config: PolicyConfig, table: RoutingTable) -> None:
        self._config = config
        self._table = table
        self._buckets: dict[int, _Bucket] = {}
        self._rules = [_CompiledRule(r) for r in config.rules]

    def check(self, session_id: int, message: Message) -> Denial | None:
        if self._config.enforce_sender_ownership:
            owner = self._table.allocated_owner(message.from_)
            if owner is not None and owner != session_id:
                return Denial(403, f"'{message.from_}' is allocated to another runtime")
        rate = self._config.rate_limit
        if rate.messages_per_second > 0 and not self._take_token(session_id):
            return Denial(429, f"rate limit of {rate.messages_per_second:g} messages/s exceeded")
        for rule in self._rules:
            if rule.matches(message):
                if rule.rule.action == "deny":
                    return Denial(rule.rule.code, rule.rule.reason or "denied by policy")
                return None
        return None

    def _take_token(self, session_id: int) -> bool:
        rate = self._config.rate_limit
        burst = float(max(rate.burst, 1))
        bucket = self._buckets.get(session_id)
        if bucket is None:
            bucket = self._buckets[session_id] = _Bucket(burst)
        now = time.monotonic()
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.stamp) * rate.messages_per_second)
        bucket.stamp = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def forget(self, session_id: int) -> None:
        self._buckets.pop(session_id, None)


class _CompiledRule:
    def __init__(self, rule: PolicyRule) -> None:
        self.rule = rule

    def matches(self, message: Message) -> bool:
        r = self.rule
        if r.type is not None and not fnmatch.fnmatchcase(message.type, r.type.lower()):
            return False
        if r.from_ is not None and not fnmatch.fnmatchcase(message.from_, r.from_):
            return False
        return r.to is None or any(fnmatch.fnmatchcase(t, r.to) for t in message.to)
