"""The fault suite's checker: what runtimes handed their stubs against what runtimes received.

Modelled on Jepsen's total-queue checker (jepsen-io/jepsen ``checker.clj``), adapted to a message
node: the unit is one *expected delivery*, a (message, destination) pair. A direct message has one
destination; an update published to three subscribers is three expected deliveries. Sequence
numbers are per sender and start at 1; order is checked per stream, i.e. per (sender,
destination), which is what the node promises ("in the order its sender sent it").

- attempted: expected deliveries of every message a runtime handed its stub
- acknowledged: those of messages the stub reported acknowledged by the node
- delivered: attempted pairs that arrived at least once
- lost: acknowledged pairs that never arrived
- recovered: pairs that arrived although never acknowledged (Jepsen's "recovered")
- unacknowledged_undelivered: neither acknowledged nor delivered (allowed to be lost)
- unaccounted: neither delivered nor refused with a code its sender saw: every attempted
  message must end one way or the other, acknowledged or not
- refused: answered to its sender with an error code (an integer code of 400 or more; a 200 or
  any other answer is no refusal: that message must still arrive)
- refused_excused: refusals the scenario expects (a kind of fault during which the node's
  documented answer is an error, answered while such a fault was on); every other refusal is
  refused_unexpected, a failure like a loss
- refused_delivered: refused and delivered all the same (its sender was told it failed)
- unexpected: arrivals of pairs never attempted (unknown sender or sequence number, a message at
  a runtime it was not sent to, or one that arrived with a different ``to``)
- duplicated: arrivals beyond the first of the same pair
- reordered: first arrivals of a pair after a later message of the same stream had arrived

The counts mean something only after a full drain (the caller waits until nothing more arrives).
Pure functions, no I/O: tests/integration/test_faults.py checks them on synthetic histories.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Attempt:
    """One message handed to a stub: who sent it, its number, where it should arrive."""

    sender: str
    seq: int
    destinations: tuple[str, ...]
    acknowledged: bool
    refused: bool = False  # the node answered it with an error code its sender saw
    excused: bool = False  # that refusal is one the scenario expects (see faults.py)


@dataclass(frozen=True)
class Arrival:
    """One message handed to a runtime by its stub (every arrival, duplicates included).

    Arrivals of one receiver must be given in the order that receiver saw them."""

    receiver: str
    sender: str
    seq: int
    t: float  # seconds since the epoch, the receiving runtime's clock
    addressed_ok: bool = True  # its ``to`` was the receiver's address (or the subscribed one)
    sent_t: float | None = None  # when the sender handed it to its stub, if known


@dataclass
class Verdict:
    attempted: int = 0
    acknowledged: int = 0
    delivered: int = 0
    lost: int = 0
    recovered: int = 0
    unacknowledged_undelivered: int = 0
    unaccounted: int = 0
    refused: int = 0
    refused_excused: int = 0
    refused_unexpected: int = 0
    refused_delivered: int = 0
    unexpected: int = 0
    duplicated: int = 0
    reordered: int = 0
    messages_attempted: int = 0
    arrivals: int = 0
    # Small samples for the report: "sender->receiver: 17-20, 33".
    lost_sample: list[str] = field(default_factory=list)
    duplicated_sample: list[str] = field(default_factory=list)
    reordered_sample: list[str] = field(default_factory=list)
    unexpected_sample: list[str] = field(default_factory=list)
    unaccounted_sample: list[str] = field(default_factory=list)
    refused_unexpected_sample: list[str] = field(default_factory=list)

    def failures(self) -> dict[str, int]:
        """Every count that must be 0, with its value."""
        return {key: getattr(self, key) for key in FAILURES}

    @property
    def clean(self) -> bool:
        return not any(self.failures().values())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The counts that must all be 0 for a run to be clean: every attempted message delivered once, in
# order, where it was sent, or refused with an error code its sender saw that the scenario expects.
FAILURES = (
    "lost",
    "unexpected",
    "duplicated",
    "reordered",
    "unaccounted",
    "refused_unexpected",
    "refused_delivered",
)
SAMPLE = 8


def check(attempts: Iterable[Attempt], arrivals: Iterable[Arrival]) -> Verdict:
    v = Verdict()
    expected: dict[tuple[str, str, int], bool] = {}  # (sender, receiver, seq) -> acknowledged
    refused: set[tuple[str, str, int]] = set()
    excused: set[tuple[str, str, int]] = set()
    for a in attempts:
        v.messages_attempted += 1
        for dest in a.destinations:
            key = (a.sender, dest, a.seq)
            if key in expected:
                raise ValueError(f"attempt listed twice: {key}")
            expected[key] = a.acknowledged
            if a.refused:
                refused.add(key)
                if a.excused:
                    excused.add(key)
    v.attempted = len(expected)
    v.acknowledged = sum(expected.values())

    seen: Counter[tuple[str, str, int]] = Counter()
    highest: dict[tuple[str, str], int] = {}  # per stream, the highest seq that arrived
    reordered: list[tuple[str, str, int]] = []
    duplicated: list[tuple[str, str, int]] = []
    unexpected: list[tuple[str, str, int]] = []
    for r in arrivals:
        v.arrivals += 1
        key = (r.sender, r.receiver, r.seq)
        if key not in expected or not r.addressed_ok:
            unexpected.append(key)
            continue
        seen[key] += 1
        if seen[key] > 1:
            duplicated.append(key)
            continue
        stream = (r.sender, r.receiver)
        if r.seq < highest.get(stream, 0):
            reordered.append(key)
        highest[stream] = max(highest.get(stream, 0), r.seq)

    lost: list[tuple[str, str, int]] = []
    unaccounted: list[tuple[str, str, int]] = []
    refused_unexpected: list[tuple[str, str, int]] = []
    for key, acked in expected.items():
        arrived = seen[key] > 0
        if arrived:
            v.delivered += 1
            if not acked:
                v.recovered += 1
        elif acked:
            lost.append(key)
        else:
            v.unacknowledged_undelivered += 1
        if not arrived and key not in refused:
            unaccounted.append(key)
        if key in refused:
            v.refused += 1
            v.refused_delivered += arrived
            if key in excused:
                v.refused_excused += 1
            else:
                refused_unexpected.append(key)
    v.lost = len(lost)
    v.unaccounted = len(unaccounted)
    v.unaccounted_sample = summarize(unaccounted)
    v.refused_unexpected = len(refused_unexpected)
    v.refused_unexpected_sample = summarize(refused_unexpected)
    v.duplicated = len(duplicated)
    v.reordered = len(reordered)
    v.unexpected = len(unexpected)
    v.lost_sample = summarize(lost)
    v.duplicated_sample = summarize(duplicated)
    v.reordered_sample = summarize(reordered)
    v.unexpected_sample = summarize(unexpected)
    return v


def summarize(keys: Sequence[tuple[str, str, int]], streams: int = SAMPLE) -> list[str]:
    """Sequence numbers as ranges per stream: ``['A->B: 17-20, 33']``."""
    by_stream: dict[tuple[str, str], list[int]] = {}
    for sender, receiver, seq in keys:
        by_stream.setdefault((sender, receiver), []).append(seq)
    out = []
    for (sender, receiver), seqs in list(by_stream.items())[:streams]:
        out.append(f"{sender}->{receiver}: {ranges(sorted(set(seqs)))}")
    if len(by_stream) > streams:
        out.append(f"... {len(by_stream) - streams} more streams")
    return out


def ranges(seqs: Sequence[int], limit: int = 12) -> str:
    parts: list[str] = []
    i = 0
    while i < len(seqs):
        j = i
        while j + 1 < len(seqs) and seqs[j + 1] == seqs[j] + 1:
            j += 1
        parts.append(str(seqs[i]) if i == j else f"{seqs[i]}-{seqs[j]}")
        i = j + 1
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f", ... ({len(parts) - limit} more ranges)"
    return ", ".join(parts)


# -- timing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A fault: when it ended (the process answering again, the proxy accepting again), from
    when on an arrival proves delivery resumed (default: the end; for a restarted process: once
    the old one is gone, since the restarted one may deliver before the probe sees it answer),
    and when the next fault began (recovery must happen before it to count)."""

    end: float
    search_from: float | None = None
    next_start: float | None = None


def first_arrivals(windows: Sequence[Window], arrival_times: Sequence[float]) -> list[float | None]:
    """Per fault, the first arrival at or after ``search_from`` and before the next fault."""
    times = sorted(arrival_times)
    out: list[float | None] = []
    for w in windows:
        i = bisect.bisect_left(times, w.end if w.search_from is None else w.search_from)
        if i < len(times) and (w.next_start is None or times[i] < w.next_start):
            out.append(times[i])
        else:
            out.append(None)
    return out


def recovery_times(windows: Sequence[Window], arrival_times: Sequence[float]) -> list[float | None]:
    """Per fault, seconds from its end to the first arrival after it (0 when delivery resumed
    before the end was observed); None when nothing arrived before the next fault."""
    return [
        None if first is None else max(0.0, first - w.end)
        for w, first in zip(windows, first_arrivals(windows, arrival_times), strict=True)
    ]


def longest_gap(arrival_times: Sequence[float], since: float | None = None) -> float | None:
    """The longest time without any arrival, from ``since`` (the stream's start) to the last
    arrival. None when nothing arrived."""
    times = sorted(arrival_times)
    if not times:
        return None
    if since is not None and since < times[0]:
        times.insert(0, since)
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def latencies(attempts: Iterable[Attempt], arrivals: Iterable[Arrival]) -> list[float]:
    """Per expected delivery, seconds from its sender handing it over to its first arrival, and
    infinity for one that never arrived (refused ones included): a percentile over arrivals
    alone would look better the more is lost. An arrival that does not say when it was sent
    has no latency and is left out. Arrivals must be in each receiver's order."""
    pending = {(a.sender, dest, a.seq) for a in attempts for dest in a.destinations}
    out: list[float] = []
    for r in arrivals:
        key = (r.sender, r.receiver, r.seq)
        if key in pending and r.addressed_ok:
            pending.discard(key)
            if r.sent_t is not None:
                out.append(r.t - r.sent_t)
    return out + [math.inf] * len(pending)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank percentile (infinity when it falls on something that never arrived);
    None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]
