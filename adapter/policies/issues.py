"""Validation problems of a policy document, each with the JSON path it concerns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Issue:
    path: str  # e.g. "policies[0].rules[2].condition.srcUsername.like"
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}

    def __str__(self) -> str:
        return f"{self.path or '(document)'}: {self.reason}"


class PolicyValidationError(ValueError):
    """A policy document that cannot be used; ``issues`` lists every problem found."""

    def __init__(self, issues: list[Issue]) -> None:
        super().__init__("; ".join(str(i) for i in issues))
        self.issues = tuple(issues)


class Issues:
    """Collects problems while a document is compiled, so one pass reports all of them."""

    def __init__(self) -> None:
        self.found: list[Issue] = []

    def add(self, path: str, reason: str) -> None:
        self.found.append(Issue(path, reason))

    def raise_if_any(self) -> None:
        if self.found:
            raise PolicyValidationError(self.found)


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
