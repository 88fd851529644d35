"""JACPoL targets and conditions, compiled once into predicates over a ``PolicyRequest``.

Grammar (reTHINK's message-node policy language, dev-msg-node-nodejs ``prp/policy/readme.md``):

* a condition is an object whose keys are and-ed, an array whose items are or-ed (empty: always
  true), or one of ``{"allOf": [...]}``, ``{"anyOf": [...]}``, ``{"not": ...}``;
* an object key that names an attribute takes an expression: ``{"<operator>": <parameter>}``
  (several operators and-ed), an array of expressions (or-ed), or ``allOf``/``anyOf``/``not``
  over expressions;
* operators: ``equals`` (a value or an array of alternatives; ``"*"`` is any known value),
  ``in`` (an array), ``contains`` and ``like`` (a glob, ``*`` any run of characters, anchored,
  e.g. ``*@gmail.com``) for strings, ``moreThan``/``lessThan``/``between`` for time
  (``HH:MM[:SS]``), date (``YYYY-MM-DD``) and weekday; ``between`` takes ``"<start> <end>"``
  (or an array of such ranges), both ends included, and a time range whose end is before its
  start runs past midnight.

String comparisons ignore case. Every problem is reported with its path; nothing is evaluated
from a document that has one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any, Final

from .attributes import ALIASES, ATTRIBUTES, GETTERS, AttributeKind, PolicyRequest, Values
from .issues import Issues, join, kind_of

Predicate = Callable[[PolicyRequest], bool]
ValuesTest = Callable[[Values], bool]

LOGICAL: Final = frozenset({"allOf", "anyOf", "not"})
OPERATORS: Final = frozenset(
    {"in", "equals", "moreThan", "lessThan", "between", "contains", "like"}
)
_ORDERED: Final[frozenset[AttributeKind]] = frozenset({"time", "date", "weekday"})
_WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_TIME_RE: Final = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?")
_DAY_SECONDS: Final = 24 * 3600


def always_holds(_: PolicyRequest) -> bool:
    return True


def _all(predicates: Sequence[Predicate]) -> Predicate:
    if not predicates:
        return always_holds
    if len(predicates) == 1:
        return predicates[0]
    items = tuple(predicates)

    # A plain loop: every message runs it, and all() over a generator costs more per call.
    def every(request: PolicyRequest) -> bool:
        for predicate in items:  # noqa: SIM110
            if not predicate(request):
                return False
        return True

    return every


def _any(predicates: Sequence[Predicate]) -> Predicate:
    if len(predicates) == 1:
        return predicates[0]
    items = tuple(predicates)

    def some(request: PolicyRequest) -> bool:
        for predicate in items:  # noqa: SIM110
            if predicate(request):
                return True
        return False

    return some


def _not(predicate: Predicate) -> Predicate:
    return lambda request: not predicate(request)


def compile_condition(document: Any, path: str, issues: Issues) -> Predicate:
    """A target or condition. An empty object or array (or an absent field) always holds."""
    if isinstance(document, list):
        if not document:
            return always_holds
        return _any(
            [compile_condition(item, join(path, i), issues) for i, item in enumerate(document)]
        )
    if not isinstance(document, dict):
        issues.add(path, f"must be an object or an array of conditions, not {kind_of(document)}")
        return always_holds
    parts: list[Predicate] = []
    for key, value in document.items():
        where = join(path, key)
        if key == "not":
            parts.append(_not(compile_condition(value, where, issues)))
        elif key in ("allOf", "anyOf"):
            items = value if isinstance(value, list) else [value]
            if not items:
                issues.add(where, f"{key} needs at least one condition")
                continue
            compiled = [
                compile_condition(item, join(where, i), issues) for i, item in enumerate(items)
            ]
            parts.append(_all(compiled) if key == "allOf" else _any(compiled))
        elif key in ATTRIBUTES or key in ALIASES:
            attribute = ALIASES.get(key, key)
            test = _compile_expression(value, attribute, where, issues)
            parts.append(_attribute_predicate(attribute, test))
        elif key in OPERATORS:
            issues.add(
                where,
                f"operator {key!r} must be inside an attribute, e.g. "
                f'{{"srcUsername": {{"{key}": ...}}}}',
            )
        else:
            issues.add(where, f"unknown attribute; known: {', '.join(sorted(ATTRIBUTES))}")
    return _all(parts)


def _attribute_predicate(attribute: str, test: ValuesTest) -> Predicate:
    getter = GETTERS[attribute]

    # PolicyRequest.values inlined: this runs for every attribute test of every message.
    def predicate(request: PolicyRequest) -> bool:
        memo = request.memo
        values = memo.get(attribute)
        if values is None:
            values = memo[attribute] = getter(request)
        return test(values)

    return predicate


def _compile_expression(expr: Any, attribute: str, path: str, issues: Issues) -> ValuesTest:
    if isinstance(expr, list):
        if not expr:
            issues.add(path, "an array of alternatives must not be empty")
            return lambda values: False
        tests = [
            _compile_expression(e, attribute, join(path, i), issues) for i, e in enumerate(expr)
        ]
        return lambda values: any(t(values) for t in tests)
    if not isinstance(expr, dict) or not expr:
        issues.add(
            path,
            'must be an expression such as {"equals": ...}, not '
            + (kind_of(expr) if expr != {} else "an empty object"),
        )
        return lambda values: False
    parts: list[ValuesTest] = []
    for key, param in expr.items():
        where = join(path, key)
        if key == "not":
            parts.append(_negated(_compile_expression(param, attribute, where, issues)))
        elif key in ("allOf", "anyOf"):
            items = param if isinstance(param, list) else [param]
            if not items:
                issues.add(where, f"{key} needs at least one expression")
                continue
            compiled = [
                _compile_expression(p, attribute, join(where, i), issues)
                for i, p in enumerate(items)
            ]
            parts.append(_every(compiled) if key == "allOf" else _some(compiled))
        elif key in OPERATORS:
            parts.append(_compile_operator(key, param, attribute, where, issues))
        else:
            issues.add(where, f"unknown operator; known: {', '.join(sorted(OPERATORS | LOGICAL))}")
    if not parts:  # every key was in error, already reported
        return lambda values: False
    return parts[0] if len(parts) == 1 else _every(parts)


def _negated(test: ValuesTest) -> ValuesTest:
    return lambda values: not test(values)


def _every(tests: Sequence[ValuesTest]) -> ValuesTest:
    items = tuple(tests)
    return lambda values: all(t(values) for t in items)


def _some(tests: Sequence[ValuesTest]) -> ValuesTest:
    items = tuple(tests)
    return lambda values: any(t(values) for t in items)


def _compile_operator(op: str, param: Any, attribute: str, path: str, issues: Issues) -> ValuesTest:
    kind = ATTRIBUTES[attribute]
    never: ValuesTest = lambda values: False  # noqa: E731 - placeholder after an error
    if op in ("equals", "in"):
        if op == "in" and not isinstance(param, list):
            issues.add(path, f"'in' takes an array of values, not {kind_of(param)}")
            return never
        alternatives = param if isinstance(param, list) else [param]
        if not alternatives:
            issues.add(path, "needs at least one value")
            return never
        if op == "equals" and any(a == "*" for a in alternatives):
            return lambda values: bool(values)
        wanted = frozenset(
            _scalar(kind, a, join(path, i) if isinstance(param, list) else path, issues)
            for i, a in enumerate(alternatives)
        )
        return lambda values: not wanted.isdisjoint(values)
    if op in ("contains", "like"):
        if kind != "string":
            issues.add(path, f"'{op}' applies to string attributes; {attribute} is a {kind}")
            return never
        patterns = param if isinstance(param, list) else [param]
        if not patterns or not all(isinstance(p, str) and p for p in patterns):
            issues.add(path, f"'{op}' takes a non-empty string or an array of them")
            return never
        folded = [p.casefold() for p in patterns]
        if op == "contains":

            def contains(values: Values) -> bool:
                for value in values:
                    for part in folded:
                        if part in value:
                            return True
                return False

            return contains
        regex = re.compile(
            "|".join("(?:" + ".*".join(map(re.escape, p.split("*"))) + ")" for p in folded),
            re.DOTALL,
        )
        match = regex.fullmatch

        def like(values: Values) -> bool:
            for value in values:  # noqa: SIM110 - cheaper than any() over a generator
                if match(value) is not None:
                    return True
            return False

        return like
    if kind not in _ORDERED:
        issues.add(path, f"'{op}' applies to time, date and weekday; {attribute} is a {kind}")
        return never
    if op == "between":
        ranges = param if isinstance(param, list) else [param]
        bounds = [
            _range(kind, r, join(path, i) if isinstance(param, list) else path, issues)
            for i, r in enumerate(ranges)
        ]
        if not ranges:
            issues.add(path, "needs at least one range")

        def between(values: Values) -> bool:
            for value in values:
                for low, high in bounds:
                    if _within(value, low, high, kind):
                        return True
            return False

        return between
    if isinstance(param, list):
        issues.add(path, f"'{op}' takes one value, not an array")
        return never
    limit = _scalar(kind, param, path, issues)
    if op == "moreThan":
        return lambda values: bool(values) and max(values) > limit
    return lambda values: bool(values) and min(values) < limit


def _within(value: int, low: int, high: int, kind: AttributeKind) -> bool:
    if low <= high:
        return low <= value <= high
    # A range past the end of the day (or week): 22:00 06:00, saturday monday.
    return kind != "date" and (value >= low or value <= high)


def _range(kind: AttributeKind, text: Any, path: str, issues: Issues) -> tuple[int, int]:
    parts = text.split() if isinstance(text, str) else []
    if len(parts) != 2:
        issues.add(path, f'a range is "<start> <end>" separated by a space, got {text!r}')
        return (0, -1)
    low, high = (_scalar(kind, p, path, issues) for p in parts)
    if kind == "date" and low > high:
        issues.add(path, f"the range ends before it starts: {text!r}")
    return (low, high)


def _scalar(kind: AttributeKind, value: Any, path: str, issues: Issues) -> Any:
    """A parameter in the form the attribute's values take."""
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        issues.add(path, f"expects true or false, not {value!r}")
        return None
    if kind == "string":
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value).casefold()
        issues.add(path, f"expects a string, not {kind_of(value)}")
        return None
    if not isinstance(value, str):
        issues.add(path, f"expects a {kind} string, not {kind_of(value)}")
        return -1
    if kind == "time":
        found = _TIME_RE.fullmatch(value.strip())
        if found is None:
            issues.add(path, f"expects a time HH:MM[:SS], not {value!r}")
            return -1
        hours, minutes, seconds = found.groups()
        return int(hours) * 3600 + int(minutes) * 60 + int(seconds or 0)
    if kind == "date":
        try:
            return date.fromisoformat(value.strip()).toordinal()
        except ValueError:
            issues.add(path, f"expects a date YYYY-MM-DD, not {value!r}")
            return -1
    name = value.strip().casefold()
    for index, day in enumerate(_WEEKDAYS):
        if name in (day, day[:3]):
            return index
    issues.add(path, f"expects a weekday (monday ... sunday), not {value!r}")
    return -1
