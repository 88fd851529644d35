"""The suite's split over two workers: what runs together, and the guard that keeps it so."""

from __future__ import annotations

from tests.support.xdist_schedule import group_of, misplaced


def test_the_tests_sharing_session_state_are_one_unit_and_the_rest_their_own() -> None:
    assert group_of("tests/analytics/test_bad_input.py::test_x") == "spark"
    assert group_of("tests/integration/test_domains.py::test_y[sqlite]") == "federation"
    assert group_of("tests/integration/test_routing.py::test_z") is None


def test_a_test_using_a_shared_fixture_outside_its_group_is_named() -> None:
    why = misplaced("tests/integration/test_new.py::test_a", ["databases", "federation"])
    assert why is not None and "test_new.py" in why and "'federation' group" in why
    assert misplaced("tests/integration/test_new.py::test_b", ["spark"]) is not None
    assert misplaced("tests/integration/test_hostile_peer.py::test_c", ["federation"]) is None
    assert misplaced("tests/analytics/test_synthetic.py::test_d", ["spark", "analysed"]) is None
    assert misplaced("tests/integration/test_new.py::test_e", ["homeserver"]) is None
