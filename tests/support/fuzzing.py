"""How the fuzzers draw their examples: fresh ones every run, the kept corpus first.

Every run, CI included, draws from a new seed: the session header prints it
(tests/conftest.py), and ``RETHINK_FUZZ_SEED=<seed>`` draws the same examples again. Before
drawing, Hypothesis replays the examples kept in ``tests/fuzz-corpus/`` (a Hypothesis example
database in the repository: a failing example found once stays a regression test for good).
The corpus is read-only to an ordinary run; ``RETHINK_FUZZ_KEEP=1`` adds the failing examples a
run finds to it (commit them with the fix), and never deletes one. Failures are also saved in
the local ``.hypothesis/`` database, as Hypothesis does by default.

A kept example is keyed by its test's name and signature: renaming a fuzz test, or changing its
arguments, orphans its examples (move them to the new key's folder).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz-corpus"
SEED_VARIABLE = "RETHINK_FUZZ_SEED"


def fuzz_seed() -> int:
    """This run's seed: ``RETHINK_FUZZ_SEED``, else drawn once per session (the conftest sets
    the variable before any test module is imported, so every xdist worker gets the same)."""
    value = os.environ.get(SEED_VARIABLE)
    if not value:
        value = os.environ[SEED_VARIABLE] = str(secrets.randbelow(2**32))
    return int(value)


class KeepingDatabase(ExampleDatabase):
    """The corpus when examples are being kept: saves, never deletes (an example that no
    longer fails is a regression test that passes, not one to forget)."""

    def __init__(self, inner: ExampleDatabase) -> None:
        super().__init__()
        self._inner = inner

    def save(self, key: bytes, value: bytes) -> None:
        self._inner.save(key, value)

    def fetch(self, key: bytes):  # type: ignore[no-untyped-def]
        return self._inner.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        return None

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self._inner.save(dest, value)


def corpus_database() -> ExampleDatabase:
    corpus: ExampleDatabase = DirectoryBasedExampleDatabase(CORPUS)
    kept = (
        KeepingDatabase(corpus) if os.environ.get("RETHINK_FUZZ_KEEP") else ReadOnlyDatabase(corpus)
    )
    return MultiplexedDatabase(kept, DirectoryBasedExampleDatabase(ROOT / ".hypothesis"))


def fuzz_settings(examples: int) -> settings:
    """A fuzz test's settings: ``examples`` new examples after the kept ones; no deadline (one
    node serves every example of a test: state accumulates, and so does the time)."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=corpus_database(),
        derandomize=False,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )
