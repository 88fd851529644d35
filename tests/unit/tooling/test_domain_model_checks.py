"""The domain model's own checks (tests/support/domain_model.py), on synthetic histories: each
way a message can fall short of its promise is caught, and the tally counts duplicates."""

from __future__ import annotations

from typing import Any

from tests.support.domain_model import Actor, Domain, Sent


def _domain() -> tuple[Domain, Actor, Actor]:
    model = Domain("t")
    alice, bob = model.actor("alice", honest=True), model.actor("bob", honest=True)
    for a in (alice, bob):
        a.state = "live"
        a.hyperties.append(f"hyperty://mn.test/{a.name}")
    return model, alice, bob


def _ping(s: Sent) -> dict[str, Any]:
    return {"id": s.id, "type": "ping", "from": s.frm, "to": s.to, "body": {"n": s.n}}


def _refusal(s: Sent, code: int = 503) -> dict[str, Any]:
    return {"id": s.id, "type": "response", "from": s.to, "to": s.frm, "body": {"code": code}}


def test_a_clean_history_breaks_nothing() -> None:
    model, alice, bob = _domain()
    sent = [
        model.expect(alice, alice.hyperties[0], bob.hyperties[0], refused=False, must={"bob"})
        for _ in range(3)
    ]
    bob.seen += [_ping(s) for s in sent]
    assert model.violations() == [] and model.pending() == []
    assert model.tally() == {
        "attempted": 3,
        "delivered": 3,
        "refused": 0,
        "handed twice": 0,
        "filter drops": 0,
    }


def test_a_message_handed_twice_out_of_order_or_lost_is_caught() -> None:
    model, alice, bob = _domain()
    first, second, third = (
        model.expect(alice, alice.hyperties[0], bob.hyperties[0], refused=False, must={"bob"})
        for _ in range(3)
    )
    bob.seen += [_ping(second), _ping(first), _ping(second)]
    broken = "\n".join(model.violations())
    assert f"bob was handed {second.id}" in broken and "twice" in broken
    assert f"bob received alice's {first.id} after a later one" in broken
    assert any(third.id in p for p in model.pending())
    assert model.tally()["handed twice"] == 1


def test_a_message_sent_during_a_fault_is_delivered_or_refused_never_both() -> None:
    model, alice, bob = _domain()
    delivered, refused, both = (
        model.expect(alice, alice.hyperties[0], bob.hyperties[0], refused=None, must={"bob"})
        for _ in range(3)
    )
    for s in (delivered, refused, both):
        s.either = True
    bob.seen += [_ping(delivered), _ping(both)]
    alice.seen += [_refusal(refused), _refusal(both)]
    assert model.pending() == []
    assert model.violations() == [f"{both.id} () was refused {{'code': 503}}, yet reached ['bob']"]
    assert model.tally()["refused"] == 2


def test_a_stubs_filter_dropping_a_delivery_is_allowed_only_after_a_kill() -> None:
    model, _alice, bob = _domain()
    bob.duplicates = 1
    assert model.violations() == ["bob's stub dropped 1 deliveries sent twice"]
    model.crashed = True
    assert model.violations() == []
    assert model.tally()["filter drops"] == 1


def test_a_message_handed_twice_is_caught_even_after_a_kill() -> None:
    """Issue 43: a runtime reloaded around a kill of the node was excused; no longer."""
    model, alice, bob = _domain()
    s = model.expect(alice, alice.hyperties[0], bob.hyperties[0], refused=False, must={"bob"})
    bob.seen += [_ping(s), _ping(s)]
    model.crashed = True
    assert model.violations() == [f"bob was handed {s.id} () twice"]
    assert model.tally()["handed twice"] == 1


def test_a_delivered_message_refused_later_is_caught_even_after_a_kill() -> None:
    """Issue 43: the sender of a message delivered before a kill, answered 404 when the lane
    was read again, was excused; no longer."""
    model, alice, bob = _domain()
    s = model.expect(alice, alice.hyperties[0], bob.hyperties[0], refused=False, must={"bob"})
    bob.seen.append(_ping(s))
    alice.seen.append(_refusal(s, 404))
    model.crashed = True
    assert model.violations() == [f"{s.id} (, {s.frm} -> {s.to}) was refused: {{'code': 404}}"]
