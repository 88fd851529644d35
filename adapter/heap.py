"""The node process's heap and the garbage collector.

A full collection walks every tracked object, and the event loop waits meanwhile: measured under
churn (1,000 runtimes coming and going, bench/churn.py), one every ~12 s, 100 to 250 ms each, which
every connect and message in flight then waits out. About a hundred thousand of those objects
are the modules, configuration and state loaded at start, which live as long as the process:
frozen once the node is up, no collection looks at them again.
"""

from __future__ import annotations

import gc


def freeze_start_up_objects() -> int:
    """Collect what start-up left over, then move every object alive now out of the
    collector's sight for good. For the process that runs nodes (not a test process that
    starts and drops many: what it froze would never be freed). Returns how many objects
    were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
