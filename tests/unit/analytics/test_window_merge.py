"""The live window's sums (adapter/analytics/window.py): percentiles from per-millisecond counts
and the category bound, against their batch definitions."""

from __future__ import annotations

from collections import Counter

import numpy as np

from adapter.analytics.aggregates import PERCENTILES
from adapter.analytics.names import CATEGORY_LIMIT, OTHER
from adapter.analytics.window import fold, latency_stats
from tests.support.synthetic.known_answers import nearest_rank


def test_percentiles_from_counts_are_the_nearest_rank_of_the_values() -> None:
    rng = np.random.default_rng(3)
    for n in range(1, 400, 7):
        values = rng.integers(0, 30 if n % 2 else 3_000, size=n)
        stats = latency_stats(Counter(int(v) for v in values))
        ordered = np.sort(values)
        assert stats["pairs"] == n
        assert stats["max_ms"] == ordered[-1]
        for name, p in PERCENTILES:
            assert stats[name] == nearest_rank(ordered, p), (n, name)


def test_no_pairs_have_no_percentiles() -> None:
    assert latency_stats({}) == {
        "pairs": 0,
        "p50_ms": None,
        "p90_ms": None,
        "p99_ms": None,
        "max_ms": None,
    }


def test_fold_keeps_the_heaviest_values_ties_by_value_and_nulls() -> None:
    rows = [{"type": f"t{i:04d}", "rows": 1 + (i < 10) * 100} for i in range(CATEGORY_LIMIT + 50)]
    rows.append({"type": None, "rows": 7})
    folded = fold(rows, "type", "rows")
    kept = {r["type"] for r in folded}
    assert len(kept - {OTHER, None}) == CATEGORY_LIMIT
    assert {f"t{i:04d}" for i in range(10)} <= kept  # the heavy ones
    assert "t0099" in kept and "t0100" not in kept  # equal weights: the smaller values win
    assert sum(r["rows"] for r in folded) == sum(r["rows"] for r in rows)
    assert None in kept
