"""The policy decision point: the operator's rules, combined, deciding every message.

The engine holds compiled elements (rules, policies, policy sets) by id. Every change rebuilds
one combined evaluator and swaps it in: a decision in progress keeps the evaluator it started
with, the next one sees the change. Nothing is parsed or looked up per decision beyond the
attributes the rules actually test.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .attributes import PolicyRequest
from .elements import Algorithm, Effect, Element, Evaluate, combine, ordered


@dataclass(frozen=True, slots=True)
class Decision:
    effect: Effect
    rule: str | None  # the deciding rule's path; None when no rule applied (the default)
    reason: str
    obligations: tuple[Any, ...] = ()

    @property
    def permitted(self) -> bool:
        return self.effect == "permit"


class RuleEngine:
    """The decision point over the operator's rules: given a request, permit or deny and which
    rule said so. It enforces nothing; routing/policy.py's ``MessageGate`` asks it."""

    def __init__(
        self, algorithm: Algorithm = "deny-overrides", default_effect: Effect = "permit"
    ) -> None:
        self._algorithm: Algorithm = algorithm
        # What a message no rule applies to gets: permit keeps a node without rules open.
        self._default = Decision(default_effect, None, f"no policy rule applies ({default_effect})")
        self._elements: dict[str, Element] = {}
        self._evaluate: Evaluate = combine(algorithm, [])

    @property
    def algorithm(self) -> Algorithm:
        return self._algorithm

    def ids(self) -> list[str]:
        return list(self._elements)

    @property
    def empty(self) -> bool:
        """No rule: every decision is the default (callers skip building a request)."""
        return not self._elements

    def decide(self, request: PolicyRequest) -> Decision:
        outcome = self._evaluate(request)
        if outcome is None:
            return self._default
        return Decision(outcome.effect, outcome.rule, outcome.reason, outcome.obligations)

    def replace_all(self, elements: Iterable[Element], algorithm: Algorithm) -> None:
        """Install a whole rule base at once (at start, from the store), in the given order."""
        self._elements = {element.id: element for element in elements}
        self._algorithm = algorithm
        self._rebuild()

    def put(self, element: Element) -> None:
        """Add an element, or replace the one with its id (keeping that one's place)."""
        self._elements[element.id] = element
        self._rebuild()

    def remove(self, element_id: str) -> bool:
        if self._elements.pop(element_id, None) is None:
            return False
        self._rebuild()
        return True

    def set_algorithm(self, algorithm: Algorithm) -> None:
        self._algorithm = algorithm
        self._rebuild()

    def _rebuild(self) -> None:
        self._evaluate = combine(self._algorithm, ordered(list(self._elements.values())))
