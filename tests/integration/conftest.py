"""Fixtures of the integration tests beside the shared ones in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..support.runtime import PyRuntime
from .registry_support import registry  # noqa: F401 - a built-in domain registry per test


@pytest.fixture(autouse=True)
def nothing_delivered_twice() -> Iterator[None]:
    """Every test: no runtime was handed the same message twice (PyRuntime counts them), unless
    the test says the node may do that there (``twice_allowed``) and checks it itself."""
    before = {id(rt): rt.delivered_twice for rt in list(PyRuntime.alive)}
    yield
    twice = {
        rt.runtime_url: (rt.delivered_twice, rt.twice_sample)
        for rt in list(PyRuntime.alive)
        if rt.delivered_twice > before.get(id(rt), 0) and not rt.twice_allowed
    }
    assert not twice, f"messages handed to a runtime twice (count, sample): {twice}"
