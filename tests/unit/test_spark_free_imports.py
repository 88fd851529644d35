"""Only `analyze` loads pyspark: the export, the CLI and the dashboard stay free of it.

Each import runs in a fresh interpreter, because in the test session something else has usually
loaded pyspark already and would mask the import under test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def loads_pyspark(module: str) -> bool:
    probe = f"import {module}, sys; print('pyspark' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "True"


@pytest.mark.parametrize(
    "module",
    [
        "adapter.export.runner",
        # What every command loads before it dispatches.
        "adapter.cli",
        "adapter.localstack.synapse",
        "adapter.analytics.dashboard",
        # The node serves the live dashboard; Spark runs in the worker process only.
        "adapter.node",
        "adapter.ops.live_dashboard",
    ],
)
def test_module_does_not_load_pyspark(module: str) -> None:
    assert not loads_pyspark(module)


def test_the_job_does_load_pyspark() -> None:
    # Keeps the probe honest: a probe that never sees pyspark would pass the tests above.
    assert loads_pyspark("adapter.analytics.job")
