"""Who held the event loop: a watchdog thread that names the code behind a stall.

The lag histogram (adapter/observability.py) says that the loop woke a timer late, not what
held it. Everything the node does for every runtime waits on its one loop, so a stall of a
few hundred milliseconds is felt by every delivery in flight; finding its cause after the fact
takes a profiler attached at the right moment. The watchdog is that moment, always on: the
loop beats (from the lag probe, ten times a second), a thread looks every `CHECK_SECONDS`, and
when the beat is older than the threshold it takes the loop thread's stack *while it is still
stuck* and logs it once per stall.

The thread costs a wake-up every 50 ms. Taking a stack needs the interpreter lock, which a
thread running Python code hands over every few milliseconds, so the stack is the stall's own
unless the lock was held by one long C call: a garbage collection (in any thread), or another
thread's. Then the watch runs only once that call is over, and the stack is where the loop
went on from; a collection that ended within the stall is named in the report with its length.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Final

import structlog

log = structlog.get_logger("rethink_mn.stalls")

CHECK_SECONDS: Final = 0.05
STACK_FRAMES: Final = 12


class StallWatch:
    def __init__(
        self,
        threshold_seconds: float,
        beat_every: float,
        on_stall: Callable[[str], None] = lambda _stack: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = threshold_seconds
        self._beat_every = beat_every
        self._on_stall = on_stall
        self._clock = clock
        self._last_beat = clock()
        self._reported_beat: float | None = None
        # The latest collection: generation, when it ended, how long it took.
        self._last_collection: tuple[int, float, float] | None = None
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Called on the loop's thread whenever the loop runs its timers."""
        self._last_beat = self._clock()

    def collected(self, generation: int, seconds: float) -> None:
        """Called as a garbage collection ends (adapter/observability.py times them)."""
        self._last_collection = (generation, self._clock(), seconds)

    def start(self) -> None:
        """From the loop's thread: watch it until `stop`."""
        self._loop_thread = threading.get_ident()
        self._last_beat = self._clock()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def check(self) -> str | None:
        """One look; returns the stack it logged, if the loop is stuck in a new stall."""
        beat = self._last_beat
        # How late the next beat is: the loop was held at least that long.
        held = self._clock() - beat - self._beat_every
        # One report per stall: the next comes once the loop has beaten again and stalled anew.
        if held < self._threshold or beat == self._reported_beat:
            return None
        self._reported_beat = beat
        frame = sys._current_frames().get(self._loop_thread)
        stack = "".join(traceback.format_stack(frame, STACK_FRAMES)) if frame else ""
        collection: dict[str, int] = {}
        if self._last_collection is not None and self._last_collection[1] > beat:
            generation, _ended, took = self._last_collection
            collection = {"gc_generation": generation, "gc_ms": round(took * 1000)}
        log.warning("event loop held", held_ms=round(held * 1000), stack=stack, **collection)
        self._on_stall(stack)
        return stack

    def _watch(self) -> None:
        while not self._stop.wait(CHECK_SECONDS):
            self.check()
