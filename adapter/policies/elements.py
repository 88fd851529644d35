"""JACPoL's structure: PolicySet -> Policy -> Rule, each compiled once into an evaluator.

* Rule: ``{id, target?, condition?, effect: "permit"|"deny", obligations?, priority?}`` (plus our
  optional ``reason``, the text a denial carries). It applies when its target and its condition
  hold; then its effect is the decision.
* Policy: ``{id, target?, rules, ruleCombiningAlgorithm?, obligations?, priority?}``.
* PolicySet: ``{id, target?, policies, policyCombiningAlgorithm?, obligations?, priority?,
  version?, update?}``; its policies may themselves be policy sets.

Children are evaluated in ascending ``priority`` (the Node.js MN gives an appended rule the
highest number so far), ties in document order. Combining algorithms: ``deny-overrides``
(any applicable deny wins), ``permit-overrides`` (any applicable permit wins) and
``first-applicable``; JACPoL's names (``blockOverrides``, ``allowOverrides``,
``firstApplicable``) are accepted too. When nothing applies the element is "not applicable"
(None). A policy's or set's ``obligations`` may name obligations per effect
(``{"deny": {...}}``); they are added to a decision of that effect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from .attributes import PolicyRequest
from .conditions import always_holds, compile_condition
from .issues import Issue, Issues, PolicyValidationError, join, kind_of

Effect = Literal["permit", "deny"]
Algorithm = Literal["deny-overrides", "permit-overrides", "first-applicable"]

ALGORITHMS: Final[Mapping[str, Algorithm]] = {
    "deny-overrides": "deny-overrides",
    "denyOverrides": "deny-overrides",
    "blockOverrides": "deny-overrides",
    "permit-overrides": "permit-overrides",
    "permitOverrides": "permit-overrides",
    "allowOverrides": "permit-overrides",
    "first-applicable": "first-applicable",
    "firstApplicable": "first-applicable",
}
_COMMON_KEYS: Final = frozenset({"id", "target", "obligations", "priority", "description"})
_RULE_KEYS: Final = _COMMON_KEYS | {"condition", "effect", "reason"}
_POLICY_KEYS: Final = _COMMON_KEYS | {"rules", "ruleCombiningAlgorithm"}
_SET_KEYS: Final = _COMMON_KEYS | {"policies", "policyCombiningAlgorithm", "version", "update"}


@dataclass(frozen=True, slots=True)
class Outcome:
    effect: Effect
    rule: str  # path of the deciding rule: "7", or "1/2/3" for a rule inside a policy (set)
    reason: str
    obligations: tuple[Any, ...] = ()


Evaluate = Callable[[PolicyRequest], Outcome | None]


@dataclass(frozen=True, slots=True)
class Element:
    """A compiled rule, policy or policy set."""

    id: str
    priority: float
    evaluate: Evaluate


def parse_algorithm(name: Any) -> Algorithm:
    if isinstance(name, str) and name in ALGORITHMS:
        return ALGORITHMS[name]
    raise PolicyValidationError([_algorithm_issue("", name)])


def compile_element(document: Any) -> Element:
    """Validate and compile one top-level element. Raises PolicyValidationError listing every
    problem with its path."""
    issues = Issues()
    element = _element(document, "", issues)
    issues.raise_if_any()
    assert element is not None
    return element


def combine(algorithm: Algorithm, children: Sequence[Element]) -> Evaluate:
    """One evaluator over children already in evaluation order."""
    items = tuple(child.evaluate for child in children)
    if algorithm == "first-applicable":

        def first(request: PolicyRequest) -> Outcome | None:
            for evaluate in items:
                outcome = evaluate(request)
                if outcome is not None:
                    return outcome
            return None

        return first
    winner: Effect = "deny" if algorithm == "deny-overrides" else "permit"

    def overrides(request: PolicyRequest) -> Outcome | None:
        fallback: Outcome | None = None
        for evaluate in items:
            outcome = evaluate(request)
            if outcome is not None:
                if outcome.effect == winner:
                    return outcome
                if fallback is None:
                    fallback = outcome
        return fallback

    return overrides


def ordered(children: Sequence[Element]) -> list[Element]:
    return sorted(children, key=lambda child: child.priority)  # stable: ties keep their order


def _element(document: Any, path: str, issues: Issues) -> Element | None:
    if not isinstance(document, dict):
        issues.add(path, f"a rule, policy or policy set must be an object, not {kind_of(document)}")
        return None
    if "effect" in document:
        return _rule(document, path, issues)
    if "rules" in document:
        return _policy(document, path, issues)
    if "policies" in document:
        return _policy_set(document, path, issues)
    issues.add(
        path,
        "needs 'effect' (a rule), 'rules' (a policy) or 'policies' (a policy set)",
    )
    return None


def _common(
    document: dict[str, Any], allowed: frozenset[str], what: str, path: str, issues: Issues
) -> tuple[str, float]:
    for key in document:
        if key not in allowed:
            issues.add(
                join(path, key), f"unknown field of a {what}; allowed: {', '.join(sorted(allowed))}"
            )
    raw_id = document.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or raw_id == "":
        issues.add(join(path, "id"), f"a {what} needs an id (a string or an integer)")
        element_id = "?"
    else:
        element_id = str(raw_id)
        if "/" in element_id or len(element_id) > 64:
            issues.add(join(path, "id"), "an id has at most 64 characters and no '/'")
    priority = document.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int | float):
        issues.add(join(path, "priority"), f"must be a number, not {kind_of(priority)}")
        priority = 0
    obligations = document.get("obligations")
    if obligations is not None and not isinstance(obligations, dict | list):
        issues.add(
            join(path, "obligations"), f"must be an object or an array, not {kind_of(obligations)}"
        )
    description = document.get("description")
    if description is not None and not isinstance(description, str):
        issues.add(join(path, "description"), "must be a string")
    return element_id, float(priority)


def _rule(document: dict[str, Any], path: str, issues: Issues) -> Element:
    element_id, priority = _common(document, _RULE_KEYS, "rule", path, issues)
    target = compile_condition(document.get("target", {}), join(path, "target"), issues)
    condition = compile_condition(document.get("condition", {}), join(path, "condition"), issues)
    raw_effect = document.get("effect")
    effect: Effect = "permit" if raw_effect == "permit" else "deny"
    if raw_effect not in ("permit", "deny"):
        issues.add(join(path, "effect"), f'must be "permit" or "deny", not {raw_effect!r}')
    reason = document.get("reason")
    if reason is not None and not isinstance(reason, str):
        issues.add(join(path, "reason"), "must be a string")
        reason = None
    obligations = document.get("obligations")
    outcome = Outcome(
        effect=effect,
        rule=element_id,
        reason=reason
        or f"{'permitted' if effect == 'permit' else 'denied'} by policy rule {element_id}",
        obligations=(obligations,) if obligations else (),
    )

    def evaluate(request: PolicyRequest) -> Outcome | None:
        return outcome if target(request) and condition(request) else None

    def evaluate_condition(request: PolicyRequest) -> Outcome | None:
        return outcome if condition(request) else None

    # Most rules have no target: skip calling one that always holds.
    untargeted = target is always_holds
    return Element(element_id, priority, evaluate_condition if untargeted else evaluate)


def _policy(document: dict[str, Any], path: str, issues: Issues) -> Element:
    return _container(
        document,
        path,
        issues,
        "policy",
        _POLICY_KEYS,
        "rules",
        "ruleCombiningAlgorithm",
        _rule_only,
    )


def _policy_set(document: dict[str, Any], path: str, issues: Issues) -> Element:
    return _container(
        document,
        path,
        issues,
        "policy set",
        _SET_KEYS,
        "policies",
        "policyCombiningAlgorithm",
        _policy_or_set,
    )


def _rule_only(document: Any, path: str, issues: Issues) -> Element | None:
    if isinstance(document, dict) and "effect" not in document:
        issues.add(path, "a policy's rules need an 'effect'")
        return None
    return _element(document, path, issues)


def _policy_or_set(document: Any, path: str, issues: Issues) -> Element | None:
    if isinstance(document, dict) and "effect" in document:
        issues.add(path, "a policy set holds policies or policy sets, not rules")
        return None
    return _element(document, path, issues)


def _container(
    document: dict[str, Any],
    path: str,
    issues: Issues,
    what: str,
    allowed: frozenset[str],
    children_key: str,
    algorithm_key: str,
    child: Callable[[Any, str, Issues], Element | None],
) -> Element:
    element_id, priority = _common(document, allowed, what, path, issues)
    target = compile_condition(document.get("target", {}), join(path, "target"), issues)
    name = document.get(algorithm_key, "deny-overrides")
    algorithm: Algorithm = (
        ALGORITHMS.get(name, "deny-overrides") if isinstance(name, str) else "deny-overrides"
    )
    if not isinstance(name, str) or name not in ALGORITHMS:
        issues.found.append(_algorithm_issue(join(path, algorithm_key), name))
    raw_children = document.get(children_key)
    compiled: list[Element] = []
    if not isinstance(raw_children, list):
        issues.add(join(path, children_key), f"must be an array, not {kind_of(raw_children)}")
    else:
        seen: set[str] = set()
        for index, item in enumerate(raw_children):
            where = join(join(path, children_key), index)
            element = child(item, where, issues)
            if element is None:
                continue
            if element.id in seen:
                issues.add(join(where, "id"), f"id {element.id!r} is used twice in this {what}")
            seen.add(element.id)
            compiled.append(element)
    combined = combine(algorithm, ordered(compiled))
    per_effect = document.get("obligations")
    extra: dict[str, tuple[Any, ...]] = {}
    if isinstance(per_effect, dict):
        for effect in ("permit", "deny"):
            if per_effect.get(effect):
                extra[effect] = (per_effect[effect],)

    def evaluate(request: PolicyRequest) -> Outcome | None:
        if not target(request):
            return None
        outcome = combined(request)
        if outcome is None:
            return None
        return Outcome(
            outcome.effect,
            f"{element_id}/{outcome.rule}",
            outcome.reason,
            outcome.obligations + extra.get(outcome.effect, ()),
        )

    return Element(element_id, priority, evaluate)


def _algorithm_issue(path: str, name: Any) -> Issue:
    return Issue(path, f"unknown combining algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
