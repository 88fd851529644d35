"""What the export and the dashboard count as the domain's traffic (adapter/export/admission.py):
only events this node wrote, and a peer node's batches as that peer's, never a peer's word about
this domain's runtimes or its journal."""

from __future__ import annotations

from adapter import carrier
from adapter.export.admission import LOCAL, EventAdmission

ADMISSION = EventAdmission(
    "a.example", "_rethink_", "@_rethink_bot:a.example", {"@_rethink_bot:b.example": "b.example"}
)


def event(sender: str, kind: str = carrier.BATCH_EVENT) -> dict[str, object]:
    return {"sender": sender, "type": kind, "content": {}, "origin_server_ts": 1}


def test_this_nodes_own_events_are_local() -> None:
    assert ADMISSION.origin(event("@_rethink_bot:a.example", carrier.JOURNAL_EVENT)) == LOCAL
    assert ADMISSION.origin(event("@_rethink_abc123:a.example")) == LOCAL


def test_a_peers_batches_are_the_peers_and_its_journal_nobodys() -> None:
    assert ADMISSION.origin(event("@_rethink_bot:b.example")) == "b.example"
    assert ADMISSION.origin(event("@_rethink_bot:b.example", carrier.JOURNAL_EVENT)) is None


def test_anyone_else_in_a_shared_room_is_not_counted() -> None:
    for sender in (
        "@_rethink_abc:b.example",  # a peer's virtual user: not its node
        "@mallory:a.example",  # a human of this homeserver, not in the namespace
        "@_rethink_bot:a.example.evil",  # a server whose name starts with ours
        "@_rethink_x:evil.example",
    ):
        assert ADMISSION.origin(event(sender)) is None, sender


def test_a_peers_rows_keep_only_its_own_domains_messages() -> None:
    rows = [
        {"from": "hyperty://b.example/x", "runtime": "runtime://b.example/1"},
        {"from": "hyperty://a.example/alice", "runtime": "runtime://a.example/1"},
        {"from": "hyperty://b.example/y", "runtime": "runtime://a.example/victim"},
        {"from": None, "runtime": None},
    ]
    kept = ADMISSION.rows("b.example", rows)
    assert kept == [
        {"from": "hyperty://b.example/x", "runtime": "runtime://b.example/1"},
        {"from": "hyperty://b.example/y", "runtime": None},
    ]
    assert ADMISSION.rows(LOCAL, rows) == rows
