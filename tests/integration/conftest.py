"""Fixtures of the integration tests beside the shared ones in tests/conftest.py."""

from __future__ import annotations

from .registry_support import registry  # noqa: F401 - a built-in domain registry per test
