"""The fault suite (bench/faults.py): its checker and proxies on their own, then `--quick`
against the real node and Synapse: every scenario on SQLite (network drops and black holes, the
node and Synapse stopped and killed, the database away, Synapse answering 500 and 429, the
monkey; across domains, the partner's homeserver and node killed and the link between the two
homeservers stalled), and on PostgreSQL those where the node's database is what the fault hits:
every attempted message delivered once and in order (none lost, duplicated, reordered,
unexpected, unaccounted for or refused: no scenario expects a refusal of the bundled stub), and
delivery resumed within 5 s of each fault's end. The gate itself is tried on synthetic runs
first: it must fail each way a run can fall short (95 of 100 refused among them)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bench.fault_check import (
    FAILURES,
    Arrival,
    Attempt,
    Window,
    check,
    latencies,
    longest_gap,
    percentile,
    ranges,
    recovery_times,
)
from bench.fault_stack import HomeserverProxy, Proxy, postgres_reachable
from bench.faults import (
    CLUSTER_SCENARIOS,
    SCENARIOS,
    WORKER_SCENARIOS,
    Fault,
    Layout,
    grade,
    verdict_ok,
)

ROOT = Path(__file__).resolve().parents[2]

RECOVERY_LIMIT_S = 5.0
# Every scenario runs on SQLite; on PostgreSQL those where the node's database is what the
# fault hits: its checkpoints read back after a kill, and the database away (the whole list on
# both: bench/faults.py --quick --database sqlite,postgresql). With PostgreSQL also the domain
# on several node processes (CLUSTER_SCENARIOS).
POSTGRESQL_SCENARIOS = (
    "node-sigkill",
    "database-outage",
    *sorted(CLUSTER_SCENARIOS),
)


def sent(sender: str, seqs: range, to: str = "B", acked: bool = True) -> list[Attempt]:
    return [Attempt(sender, n, (to,), acked) for n in seqs]


def got(receiver: str, sender: str, seqs: list[int]) -> list[Arrival]:
    return [Arrival(receiver, sender, n, float(i)) for i, n in enumerate(seqs)]


# -- the checker, on synthetic histories --------------------------------------------------------


def test_a_clean_history_is_clean() -> None:
    v = check(sent("A", range(1, 6)), got("B", "A", [1, 2, 3, 4, 5]))
    assert (v.attempted, v.acknowledged, v.delivered) == (5, 5, 5)
    assert (v.lost, v.duplicated, v.reordered, v.unexpected) == (0, 0, 0, 0)
    assert v.clean


def test_lost_is_acknowledged_and_never_delivered() -> None:
    attempts = sent("A", range(1, 8)) + sent("A", range(8, 11), acked=False)
    v = check(attempts, got("B", "A", [1, 2, 5, 6, 9]))
    assert v.lost == 3  # 3, 4, 7
    assert v.unacknowledged_undelivered == 2  # 8, 10: never acknowledged, allowed to vanish
    assert v.recovered == 1  # 9: delivered without an acknowledgement
    assert v.delivered == 5
    assert v.lost_sample == ["A->B: 3-4, 7"]
    assert not v.clean


def test_every_attempt_is_delivered_or_refused_with_a_code_its_sender_saw() -> None:
    refused = [Attempt("A", n, ("B",), False, refused=True) for n in (3, 4)]
    v = check(
        sent("A", range(1, 3)) + refused + sent("A", range(5, 7), acked=False),
        got("B", "A", [1, 2]),
    )
    assert v.lost == 0 and v.unacknowledged_undelivered == 4
    assert v.unaccounted == 2  # 5, 6: neither delivered nor refused: vanished
    assert v.unaccounted_sample == ["A->B: 5-6"]


def test_duplicates_are_counted_once_per_extra_copy_and_not_as_reordering() -> None:
    v = check(sent("A", range(1, 5)), got("B", "A", [1, 2, 2, 3, 1, 4, 4, 4]))
    assert v.duplicated == 4  # 2 once, 1 once, 4 twice
    assert v.reordered == 0
    assert v.delivered == 4 and v.lost == 0
    assert v.duplicated_sample == ["A->B: 1-2, 4"]


def test_reordering_is_per_sender_and_destination() -> None:
    attempts = [Attempt("A", n, ("B" if n % 2 else "C",), True) for n in range(1, 7)]
    # To B: 1, 5, 3 (3 after 5: reordered). To C: 6 first, then 2 and 4, both late.
    arrivals = got("B", "A", [1, 5, 3]) + got("C", "A", [6, 2, 4])
    v = check(attempts, arrivals)
    assert v.reordered == 3
    assert sorted(v.reordered_sample) == ["A->B: 3", "A->C: 2, 4"]
    # Interleaved streams that are each in order are not reordered.
    v = check(attempts, got("C", "A", [2]) + got("B", "A", [1, 3]) + got("C", "A", [4, 6]))
    assert v.reordered == 0 and v.lost == 1  # 5 never came


def test_unexpected_deliveries() -> None:
    attempts = sent("A", range(1, 4))
    arrivals = [
        *got("B", "A", [1, 2, 3]),
        Arrival("B", "A", 4, 9.0),  # never sent
        Arrival("B", "Z", 1, 9.0),  # unknown sender
        Arrival("C", "A", 2, 9.0),  # sent, but not to C
        Arrival("B", "A", 3, 9.0, addressed_ok=False),  # arrived with another `to`
    ]
    v = check(attempts, arrivals)
    assert v.unexpected == 4
    assert v.duplicated == 0 and v.lost == 0


def test_publications_count_one_expected_delivery_per_subscriber() -> None:
    attempts = [Attempt("P", n, ("O1", "O2"), True) for n in (1, 2)]
    v = check(attempts, got("O1", "P", [1, 2]) + got("O2", "P", [2]))
    assert (v.messages_attempted, v.attempted, v.delivered, v.lost) == (2, 4, 3, 1)
    assert v.lost_sample == ["P->O2: 1"]


def test_an_attempt_listed_twice_is_a_harness_error() -> None:
    with pytest.raises(ValueError, match="twice"):
        check(sent("A", range(1, 3)) + sent("A", range(2, 3)), [])


def test_recovery_times() -> None:
    arrivals = [1.0, 2.0, 10.5, 11.0, 30.0]
    windows = [
        Window(end=10.0, next_start=20.0),  # first arrival after the end: 10.5
        Window(end=21.0, next_start=25.0),  # nothing before the next fault
        Window(end=29.0),  # the last fault: 30.0
        # Delivery resumed (10.5) before the probe saw the process answering (11.2): 0.
        Window(end=11.2, search_from=10.0),
    ]
    assert recovery_times(windows, arrivals) == [0.5, None, 1.0, 0.0]


def test_longest_gap_counts_from_the_stream_start() -> None:
    assert longest_gap([], since=0.0) is None
    assert longest_gap([1.0, 1.5, 4.5, 5.0]) == 3.0
    assert longest_gap([5.0, 5.5], since=0.0) == 5.0


def test_ranges() -> None:
    assert ranges([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"
    assert ranges(list(range(0, 40, 2)), limit=3) == "0, 2, 4, ... (17 more ranges)"


def test_only_an_error_code_refuses_and_a_refusal_counts_unless_excused() -> None:
    attempts = [
        Attempt("A", 1, ("B",), False, refused=True),  # refused, and expected
        Attempt("A", 2, ("B",), False, refused=True, excused=True),
        Attempt("A", 3, ("B",), False, refused=True, excused=True),  # ...but delivered
        *sent("A", range(4, 6)),
    ]
    v = check(attempts, got("B", "A", [3, 4, 5]))
    assert (v.refused, v.refused_excused, v.refused_unexpected, v.refused_delivered) == (3, 2, 1, 1)
    assert v.refused_unexpected_sample == ["A->B: 1"]
    assert v.unaccounted == 0 and not v.clean
    assert {k for k, n in v.failures().items() if n} == {"refused_unexpected", "refused_delivered"}


def test_latencies_count_what_never_arrived_as_infinitely_late() -> None:
    attempts = sent("A", range(1, 101))
    arrivals = [Arrival("B", "A", n, 10.0 + n / 1000, True, 10.0) for n in range(1, 100)]
    waits = latencies(attempts, [*arrivals, arrivals[0]])  # a duplicate is no second sample
    assert len(waits) == 100 and waits.count(math.inf) == 1
    assert percentile(waits, 50) == pytest.approx(0.051)
    assert percentile(waits, 99) == math.inf  # the 100th never came: p99 is "never"


# -- the gate: a whole run graded as bench/faults.py grades it, on synthetic runtimes' reports ----

T0 = 1_000_000.0
RECOVERY = RECOVERY_LIMIT_S


def run(
    scenario: str = "none",
    stub: str = "acknowledged",
    delivered: range | list[int] = range(1, 101),
    refusals: list[tuple[int, int, float]] | None = None,
    answered: dict[str, list[int]] | None = None,
    faults: list[Fault] | None = None,
    attempted: int = 100,
    extra: list[Arrival] | None = None,
) -> dict[str, Any]:
    """One sender A streaming 100 messages to B over 2 s: what its runtimes would report."""
    layout = Layout({"A": ["B"]}, ["B"], 100, 50.0)
    final = {
        "attempted": attempted,
        "acked_through": attempted,
        "ack_source": "stub",
        "refusals": [[seq, code, t * 1000] for seq, code, t in refusals or []],
        "answered": answered or {},
    }
    arrivals = [Arrival("B", "A", n, T0 + n / 50 + 0.03, True, T0 + n / 50) for n in delivered]
    graded = grade(
        scenario,
        stub,
        layout,
        {"A": final},
        arrivals + (extra or []),
        faults or [],
        {"A": [(T0 + 2.0, attempted)]},
        T0,
        RECOVERY,
    )
    return {"drained": True, **graded}


def refused_503(seqs: range, at: float = T0 + 1.0) -> list[tuple[int, int, float]]:
    return [(n, 503, at) for n in seqs]


def test_the_gate_passes_an_honest_clean_run() -> None:
    result = run()
    assert verdict_ok(result, RECOVERY), result["counts"]
    assert result["latency_ms"]["p99"] == pytest.approx(30.0)
    assert result["latency_ms"]["never_arrived"] == 0


def test_the_gate_fails_95_refused_of_100() -> None:
    result = run(delivered=range(96, 101), refusals=refused_503(range(1, 96)))
    assert not verdict_ok(result, RECOVERY)
    counts = result["counts"]
    assert (counts["refused"], counts["refused_unexpected"], counts["lost"]) == (95, 95, 0)
    assert result["refused_by_node"] == {"503": 95}
    assert result["latency_ms"]["p50"] == "never"
    # The bundled stub expects no refusal in any scenario, a fault of the database included.
    outage = [Fault("database", None, T0 + 0.5, T0 + 1.5)]
    result = run(
        "database-outage", "acknowledged", range(96, 101), refused_503(range(1, 96)), faults=outage
    )
    assert result["counts"]["refused_excused"] == 0 and not verdict_ok(result, RECOVERY)


def test_a_plain_stubs_refusals_are_excused_only_while_a_fault_that_explains_them_is_on() -> None:
    outage = [Fault("database", None, T0 + 0.5, T0 + 1.5)]
    during = refused_503(range(30, 60), at=T0 + 1.0)
    result = run(
        "database-outage", "plain", [*range(1, 30), *range(60, 101)], during, faults=outage
    )
    assert result["counts"]["refused_excused"] == 30
    assert verdict_ok(result, RECOVERY), result["counts"]
    # The same refusals answered long after the outage ended (or in another scenario, or with
    # another code) are failures.
    late = refused_503(range(30, 60), at=T0 + 1.5 + RECOVERY + 1)
    result = run("database-outage", "plain", [*range(1, 30), *range(60, 101)], late, faults=outage)
    assert not verdict_ok(result, RECOVERY)
    result = run("network", "plain", [*range(1, 30), *range(60, 101)], during, faults=outage)
    assert not verdict_ok(result, RECOVERY)
    wrong = [(n, 500, T0 + 1.0) for n in range(30, 60)]
    result = run("database-outage", "plain", [*range(1, 30), *range(60, 101)], wrong, faults=outage)
    assert not verdict_ok(result, RECOVERY)


def test_an_answer_without_an_error_code_is_no_refusal() -> None:
    """A 200 (or no code) to a numbered message excuses nothing: the message must arrive."""
    result = run(delivered=range(96, 101), answered={"200": list(range(1, 96))})
    assert result["counts"]["refused"] == 0 and result["counts"]["unaccounted"] == 95
    assert result["answered_not_refused"] == {"200": 95}
    assert not verdict_ok(result, RECOVERY)


def test_the_gate_fails_a_refusal_that_was_delivered_all_the_same() -> None:
    outage = [Fault("database", None, T0 + 0.5, T0 + 1.5)]
    result = run("database-outage", "plain", refusals=refused_503(range(30, 31)), faults=outage)
    assert result["counts"]["refused_delivered"] == 1
    assert not verdict_ok(result, RECOVERY)


def test_the_gate_fails_a_run_short_of_its_plan_or_not_drained_or_with_any_failure() -> None:
    assert not verdict_ok(run(delivered=range(1, 51), attempted=50), RECOVERY)
    assert not verdict_ok(run() | {"drained": False}, RECOVERY)
    assert not verdict_ok(run() | {"error": "boom"}, RECOVERY)
    lost = run(delivered=range(1, 100))
    assert lost["counts"]["lost"] == 1 and not verdict_ok(lost, RECOVERY)
    twice = run(extra=[Arrival("B", "A", 7, T0 + 3.0, True, T0)])
    assert twice["counts"]["duplicated"] == 1 and not verdict_ok(twice, RECOVERY)
    elsewhere = run(extra=[Arrival("C", "A", 7, T0 + 3.0, True, T0)])
    assert elsewhere["counts"]["unexpected"] == 1 and not verdict_ok(elsewhere, RECOVERY)
    swapped = run(delivered=[*range(1, 50), 51, 50, *range(52, 101)])
    assert swapped["counts"]["reordered"] == 1 and not verdict_ok(swapped, RECOVERY)
    for key in FAILURES:
        assert not verdict_ok(run() | {"counts": {**run()["counts"], key: 1}}, RECOVERY), key


def test_the_gate_fails_a_fault_delivery_never_or_late_resumed_after() -> None:
    # A network drop 1.0-1.2 s in: with delivery stopping at 1.0 s and resuming at 7.2 s.
    drop = Fault("network-drop", None, T0 + 1.0, T0 + 1.2)
    late = [
        Arrival("B", "A", n, T0 + (n / 50 + 0.03 if n <= 45 else 7.2 + n / 1000), True, T0)
        for n in range(1, 101)
    ]
    layout = Layout({"A": ["B"]}, ["B"], 100, 50.0)
    final = {"attempted": 100, "acked_through": 100, "ack_source": "stub", "refusals": []}
    result = {"drained": True} | grade(
        "network",
        "acknowledged",
        layout,
        {"A": final},
        late,
        [drop],
        {"A": [(T0 + 2.0, 100)]},
        T0,
        RECOVERY,
    )
    assert result["faults"][0]["recovery_s"] > RECOVERY
    assert not verdict_ok(result, RECOVERY)
    assert verdict_ok(run(faults=[Fault("network-drop", None, T0 + 1.0, T0 + 1.2)]), RECOVERY)


# -- the proxy ----------------------------------------------------------------------------------


async def test_the_proxy_forwards_cuts_refuses_and_blackholes() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = Proxy(server.sockets[0].getsockname()[1])
    port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.read(4), 5) == b"ping"
        assert proxy.open_connections == 1

        proxy.blackhole = True
        writer.write(b"void")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(4), 0.3)
        assert proxy.discarded_bytes == 4
        proxy.blackhole = False

        assert proxy.cut() == 1
        assert await asyncio.wait_for(_closed(reader), 5)
        assert proxy.open_connections == 0

        proxy.refusing = True
        reader, _ = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(_closed(reader), 5)
        assert proxy.refused == 1
        proxy.refusing = False

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"back")
        assert await asyncio.wait_for(reader.read(4), 5) == b"back"

        # A stalled link: nothing passes, nothing is lost, and it all passes once it flows.
        proxy.stalled = True
        await asyncio.sleep(0.05)  # the pumps' reads in progress see the stall
        writer.write(b"late")
        later_reader, later_writer = await asyncio.open_connection("127.0.0.1", port)
        later_writer.write(b"new!")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(4), 0.3)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(later_reader.read(4), 0.1)
        proxy.stalled = False
        assert await asyncio.wait_for(reader.read(4), 5) == b"late"
        assert await asyncio.wait_for(later_reader.read(4), 5) == b"new!"
        writer.close()
        later_writer.close()
    finally:
        await proxy.close()
        server.close()


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read(1) == b""
    except ConnectionError:
        return True


# -- the runtime's bookkeeping, with a fake stub that has acknowledgements -----------------------

FAKE_STUB = """
// Answers allocations itself, acknowledges (cumulatively, in the order handed) every message up to
// the one numbered 7, refuses number 5 with a 503, answers number 6 with a 200 (no refusal) and
// number 8 with no code at all, and on the warm-up delivers two numbered messages (one twice).
export function activate(url, bus, config) {
  let sent = 0, acknowledged = 0;
  const instance = { get stats() { return { sent, acknowledged, unacknowledged: sent - acknowledged,
                                            delivered: 0, duplicates: 0 }; } };
  bus.addListener('*', (msg) => {
    sent += 1;
    const answer = (body) => bus.postMessage({ id: msg.id, type: 'response', from: msg.to,
                                               to: msg.from, body });
    if (msg.type === 'create') {
      acknowledged = sent;
      answer({ code: 200, value: { allocated: ['hyperty://fake/a'] } });
    } else if (msg.body.seq === 0) {
      // The warm-up: the runtime knows its address by now.
      for (const seq of [1, 2, 2]) bus.postMessage({ id: 'x', type: 'update',
        from: 'hyperty://fake/z', to: 'hyperty://fake/a', body: { sender: 'Z', seq, t: 1 } });
    } else if (msg.body.seq <= 7) {
      acknowledged = sent;
    }
    if (msg.body?.seq === 5) answer({ code: 503, desc: 'homeserver down' });
    if (msg.body?.seq === 6) answer({ code: 200 });
    if (msg.body?.seq === 8) answer({ desc: 'no code' });
  });
  return { name: 'Fake', instance };
}
"""


async def test_the_homeserver_proxy_forwards_or_answers_errors() -> None:
    async def upstream(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {"path": request.path_qs, "method": request.method, "body": body.decode()}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    proxy = HomeserverProxy(f"http://127.0.0.1:{port}")
    url = await proxy.start()
    try:
        async with aiohttp.ClientSession() as http:
            path = "/_matrix/client/v3/rooms/!r/send/m.room.message/t1?user_id=@a:hs"
            async with http.put(url + path, data=b'{"x":1}') as resp:
                assert resp.status == 200
                assert await resp.json() == {"path": path, "method": "PUT", "body": '{"x":1}'}
            proxy.failing = 429
            async with http.get(url + "/_matrix/client/versions") as resp:
                assert resp.status == 429
                assert (await resp.json())["errcode"] == "M_LIMIT_EXCEEDED"
            proxy.failing = 500
            async with http.get(url + "/_matrix/client/versions") as resp:
                assert resp.status == 500
            assert proxy.failed == 2
            proxy.failing = None
            async with http.get(url + "/_matrix/client/versions") as resp:
                assert resp.status == 200
    finally:
        await proxy.close()
        await runner.cleanup()


async def test_the_runtime_reports_acknowledged_prefix_refusals_and_arrivals(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "fake-stub.mjs"
    fake.write_text(FAKE_STUB)
    spec = {
        "name": "A",
        "role": "sender",
        "domain": "fake",
        "url": "ws://127.0.0.1:9/stub/connect",
        "tag": "t",
        "count": 10,
        "rate": 1000,
        "stubModule": str(fake),
    }
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(ROOT / "bench" / "fault_runtime.mjs"),
        json.dumps(spec),
        cwd=ROOT / "bench",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    lines: list[Any] = []

    async def until(predicate: Any) -> Any:
        while True:
            raw = await asyncio.wait_for(proc.stdout.readline(), 10)  # type: ignore[union-attr]
            assert raw, (lines, (await proc.stderr.read()).decode())  # type: ignore[union-attr]
            lines.append(json.loads(raw))
            if predicate(lines[-1]):
                return lines[-1]

    ready = await until(lambda v: isinstance(v, dict) and v.get("ev") == "ready")
    assert ready["address"] == "hyperty://fake/a"
    for command in (
        {"cmd": "warmup", "targets": ["hyperty://fake/b"]},
        {"cmd": "go", "targets": ["hyperty://fake/b"]},
    ):
        proc.stdin.write((json.dumps(command) + "\n").encode())
    await until(lambda v: isinstance(v, dict) and v.get("ev") == "sent")
    proc.stdin.write(b'{"cmd": "final"}\n')
    final = await until(lambda v: isinstance(v, dict) and v.get("ev") == "final")
    await asyncio.wait_for(proc.wait(), 10)

    assert final["attempted"] == 10
    assert final["ack_source"].startswith("stub:")
    # Handed: the allocation, the warm-up, then 1..10; acknowledged through number 7.
    assert (final["handed_before_stream"], final["acked_through"]) == (2, 7)
    # A refusal is an answer with an error code; a 200 or an answer without a code is none.
    assert [(seq, code) for seq, code, _ in final["refusals"]] == [(5, 503)]
    assert final["answered"] == {"200": [6], "none": [8]}
    arrivals = [v for v in lines if isinstance(v, list)]
    assert [(a[1], a[2], a[4]) for a in arrivals] == [("Z", 1, 1), ("Z", 2, 1), ("Z", 2, 1)]


# -- the quick run against the real node --------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["sqlite", "postgresql", "synapse-workers"])
async def test_quick_fault_suite(
    mode: str, tmp_path: Path, synapse_python: Path, request: pytest.FixtureRequest
) -> None:
    """``mode``: the node's database, or (synapse-workers) Synapse in worker mode, its faults:
    the homeserver killed with its workers, one event persister killed alone."""
    for folder in ("stub_js", "bench"):
        if not (ROOT / folder / "node_modules" / "ws").exists():
            pytest.fail(f"{folder} dependencies missing: run `npm ci` in {folder}")
    if mode == "postgresql" and (why := await postgres_reachable()):
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL not reachable ({why}); CI must run the PostgreSQL faults")
        pytest.skip(f"PostgreSQL not reachable ({why}); the PostgreSQL fault run is skipped")
    workers: list[str] = []
    if mode == "synapse-workers":
        request.getfixturevalue("worker_services")
        workers = ["--homeserver-workers", "2"]
        scenarios: tuple[str, ...] = ("synapse-sigkill", *sorted(WORKER_SCENARIOS))
    elif mode == "sqlite":
        scenarios = tuple(
            s for s in SCENARIOS if s not in WORKER_SCENARIOS and s not in CLUSTER_SCENARIOS
        )
    else:
        scenarios = POSTGRESQL_SCENARIOS
    database = "postgresql" if mode == "postgresql" else "sqlite"
    out = tmp_path / "faults.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.faults",
        "--quick",
        "--scenario",
        ",".join(scenarios),
        *workers,
        "--database",
        database,
        "--recovery-limit",
        str(RECOVERY_LIMIT_S),
        "--out",
        str(out),
        "--work-root",
        str(tmp_path),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output_bytes, _ = await asyncio.wait_for(proc.communicate(), 840)
    output = output_bytes.decode(errors="replace")
    # 0: all clean, 1: the node lost, duplicated or reordered something. Anything else is the
    # harness failing, which must not pass for a verdict on the node.
    assert proc.returncode in (0, 1), output[-6000:]
    report = json.loads(out.read_text())
    results = report["results"]
    assert [r["scenario"] for r in results] == list(scenarios)
    plan = report["plan"]

    problems = []
    for r in results:
        name = f"{r['scenario']} on {r['database']}"
        # The run must be a valid observation before its counts mean anything.
        assert not r.get("error"), f"{name}: {r['error']}\n{r.get('node_log_tail')}"
        assert r["drained"], f"{name}: deliveries still growing at the drain cap"
        c = r["counts"]
        expected = (
            # per message and destination: the reporter's go to every observer
            plan["monkey_count"] * (plan["monkey_senders"] + plan["monkey_observers"])
            if r["scenario"] == "monkey"
            else plan["count"]
        )
        assert c["attempted"] == expected, (name, c)
        assert c["messages_attempted"] == r["messages_planned"], (name, c)
        if r["scenario"] != "none":
            assert r["faults"] and all(f["effective"] for f in r["faults"]), (name, r["faults"])
        # Every attempted message counts: delivered once, or refused as the scenario expects
        # (with the bundled stub, no scenario expects a refusal: faults.EXPECTED_REFUSALS).
        if c["delivered"] + c["refused_excused"] != c["attempted"]:
            problems.append(
                f"{name}: {c['delivered']} delivered and {c['refused_excused']} refused as "
                f"expected of {c['attempted']} attempted (refused by the node: "
                f"{r['refused_by_node']}; answered without an error: {r['answered_not_refused']})"
            )
        for key in FAILURES:
            if c[key]:
                sample = "; ".join(c.get(f"{key}_sample", []))
                problems.append(f"{name}: {key} {c[key]} of {c['attempted']} ({sample})")
        for f in r["faults"]:
            what = f"{name}: {f['kind']} {f['signal'] or ''} at {f['start']}s".rstrip()
            if f["recovery_s"] is None and f["outstanding_at_end"]:
                problems.append(f"{what}: delivery never resumed")
            elif f["recovery_s"] is not None and f["recovery_s"] > RECOVERY_LIMIT_S:
                problems.append(f"{what}: delivery resumed only after {f['recovery_s']}s")
        if not r["ok"] and not problems:
            problems.append(f"{name}: not clean by bench/faults.py's verdict")
    assert not problems, "\n".join(problems)
