"""Runtimes come and go as real runtimes do (issues 17 and 23), on SQLite and PostgreSQL: a
reload resumes at once, a stale token is moot, races between connects, closes and disconnects
resolve with defined answers, and a failure inside the node closes 1011 (resume), never 1000
(released), with nothing lost."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from ..conftest import NodeFactory
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"


async def test_a_reloaded_runtime_resumes_its_session_with_everything_kept(
    start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    page = await PyRuntime(stub_url(node), f"runtime://{D}/reload-page", acked=True).connect()
    peer = await PyRuntime(stub_url(node), f"runtime://{D}/reload-peer", acked=True).connect()
    try:
        [h] = await page.allocate(D)
        [p] = await peer.allocate(D)
        await page.drop()  # the page reloads: its old instance is gone without a word
        for i in range(5):
            await peer.send({"id": f"while-{i}", "type": "ping", "from": p, "to": h})
        # The new instance: the same runtimeURL, a new stub id, the kept token.
        reloaded = PyRuntime(page.stub_url, page.runtime_url, acked=True)
        reloaded.token = page.token
        await reloaded.connect()
        assert reloaded.connect_answer is not None
        assert reloaded.connect_answer["data"]["session"] == "resumed"
        got = await reloaded.receive_n(5, 15)
        assert [m["id"] for m in got] == [f"while-{i}" for i in range(5)]
        # Its hyperty is still its own: answers reach it.
        await peer.send({"id": "after", "type": "ping", "from": p, "to": h})
        assert (await reloaded.receive(10))["id"] == "after"
        # A stranger who knows only the runtimeURL gets nothing.
        stranger = await PyRuntime(page.stub_url, page.runtime_url).connect(
            handshake="v1", token=None
        )
        assert stranger.connect_answer is not None
        assert stranger.connect_answer["response"] == 401
        await stranger.close()
        await reloaded.close()
    finally:
        await peer.close()


async def test_a_stale_token_gets_a_new_session_at_once(
    start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    first = await PyRuntime(stub_url(node), f"runtime://{D}/stale", acked=True).connect()
    token = first.token
    await first.disconnect()
    again = PyRuntime(stub_url(node), f"runtime://{D}/stale", acked=True)
    again.token = token
    await again.connect()
    try:
        assert again.connect_answer is not None
        assert again.connect_answer["response"] == 200
        assert again.connect_answer["data"]["session"] == "new"
    finally:
        await again.close()


async def test_racing_connects_closes_and_disconnects_resolve_without_errors(
    start_node: NodeFactory, database_url: str
) -> None:
    """The reTHINK suite's pattern, many times at once: a stub disconnects and a new instance
    for the same runtimeURL connects at once; three such cycles race on each runtimeURL. A
    connect is answered 200, or 401 only while another connection holds that runtimeURL's
    session (a new instance has no token for it): then it tries again, and every cycle gets
    its five sessions, each released by its disconnect."""
    node = await start_node(database_url)
    sessions: list[tuple[str, float, float]] = []  # (runtimeURL, asked, released)
    refusals: list[tuple[str, float, float]] = []  # (runtimeURL, asked, answered)
    other: list[Any] = []

    async def cycle(n: int) -> None:
        url = f"runtime://{D}/race-{n % 4}"
        for attempt in itertools.count(1):
            assert attempt <= 500, f"{url}: a cycle never got its sessions"
            runtime = PyRuntime(stub_url(node), url, acked=True)
            asked = time.monotonic()
            await runtime.connect()
            answered = time.monotonic()
            code = (runtime.connect_answer or {}).get("response")
            if code == 200:
                await runtime.send({"id": "x", "type": "ping", "from": url, "to": url})
                await runtime.disconnect()
                assert runtime.close_code == 1000, (url, runtime.close_code)  # released
                await runtime.close()
                sessions.append((url, asked, time.monotonic()))
                done[n] += 1
                if done[n] == 5:
                    return
            else:
                await runtime.close()
                if code == 401:
                    refusals.append((url, asked, answered))
                else:
                    other.append(runtime.connect_answer)
                await asyncio.sleep(0.01 * min(attempt, 10))

    done = [0] * 12
    await asyncio.gather(*(cycle(n) for n in range(12)))
    # Refused only as the protocol says, never a server error.
    assert other == [], other
    assert done == [5] * 12 and len(sessions) == 60
    # Every 401 came while another connection of the same runtimeURL held its session.
    unexplained = [
        (url, asked)
        for url, asked, answered in refusals
        if not any(u == url and s <= answered and asked <= r for u, s, r in sessions)
    ]
    assert unexplained == [], unexplained
    print(f"60 sessions, {len(refusals)} connects refused 401 while another held the session")
    # Every session was released: nothing is left behind.
    async with asyncio.timeout(10):
        while any(node.sessions.by_runtime(f"runtime://{D}/race-{i}") for i in range(4)):
            await asyncio.sleep(0.05)


async def test_two_tabs_with_one_session_the_newer_wins(
    start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    first = await PyRuntime(stub_url(node), f"runtime://{D}/tabs", acked=True).connect()
    second = PyRuntime(stub_url(node), f"runtime://{D}/tabs", acked=True)
    second.token = first.token
    await second.connect()
    try:
        assert second.connect_answer is not None and second.connect_answer["response"] == 200
        async with asyncio.timeout(5):
            while first.close_code is None:
                await asyncio.sleep(0.02)
        assert first.close_code == 4409
    finally:
        await first.close()
        await second.close()


async def test_a_failure_inside_the_node_is_no_release_and_loses_nothing(
    start_node: NodeFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database fails while a numbered message is decided (a learned route is written):
    the connection closes 1011, the stub comes back with its token and sends the message again,
    which is routed once."""
    node = await start_node(database_url)
    sender = await PyRuntime(stub_url(node), f"runtime://{D}/fail-sender", acked=True).connect()
    receiver = await PyRuntime(stub_url(node), f"runtime://{D}/fail-receiver", acked=True).connect()
    [r] = await receiver.allocate(D)
    learn = node.routes.learn
    failures = {"left": 1}

    async def failing_learn(session_id: int, address: str) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("the database went away")
        await learn(session_id, address)

    monkeypatch.setattr(node.routes, "learn", failing_learn)
    try:
        await sender.send(
            {"id": "once", "type": "ping", "from": "hyperty://elsewhere.example/fail", "to": r}
        )
        async with asyncio.timeout(5):
            while sender.close_code is None:
                await asyncio.sleep(0.02)
        assert sender.close_code == 1011
        assert node.sessions.by_runtime(sender.runtime_url) is not None, "not released"
        await sender.connect()  # as the stub does: with its token, resending what is unacked
        assert sender.connect_answer is not None
        assert sender.connect_answer["data"]["session"] == "resumed"
        assert (await receiver.receive(10))["id"] == "once"
        assert await receiver.nothing_within(1.0)
        # Routed once: the receiver, connected throughout, was not even sent it twice.
        assert receiver.duplicates == 0 and receiver.delivered_twice == 0
        async with asyncio.timeout(5):
            while sender.unacked:
                await asyncio.sleep(0.02)
    finally:
        await sender.close()
        await receiver.close()


async def test_what_a_leaving_runtime_did_not_acknowledge_is_answered_to_its_senders(
    start_node: NodeFactory, database_url: str
) -> None:
    """The receiver took two messages, acknowledged one, and left with `disconnect`: the sender
    hears 404 for the other, not silence (the node had acknowledged it to the sender)."""
    node = await start_node(database_url)
    sender = await PyRuntime(stub_url(node), f"runtime://{D}/left-sender", acked=True).connect()
    receiver = await PyRuntime(stub_url(node), f"runtime://{D}/left-receiver", acked=True).connect()
    try:
        [r] = await receiver.allocate(D)
        [s] = await sender.allocate(D)
        await sender.send({"id": "taken", "type": "ping", "from": s, "to": r})
        assert (await receiver.receive(10))["id"] == "taken"
        receiver.hold_acks = True
        await sender.send({"id": "not-taken", "type": "ping", "from": s, "to": r})
        assert (await receiver.receive(10))["id"] == "not-taken"  # read, never acknowledged
        await receiver.disconnect()
        answer = await sender.receive(10)
        assert answer["id"] == "not-taken" and answer["body"]["code"] == 404, answer
        assert await sender.nothing_within(1.0)  # nothing for what was acknowledged
    finally:
        await sender.close()
        await receiver.close()


async def test_a_disconnect_followed_at_once_by_the_close_releases_the_session(
    start_node: NodeFactory, database_url: str
) -> None:
    """reTHINK's own stub sends `disconnect` and closes its socket in the same breath (the
    suite's tests then start a new stub for the same runtimeURL): the session is released, not
    kept for a resume."""
    node = await start_node(database_url)
    url = f"runtime://{D}/close-at-once"
    first = await PyRuntime(stub_url(node), url).connect(handshake="v2", hello=True)
    assert first.ws is not None
    await first.ws.send_str(
        '{"cmd":"disconnect","body":{"runtimeURL":"%s","via":"hyperty-runtime://x/protostub/1"}}'
        % url
    )
    await first.ws.close()
    await first.close()
    again = await PyRuntime(stub_url(node), url).connect(handshake="v2", hello=True)
    try:
        assert again.connect_answer is not None
        assert again.connect_answer["data"]["session"] == "new", again.connect_answer
    finally:
        await again.close()
