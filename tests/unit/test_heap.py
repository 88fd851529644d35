"""Freezing the start-up heap: in a process of its own (a test process must not freeze)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc
import adapter.node  # what a node process has loaded
from adapter.heap import freeze_start_up_objects

class Cycle:
    pass

def cycle():
    a, b = Cycle(), Cycle()
    a.other, b.other = b, a

cycle()  # start-up garbage: collected before the freeze, not frozen with it
frozen = freeze_start_up_objects()
assert frozen > 50_000, frozen
assert not any(type(o) is Cycle for o in gc.get_objects()), "start-up garbage was frozen"
cycle()  # what the node makes later is still collected
assert gc.collect() >= 2
print(frozen)
"""


def test_start_up_objects_are_frozen_and_later_garbage_still_collected() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 50_000
