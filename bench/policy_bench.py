"""Microbenchmark of the policy engine: microseconds per decision for 10 and 100 rules.

    .venv/bin/python -m bench.policy_bench

The rules mix the operators operators write (like on user names and addresses, in on action
types, time windows, boolean structure). Under deny-overrides every rule is evaluated when none
denies, the worst case: the figures below are for messages no rule denies. Each decision builds
its PolicyRequest, as the node does per message.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime
from typing import Any

from adapter.identity import Identity
from adapter.policies import PolicyRequest, RuleEngine, compile_element

USER = Identity("@alice:corp.example", "corp.example", "matrix", True, "@alice:corp.example")


def rule(i: int) -> dict[str, Any]:
    shapes: list[dict[str, Any]] = [
        {
            "target": {"actionType": {"in": ["create", "update", "subscribe"]}},
            "condition": {"srcUsername": {"like": f"*@blocked{i}.example"}},
        },
        {"condition": {"msgTo": {"like": f"hyperty://partner{i}.example/*"}}},
        {
            "target": {"srcIDPDomain": {"equals": f"idp{i}.example"}},
            "condition": [
                {
                    "weekday": {"not": {"equals": ["saturday", "sunday"]}},
                    "time": {"between": "06:00 12:30"},
                },
                {"weekday": {"equals": ["saturday", "sunday"]}, "time": {"between": "07:00 12:00"}},
            ],
        },
        {
            "condition": {
                "allOf": [
                    {"authenticated": {"equals": False}},
                    {"msgType": {"equals": "registration"}},
                ]
            }
        },
        {"condition": {"dstSPDomain": {"in": [f"banned{i}.example", f"other{i}.example"]}}},
    ]
    return {"id": i, "effect": "deny", "priority": i, **shapes[i % len(shapes)]}


def measure(count: int, decisions: int = 20_000, rounds: int = 5) -> float:
    engine = RuleEngine(algorithm="deny-overrides")
    for i in range(count):
        engine.put(compile_element(rule(i)))
    now = datetime(2026, 11, 24, 10, 15)
    frm, to = "hyperty://corp.example/h1", ("hyperty://corp.example/h2",)
    per_round = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(decisions):
            decision = engine.decide(PolicyRequest("update", frm, to, USER, now))
        per_round.append((time.perf_counter() - start) / decisions * 1e6)
        assert decision.permitted and decision.rule is None
    return statistics.median(per_round)


def main() -> None:
    for count in (10, 100):
        print(f"{count:>4} rules: {measure(count):6.2f} us per decision (median of 5 rounds)")


if __name__ == "__main__":
    main()
