"""How `make test` spreads the suite over its two workers (pytest-xdist)."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# Tests that share session state run together on one worker, in the order they were written.
# Each group is named after the session fixture they share:
# - every Spark test shares one local Spark session and one analysed export (made once; no two
#   JVMs compete for the machine's cores);
# - the tests of the `federation` fixture share its two homeservers, whose state (a peer backed
#   off after a restart, a room's history) one test leaves to the next.
TOGETHER = {
    "tests/analytics/": "spark",
    "tests/integration/test_cluster_federation.py": "federation",
    "tests/integration/test_domains.py": "federation",
    "tests/integration/test_federation_stack.py": "federation",
    "tests/integration/test_hostile_peer.py": "federation",
    "tests/integration/test_peer_model.py": "federation",
}


def group_of(nodeid: str) -> str | None:
    for prefix, group in TOGETHER.items():
        if nodeid.startswith(prefix):
            return group
    return None


def misplaced(nodeid: str, fixtures: list[str]) -> str | None:
    """Why the test ``nodeid``, using ``fixtures``, must be added to TOGETHER (None: it need
    not). A test using a group's fixture outside the group would share its state from another
    worker, in another order."""
    for fixture in set(TOGETHER.values()):
        if fixture in fixtures and group_of(nodeid) != fixture:
            return (
                f"{nodeid} uses the session fixture `{fixture}`: add its file to the "
                f"{fixture!r} group of tests/support/xdist_schedule.py"
            )
    return None


class TogetherByPath(LoadScopeScheduling):
    """Each group of TOGETHER is one unit of work; every other test is a unit of its own,
    handed to whichever worker is free. (pytest-xdist's own `loadgroup` reads `xdist_group`
    marks through a node attribute pytest 9 no longer has, so it groups nothing.)"""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid) or nodeid
