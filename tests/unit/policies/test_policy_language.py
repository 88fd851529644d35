"""The JACPoL rule language: documents load (or are refused with paths), compile, and decide."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from adapter.identity import Identity, anonymous_identity
from adapter.policies import (
    Element,
    PolicyRequest,
    PolicyValidationError,
    RuleEngine,
    compile_element,
    parse_algorithm,
)

GMAIL = Identity("user://gmail.com/alice", "accounts.google.com", "oidc", True, "alice@gmail.com")
CORP = Identity("@bob:corp.example", "corp.example", "matrix", True, "@bob:corp.example")
ANON = anonymous_identity("runtime://corp.example/9", "corp.example")
# A Tuesday, 10:15.
TUESDAY_MORNING = datetime(2026, 11, 24, 10, 15, 0)


def request(
    msg_type: str = "create",
    identity: Identity | None = GMAIL,
    *,
    frm: str = "hyperty://corp.example/h1",
    to: tuple[str, ...] = ("hyperty://corp.example/h2",),
    now: datetime = TUESDAY_MORNING,
    dst_domain: str | None = None,
) -> PolicyRequest:
    return PolicyRequest(msg_type, frm, to, identity, now, dst_domain)


def holds(condition: Any, req: PolicyRequest) -> bool:
    """Whether ``condition`` holds for ``req``: a lone deny rule with it, in a permit-by-default
    engine, denies."""
    engine = RuleEngine()
    engine.put(compile_element({"id": "c", "condition": condition, "effect": "deny"}))
    return not engine.decide(req).permitted


def issues(document: Any) -> list[tuple[str, str]]:
    with pytest.raises(PolicyValidationError) as refused:
        compile_element(document)
    return [(i.path, i.reason) for i in refused.value.issues]


# -- the documents reTHINK publishes --------------------------------------------------------------


def test_the_specs_example_rule_denies_gmail_users_creating() -> None:
    rule = {
        "id": 2,
        "target": {"actionType": {"in": ["create", "update", "subscribe"]}},
        "condition": {"srcUsername": {"like": "*@gmail.com"}},
        "effect": "deny",
        "priority": 0,
    }
    engine = RuleEngine()
    engine.put(compile_element(rule))
    denied = engine.decide(request("create"))
    assert (denied.effect, denied.rule) == ("deny", "2")
    assert "2" in denied.reason
    assert engine.decide(request("read")).permitted
    assert engine.decide(request("create", CORP)).permitted
    assert engine.decide(request("create", None)).permitted


def jacpol_policy_set() -> dict[str, Any]:
    """The shape of the Node.js MN's policy.json: a set of policies with JACPoL's algorithm names,
    per-effect obligations, array conditions and its older attribute names."""
    return {
        "id": 1,
        "version": 1,
        "update": "2017-03-14 17:18:31",
        "target": {},
        "policyCombiningAlgorithm": "allowOverrides",
        "obligations": {},
        "priority": 0,
        "policies": [
            {
                "id": 1,
                "target": {},
                "ruleCombiningAlgorithm": "blockOverrides",
                "priority": 0,
                "obligations": {"deny": {"notify": "ops@corp.example"}},
                "rules": [
                    {
                        "id": 1,
                        "target": {"srcDomain": {"equals": "gmail.com"}},
                        "condition": [
                            {
                                "weekday": {"not": {"equals": ["saturday", "sunday"]}},
                                "time": {"between": ["06:00:00 12:30:00", "13:00:00 23:00:00"]},
                            },
                            {
                                "weekday": {"equals": ["saturday", "sunday"]},
                                "time": {"between": "07:00:00 12:00:00"},
                            },
                        ],
                        "effect": "deny",
                        "obligations": {"log": True},
                        "priority": 0,
                    },
                    {
                        "id": 2,
                        "target": {"msgType": {"equals": ["registration"]}},
                        "condition": {"srcUser": {"like": "*@gmail.com"}},
                        "effect": "deny",
                        "obligations": {},
                        "priority": 0,
                    },
                    {"id": 3, "target": {}, "condition": [], "effect": "permit", "priority": 1},
                ],
            }
        ],
    }


def test_a_jacpol_policy_set_loads_and_decides() -> None:
    engine = RuleEngine(default_effect="deny")
    engine.put(compile_element(jacpol_policy_set()))
    gmail_identity = Identity("user://gmail.com/a", "gmail.com", "oidc", True, "a@gmail.com")
    # Tuesday 10:15: inside the weekday window -> the policy's deny wins (blockOverrides).
    denied = engine.decide(request(identity=gmail_identity))
    assert (denied.effect, denied.rule) == ("deny", "1/1/1")
    assert denied.obligations == ({"log": True}, {"notify": "ops@corp.example"})
    # Tuesday 12:45: between the windows -> only rule 3 applies.
    lunch = engine.decide(request(identity=gmail_identity, now=datetime(2026, 11, 24, 12, 45)))
    assert (lunch.effect, lunch.rule) == ("permit", "1/1/3")
    # Saturday 10:00: the weekend window.
    saturday = datetime(2026, 11, 28, 10, 0)
    assert engine.decide(request(identity=gmail_identity, now=saturday)).rule == "1/1/1"
    # Registration messages of gmail users are refused whatever the time.
    late = datetime(2026, 11, 24, 23, 30)
    registration = request(
        identity=gmail_identity, to=("domain://registry.corp.example",), now=late
    )
    assert engine.decide(registration).rule == "1/1/2"
    assert engine.decide(request(identity=CORP)).rule == "1/1/3"


# -- operators ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"srcUsername": {"equals": "alice@gmail.com"}}, True),
        ({"srcUsername": {"equals": "ALICE@GMAIL.COM"}}, True),
        ({"srcUsername": {"equals": ["bob@x.org", "alice@gmail.com"]}}, True),
        ({"srcUsername": {"equals": "*"}}, True),
        ({"srcUsername": {"equals": "bob@x.org"}}, False),
        ({"actionType": {"in": ["create", "update"]}}, True),
        ({"actionType": {"in": ["read"]}}, False),
        ({"srcUsername": {"like": "*@gmail.com"}}, True),
        ({"srcUsername": {"like": "alice@*"}}, True),
        ({"srcUsername": {"like": "*lic*"}}, True),
        ({"srcUsername": {"like": "*@gmail.co"}}, False),  # anchored: no partial matches
        ({"srcUsername": {"like": "a.ice@gmail.com"}}, False),  # '.' is no wildcard
        ({"srcUsername": {"contains": "gmail"}}, True),
        ({"srcUsername": {"contains": ["yahoo", "gmail"]}}, True),
        ({"srcUsername": {"contains": "yahoo"}}, False),
        ({"srcIDPDomain": {"equals": "accounts.google.com"}}, True),
        ({"srcUserId": {"equals": "user://gmail.com/alice"}}, True),
        ({"authenticated": {"equals": True}}, True),
        ({"authenticated": {"equals": False}}, False),
        ({"srcSPDomain": {"equals": "corp.example"}}, True),
        ({"msgFrom": {"like": "hyperty://corp.example/*"}}, True),
        ({"msgTo": {"equals": "hyperty://corp.example/h2"}}, True),
        ({"dstSPDomain": {"equals": "corp.example"}}, True),
        ({"msgType": {"equals": "data"}}, True),
        ({"time": {"moreThan": "10:00"}}, True),
        ({"time": {"lessThan": "10:00"}}, False),
        ({"time": {"between": "10:15 10:16"}}, True),  # both ends included
        ({"time": {"between": "22:00 11:00"}}, True),  # past midnight
        ({"time": {"between": "22:00 06:00"}}, False),
        ({"date": {"equals": "2026-11-24"}}, True),
        ({"date": {"between": "2026-11-01 2026-11-30"}}, True),
        ({"date": {"moreThan": "2026-11-24"}}, False),
        ({"weekday": {"equals": "Tuesday"}}, True),
        ({"weekday": {"equals": "tue"}}, True),
        ({"weekday": {"between": "monday friday"}}, True),
        ({"weekday": {"between": "saturday sunday"}}, False),
        ({"weekday": {"between": "saturday tuesday"}}, True),  # past the end of the week
        # boolean structure, at both levels
        ({"srcUsername": {"not": {"like": "*@gmail.com"}}}, False),
        ({"srcUsername": {"like": "*@gmail.com", "contains": "bob"}}, False),  # keys: and
        ({"srcUsername": [{"like": "*@yahoo.com"}, {"like": "*@gmail.com"}]}, True),  # array: or
        ({"srcUsername": {"anyOf": [{"equals": "x"}, {"contains": "alice"}]}}, True),
        ({"srcUsername": {"allOf": [{"equals": "x"}, {"contains": "alice"}]}}, False),
        ({"actionType": {"equals": "create"}, "authenticated": {"equals": False}}, False),
        ([{"actionType": {"equals": "read"}}, {"authenticated": {"equals": True}}], True),
        ({"anyOf": [{"actionType": {"equals": "read"}}, {"time": {"moreThan": "10:00"}}]}, True),
        ({"allOf": [{"actionType": {"equals": "read"}}, {"time": {"moreThan": "10:00"}}]}, False),
        ({"not": {"actionType": {"equals": "read"}}}, True),
        (
            {"not": [{"actionType": {"equals": "read"}}, {"actionType": {"equals": "create"}}]},
            False,
        ),
        ({}, True),
        ([], True),
    ],
)
def test_operators_and_structure(condition: Any, expected: bool) -> None:
    assert holds(condition, request()) is expected


def test_unknown_user_attributes_match_nothing_and_their_negation_everything() -> None:
    for identity in (None, ANON):
        assert not holds({"srcUsername": {"like": "*"}}, request(identity=identity))
        assert not holds({"srcUsername": {"equals": "*"}}, request(identity=identity))
        assert holds({"srcUsername": {"not": {"like": "*@gmail.com"}}}, request(identity=identity))
        assert holds({"authenticated": {"equals": False}}, request(identity=identity))
    assert holds({"srcUserId": {"equals": "runtime://corp.example/9"}}, request(identity=ANON))


def test_several_destinations_and_service_domains() -> None:
    several = request(to=("hyperty://corp.example/h2", "hyperty://partner.example/h9"))
    assert holds({"msgTo": {"like": "hyperty://partner.example/*"}}, several)
    assert holds({"dstSPDomain": {"equals": "partner.example"}}, several)
    assert not holds({"msgTo": {"not": {"like": "hyperty://partner.example/*"}}}, several)
    registry = request(to=("domain://registry.corp.example/",))
    assert holds({"dstSPDomain": {"equals": "corp.example"}}, registry)
    assert holds({"msgType": {"equals": "registration"}}, registry)
    assert holds({"dstSPDomain": {"equals": "other.example"}}, request(dst_domain="other.example"))
    for to, category in (
        ("domain://msg-node.corp.example/hyperty-address-allocation", "addressAllocation"),
        ("domain://msg-node.corp.example/sm", "subscription"),
        ("domain://idm.corp.example", "identityManagement"),
        ("global://registry/", "globalRegistry"),
    ):
        assert holds({"msgType": {"equals": category}}, request(to=(to,))), to


# -- combining ------------------------------------------------------------------------------------


def rule(rule_id: str, effect: str, priority: float = 0, **condition: Any) -> Element:
    return compile_element(
        {"id": rule_id, "condition": condition, "effect": effect, "priority": priority}
    )


def test_combining_algorithms_and_priorities() -> None:
    engine = RuleEngine(algorithm="deny-overrides")
    engine.put(rule("p", "permit", 0))
    engine.put(rule("d", "deny", 5, actionType={"equals": "create"}))
    engine.put(rule("p2", "permit", 1))
    assert engine.decide(request("create")).rule == "d"
    assert engine.decide(request("read")).rule == "p"

    engine.set_algorithm(parse_algorithm("permit-overrides"))
    assert engine.decide(request("create")).rule == "p"

    engine.set_algorithm(parse_algorithm("firstApplicable"))
    assert engine.decide(request("create")).rule == "p"  # priority 0 comes first
    engine.put(rule("p", "permit", 9))  # replaced: now last
    assert engine.decide(request("create")).rule == "p2"
    engine.put(rule("d0", "deny", 1))  # same priority as p2: document order
    assert engine.decide(request("create")).rule == "p2"

    assert engine.remove("p2") and not engine.remove("p2")
    assert engine.decide(request("create")).rule == "d0"
    assert engine.ids() == ["p", "d", "d0"]

    engine.replace_all([], "deny-overrides")
    default = engine.decide(request("create"))
    assert default.permitted and default.rule is None
    assert not RuleEngine(default_effect="deny").decide(request()).permitted


def test_nested_algorithms_and_targets() -> None:
    policy = {
        "id": "mail",
        "target": {"srcUsername": {"like": "*@gmail.com"}},
        "ruleCombiningAlgorithm": "permit-overrides",
        "rules": [
            {"id": "no", "effect": "deny"},
            {"id": "yes", "effect": "permit", "condition": {"actionType": {"equals": "read"}}},
        ],
    }
    engine = RuleEngine(default_effect="permit")
    engine.put(compile_element(policy))
    assert engine.decide(request("read")).rule == "mail/yes"
    assert engine.decide(request("create")).rule == "mail/no"
    assert engine.decide(request("create", CORP)).rule is None  # target does not match


# -- validation -----------------------------------------------------------------------------------


def test_every_problem_is_reported_with_its_path() -> None:
    found = issues(
        {
            "id": 1,
            "efect": "deny",
            "effect": "maybe",
            "priority": "high",
            "target": {"actionTyp": {"equals": "create"}},
            "condition": {
                "srcUsername": {"likes": "*@gmail.com"},
                "time": {"between": "25:00 26:00", "like": "1*"},
                "weekday": {"equals": ["funday"]},
                "actionType": {"in": "create", "moreThan": "x"},
                "authenticated": {"equals": "yes"},
                "date": {"between": ["2026-12-01 2026-11-01"]},
                "anyOf": [],
                "equals": "x",
            },
        }
    )
    paths = {path for path, _ in found}
    assert paths == {
        "efect",
        "effect",
        "priority",
        "target.actionTyp",
        "condition.srcUsername.likes",
        "condition.time.between",
        "condition.time.like",
        "condition.weekday.equals[0]",
        "condition.actionType.in",
        "condition.actionType.moreThan",
        "condition.authenticated.equals",
        "condition.date.between[0]",
        "condition.anyOf",
        "condition.equals",
    }, found
    reasons = dict(found)
    assert "unknown attribute" in reasons["target.actionTyp"]
    assert "unknown operator" in reasons["condition.srcUsername.likes"]
    assert "HH:MM" in reasons["condition.time.between"]
    assert "string attributes" in reasons["condition.time.like"]


@pytest.mark.parametrize(
    ("document", "path", "words"),
    [
        (None, "", "must be an object"),
        ([{"id": 1, "effect": "deny"}], "", "must be an object"),
        ({"id": 1}, "", "needs 'effect'"),
        ({"effect": "deny"}, "id", "needs an id"),
        ({"id": True, "effect": "deny"}, "id", "needs an id"),
        ({"id": "a/b", "effect": "deny"}, "id", "no '/'"),
        ({"id": 1, "effect": "deny", "condition": "x"}, "condition", "object or an array"),
        ({"id": 1, "effect": "deny", "obligations": 3}, "obligations", "object or an array"),
        ({"id": 1, "effect": "deny", "reason": 3}, "reason", "string"),
        ({"id": 1, "rules": "x"}, "rules", "must be an array"),
        (
            {"id": 1, "rules": [], "ruleCombiningAlgorithm": "majority"},
            "ruleCombiningAlgorithm",
            "unknown combining algorithm",
        ),
        ({"id": 1, "rules": [{"id": 1, "rules": []}]}, "rules[0]", "need an 'effect'"),
        (
            {"id": 1, "rules": [{"id": 1, "effect": "deny"}, {"id": 1, "effect": "permit"}]},
            "rules[1].id",
            "used twice",
        ),
        ({"id": 1, "policies": [{"id": 1, "effect": "deny"}]}, "policies[0]", "not rules"),
        (
            {
                "id": 1,
                "policies": [
                    {
                        "id": 2,
                        "rules": [
                            {"id": 3, "effect": "deny", "condition": {"weekday": {"equals": "x"}}}
                        ],
                    }
                ],
            },
            "policies[0].rules[0].condition.weekday.equals",
            "weekday",
        ),
        (
            {"id": 1, "effect": "deny", "condition": {"msgTo": {"in": []}}},
            "condition.msgTo.in",
            "at least one",
        ),
        (
            {"id": 1, "effect": "deny", "condition": {"msgTo": []}},
            "condition.msgTo",
            "must not be empty",
        ),
        (
            {"id": 1, "effect": "deny", "condition": {"msgTo": {}}},
            "condition.msgTo",
            "empty object",
        ),
        (
            {"id": 1, "effect": "deny", "condition": {"msgTo": {"like": ""}}},
            "condition.msgTo.like",
            "non-empty",
        ),
        (
            {"id": 1, "effect": "deny", "condition": {"time": {"moreThan": ["10:00"]}}},
            "condition.time.moreThan",
            "one value",
        ),
        (
            {"id": 1, "effect": "deny", "condition": {"time": {"between": "10:00"}}},
            "condition.time.between",
            "separated by a space",
        ),
    ],
)
def test_validation_errors(document: Any, path: str, words: str) -> None:
    found = issues(document)
    assert any(p == path and words in reason for p, reason in found), found


def test_unknown_algorithm_name_is_refused() -> None:
    with pytest.raises(PolicyValidationError, match="unknown combining algorithm"):
        parse_algorithm("majority")
    assert parse_algorithm("blockOverrides") == "deny-overrides"
