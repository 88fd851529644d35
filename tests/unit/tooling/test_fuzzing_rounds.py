"""The model runner's rounds (tests/support/fuzzing.py): CPython's ast race is run again, and
nothing else is excused."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support import fuzzing
from tests.support.fuzzing import AST_RACE, model_settings, run_for_budget


class Machine:
    examples = steps = 0


def runs(monkeypatch: pytest.MonkeyPatch, outcomes: list[BaseException | None]) -> list[int]:
    """Each round's run raises the next of ``outcomes`` (None: it passes); the seeds run."""
    seeds: list[int] = []

    def run(machine: Any, settings: Any) -> None:
        seeds.append(machine._hypothesis_internal_use_seed)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        if not outcomes:
            raise KeyboardInterrupt  # the end of the test's budget

    monkeypatch.setattr(fuzzing, "run_state_machine_as_test", run)
    return seeds


def test_the_ast_race_runs_the_same_round_again(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds = runs(monkeypatch, [SystemError(f"{AST_RACE} (before=42, after=198)"), None, None])
    with pytest.raises(KeyboardInterrupt):
        run_for_budget(Machine, "m", 7, time.monotonic() + 60, model_settings(1, 1, False))
    assert seeds == [7, 7, 8]


@pytest.mark.parametrize(
    "failure",
    [SystemError("something else"), AssertionError("a promise broken")],
)
def test_anything_else_ends_the_run(monkeypatch: pytest.MonkeyPatch, failure: Exception) -> None:
    runs(monkeypatch, [failure, None])
    with pytest.raises(type(failure)):
        run_for_budget(Machine, "m", 7, time.monotonic() + 60, model_settings(1, 1, False))


def test_the_race_is_run_again_only_a_few_times(monkeypatch: pytest.MonkeyPatch) -> None:
    runs(monkeypatch, [SystemError(AST_RACE)] * 5)
    with pytest.raises(SystemError):
        run_for_budget(Machine, "m", 7, time.monotonic() + 60, model_settings(1, 1, False))
