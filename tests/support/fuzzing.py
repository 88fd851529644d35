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
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)
from hypothesis.stateful import run_state_machine_as_test

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


def model_settings(round_examples: int, steps: int, shrink: bool) -> settings:
    """The settings of a model run against a real node (tests/integration/test_*_model.py):
    fresh examples after the kept ones, and shrinking only when asked (minutes on a real node)."""
    return settings(
        max_examples=round_examples,
        stateful_step_count=steps,
        deadline=None,
        database=corpus_database(),
        derandomize=False,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
        + ([Phase.shrink] if shrink else []),
        report_multiple_bugs=shrink,
    )


AST_RACE = "AST constructor recursion depth mismatch"


def run_for_budget(machine: Any, name: str, seed: int, deadline: float, run: settings) -> int:
    """Rounds of a model's examples, each from its own seed (``seed``, ``seed + 1``, ...), until
    the budget is spent: Hypothesis has no time limit of its own, and a test case it cut short
    would look flaky to it. Each round replays the kept failures first. ``machine`` counts its
    ``examples`` and ``steps``; ``name`` says which model is speaking."""
    rounds = 0
    started = time.monotonic()
    ast_races = 0
    while time.monotonic() < deadline:
        machine._hypothesis_internal_use_seed = seed + rounds
        print(f"{name}: round {rounds}, seed {seed + rounds}", flush=True)
        try:
            run_state_machine_as_test(machine, settings=run)
        except SystemError as exc:
            # CPython 3.11's ast module is not safe to use from two threads at once
            # (python/cpython#106905): Hypothesis parses the machine's source in this thread to
            # key its examples while the node, on the event loop's thread, may be formatting a
            # traceback for its log, which parses too. Not the model's verdict: the round is
            # run again, from the same seed (a few times at most; a real failure is no
            # SystemError).
            if AST_RACE not in str(exc) or ast_races >= 3:
                raise
            ast_races += 1
            print(f"{name}: round {rounds} hit CPython's ast race; running it again", flush=True)
            continue
        except BaseException:
            print(
                f"{name}: a promise broken, reported after "
                f"{time.monotonic() - started:.0f} s "
                f"({machine.examples} examples, {machine.steps} steps)",
                flush=True,
            )
            raise
        rounds += 1
    return rounds
