"""The ops kit (contrib/): Prometheus alert rules and the Grafana dashboard use only metrics the
node exports, with labels those metrics have, in expressions a PromQL parser accepts (promtool
is not installable here from the registries this project uses; promql-parser is the Rust
`promql-parser` crate's grammar)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client import CollectorRegistry
from ruamel.yaml import YAML

from adapter.observability import NodeMetrics
from appservice.metrics import AppserviceMetrics

CONTRIB = Path(__file__).resolve().parents[2] / "contrib"
RULES = CONTRIB / "prometheus" / "rethink-mn-rules.yml"
DASHBOARD = CONTRIB / "grafana" / "rethink-mn.json"
# Labels every scraped series has; `up` is Prometheus's own series for a scrape target.
TARGET_LABELS = {"instance", "job"}
PROMETHEUS_OWN = {"up": set[str]()}
DURATION = re.compile(r"^\d+[smhdw]$")
# Grafana's variables, as a query sees them once Grafana has filled them in.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


def exported() -> dict[str, set[str]]:
    """Every series name the node exports, with its labels."""
    registry = CollectorRegistry()
    NodeMetrics(registry)
    AppserviceMetrics(registry)
    names: dict[str, set[str]] = dict(PROMETHEUS_OWN)
    for collector in list(registry._collector_to_names):
        labels = set(getattr(collector, "_labelnames", ()))
        for family in collector.describe():
            kind = family.type
            suffixes = {
                "counter": ("_total", "_created"),
                "histogram": ("_bucket", "_count", "_sum", "_created"),
                "gauge": ("",),
            }[kind]
            for suffix in suffixes:
                names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def selectors(expr: Any) -> list[Any]:
    """The vector selectors of a parsed expression."""
    if isinstance(expr, promql_parser.VectorSelector):
        return [expr]
    found = []
    for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(expr, attr, None)
        if child is not None and not isinstance(child, (str, int, float)):
            found += selectors(child)
    for arg in getattr(expr, "args", None) or []:
        found += selectors(arg)
    return found


def check_expression(expr: str, names: dict[str, set[str]]) -> list[str]:
    problems = []
    parsed = promql_parser.parse(expr)
    used = selectors(parsed)
    if not used:
        problems.append(f"no metric in {expr!r}")
    for selector in used:
        if selector.name not in names:
            problems.append(f"{selector.name} is not exported by the node")
            continue
        for matcher in selector.matchers.matchers:
            if matcher.name not in names[selector.name] | TARGET_LABELS:
                problems.append(f"{selector.name} has no label {matcher.name!r}")
    return problems


def dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            found.append((panel["title"], expr))
    return found


def test_the_checker_catches_an_unknown_metric_a_wrong_label_and_bad_syntax() -> None:
    names = exported()
    assert check_expression("rate(rethink_mn_messages_received_total[5m]) > 0", names) == []
    assert check_expression("rate(rethink_mn_no_such_thing_total[5m])", names)
    assert check_expression('rethink_mn_messages_received_total{outcom="x"}', names)
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (le (rate(x[5m]))")


def test_every_alert_rule_is_complete_and_uses_what_the_node_exports() -> None:
    names = exported()
    groups = YAML(typ="safe").load(RULES.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) >= 10
    alerts = [rule["alert"] for rule in rules]
    assert len(set(alerts)) == len(alerts), "alert names repeat"
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert DURATION.match(rule.get("for", "0s")), rule["alert"]
        assert check_expression(rule["expr"], names) == [], rule["alert"]
    # What an operator must hear of (issue 19): the node down, the homeserver unreachable,
    # delivery latency, refused messages, a backlog.
    for needed in (
        "RethinkMnDown",
        "RethinkMnHomeserverUnreachable",
        "RethinkMnDeliveryLatencyHigh",
        "RethinkMnServerErrors",
        "RethinkMnManyRefusals",
        "RethinkMnBacklogForAwayRuntimes",
    ):
        assert needed in alerts


def test_every_dashboard_panel_queries_what_the_node_exports() -> None:
    names = exported()
    expressions = dashboard_expressions()
    assert len(expressions) >= 12
    for title, expr in expressions:
        assert check_expression(expr, names) == [], title
