"""The message gate: a hook on every message a runtime sends, before it is routed.

Who may speak from which address is not decided here but by the reference monitor (access.py),
before this gate is asked. Three kinds of decision, in this order:
1. rate limiting: a token bucket per session (429), off unless configured;
2. the configuration's rules: the first whose globs match the message's type, from and to
   decides (allow, or deny with a code and reason); no match goes on;
3. the operator's rules managed at run time (adapter/policies: target, condition, effect,
   combined by the configured algorithm, with the sender's verified identity as attributes);
   a deny is a 403 naming the rule.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from ..config import PolicyConfig, PolicyRule
from ..envelope import Message
from ..identity.model import Identity
from ..policies.attributes import PolicyRequest
from ..policies.engine import RuleEngine


@dataclass(frozen=True, slots=True)
class Denial:
    code: int
    reason: str


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float) -> None:
        self.tokens = tokens
        self.stamp = time.monotonic()


class MessageGate:
    """Where policy is enforced on a message: the rate limit, the configuration's rules, then
    the operator's rules, whose decisions are the ``RuleEngine``'s (policies/engine.py)."""

    def __init__(self, config: PolicyConfig, rules: RuleEngine | None = None) -> None:
        self._config = config
        self._buckets: dict[int, _Bucket] = {}
        self._rules = [_CompiledRule(r) for r in config.rules]
        self.managed = rules

    def check(
        self, session_id: int, message: Message, identity: Identity | None = None
    ) -> Denial | None:
        rate = self._config.rate_limit
        if rate.messages_per_second > 0 and not self._take_token(session_id):
            return Denial(429, f"rate limit of {rate.messages_per_second:g} messages/s exceeded")
        return self._rules_decide(message, identity)

    def _rules_decide(self, message: Message, identity: Identity | None) -> Denial | None:
        for rule in self._rules:
            if rule.matches(message):
                if rule.rule.action == "deny":
                    return Denial(rule.rule.code, rule.rule.reason or "denied by policy")
                return None
        if self.managed is not None and not self.managed.empty:
            request = PolicyRequest(
                message.type, message.from_, message.to, identity, datetime.now(UTC)
            )
            decision = self.managed.decide(request)
            if not decision.permitted:
                return Denial(403, f"denied by policy rule {decision.rule}: {decision.reason}")
        return None

    def check_subscription(
        self, runtime_url: str, identity: Identity | None, address: str
    ) -> str | None:
        """The rules on one subscription the subscription manager allows: seen as a
        ``subscribe`` from the runtime to the address. A reason to refuse it, or None."""
        request = Message("", 0, "subscribe", runtime_url, (address,), {})
        denial = self._rules_decide(request, identity)
        return None if denial is None else denial.reason

    def check_remote(self, message: Message) -> Denial | None:
        """A message a peer domain's node carried here: the rules apply again on entry (its
        sender was checked, authenticated and rate-limited by its own node)."""
        return self._rules_decide(message, None)

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
