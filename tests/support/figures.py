"""Figures in the docs that name their results file, and whether the file says the same.

A cited figure is a Markdown link: its text is the figure as a reader sees it, its target the
results file, its title where in the file the figure is (docs/benchmark.md, "How figures name
their source"). Inline, or as a reference whose definition follows the paragraph:

    within [1.1 s](docs/results/faults-20261126.json "max results[].recovery_max_s") of ...
    within [1.1 s][recovery] of ...

    [recovery]: docs/results/faults-20261126.json "max results[].recovery_max_s"

The title is a query: an optional aggregate (``max``, ``min``, ``sum``, ``median``,
``count``, ``same``: all equal), a path into the JSON file, and an optional scale (``* 1000``,
``/ 60``). A path is dot-separated steps: ``key``, ``key[]`` (every item of a list),
``key[k=v,k2=v2]`` (the items whose fields have those values; ``v1|v2``: either),
``key[2]`` (one item), ``key[1:]`` (a slice), ``*`` (every value of an object), ``(a,b)``
(several keys, in that order), ``key?`` (nothing where it is missing). A step ``~/regex/``
takes the number its group matches in a text value. For a text file the whole query is
``/regex/``: the number each match's group holds.

The link text's number must be the value rounded as shown (``2.4`` matches 2.385;
``42,000`` matches 42,000 exactly; ``~60,000`` anything within 5 %; ``7.2M`` 7.2 million, to
0.05M); several numbers the values in order (``1 / 0 / 0``; after ``same``, each the one
value); a range (two numbers joined by an en dash, or by "to") the smallest and largest of the
values; ``n/a`` or ``never`` a missing value.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

# [text](target "title"), and [text][label] with its definition [label]: target "title".
LINK = re.compile(r'\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)(?:\s+"(?P<title>[^"]*)")?\)')
REFERENCE = re.compile(r"\[(?P<text>[^\]]+)\]\[(?P<label>[^\]]+)\]")
DEFINITION = re.compile(
    r'^\s*\[(?P<label>[^\]]+)\]:\s*(?P<target>\S+)(?:\s+"(?P<title>[^"]*)")?\s*$'
)
# A number as shown, not one that is part of a word (p50, v2, a 1e-3 exponent).
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?P<suffix>[kM](?![a-zA-Z]))?")
EN_DASH = "\u2013"
RANGE_DASH = re.compile(rf"\d\s*(?:{EN_DASH}|to)\s*\d")
AGGREGATES = ("max", "min", "sum", "median", "count", "same")
NOTHING = ("n/a", "never", "none", "—")


class FigureError(Exception):
    """The query cannot be read, or the file does not hold what it names."""


@dataclass(frozen=True)
class Figure:
    doc: Path
    line: int
    text: str
    target: str
    query: str | None

    @property
    def where(self) -> str:
        return f"{self.doc.name}:{self.line}: [{self.text}]({self.target})"


def figures(doc: Path, results: Path) -> list[Figure]:
    """Every link of ``doc`` to a file under ``results``, outside code blocks."""
    lines = _prose(doc)
    definitions: dict[str, tuple[str, str | None]] = {}
    for number, line in lines:
        if (m := DEFINITION.match(line)) is not None:
            if m["label"].lower() in definitions:
                raise FigureError(f"{doc.name}:{number}: [{m['label']}] is defined twice")
            definitions[m["label"].lower()] = (m["target"], m["title"])
    found: list[Figure] = []
    for number, line in lines:
        if DEFINITION.match(line):
            continue  # where a reference points, not where a reader sees a figure
        links = [(m["text"], m["target"], m["title"]) for m in LINK.finditer(line)]
        for m in REFERENCE.finditer(line):
            if m["label"].lower() not in definitions:
                raise FigureError(f"{doc.name}:{number}: [{m['label']}] is not defined")
            links.append((m["text"], *definitions[m["label"].lower()]))
        for text, target, title in links:
            if (doc.parent / target).resolve().is_relative_to(results.resolve()):
                found.append(Figure(doc, number, text, target, title))
    return found


def _prose(doc: Path) -> list[tuple[int, str]]:
    """The document's lines outside code blocks, numbered."""
    out, fenced = [], False
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def check(figure: Figure) -> str | None:
    """None when the figure matches its file; else what is wrong."""
    path = (figure.doc.parent / figure.target).resolve()
    if not path.is_file():
        return f"{figure.where}: no such file"
    if not figure.query:
        if figure.text.strip("`") == path.name:
            return None  # the file named as a section's source, not a figure
        return f"{figure.where}: no query (the link's title) says where the figure is"
    try:
        values = evaluate(path, figure.query)
        return compare(figure.text, values, figure.query)
    except (FigureError, IndexError, ValueError) as exc:
        return f"{figure.where}: {exc!r} ({figure.query!r})"


def evaluate(path: Path, query: str) -> list[Any]:
    """The values ``query`` names in the file (aggregated into one when it says so)."""
    aggregate, rest = None, query.strip()
    head, _, tail = rest.partition(" ")
    if head in AGGREGATES and tail:
        aggregate, rest = head, tail.strip()
    scale = 1.0
    scaled = re.fullmatch(r"(?P<path>.+?)\s+(?P<op>[*/])\s+(?P<by>[\d.]+)", rest)
    if scaled and not rest.endswith("/"):
        rest = scaled["path"]
        by = float(scaled["by"])
        scale = by if scaled["op"] == "*" else 1 / by
    if rest.startswith("/") and rest.endswith("/") and len(rest) > 1:
        text = path.read_text()
        values: list[Any] = [_number(m) for m in re.finditer(rest[1:-1], text, re.M)]
    else:
        values = walk([json.loads(path.read_text())], steps(rest))
    if not values and aggregate != "count":
        raise FigureError(f"{query!r} names nothing in {path.name}")
    values = [
        v * scale if isinstance(v, int | float) and not isinstance(v, bool) else v for v in values
    ]
    if aggregate is None:
        return values
    if aggregate == "count":
        return [len(values)]
    present = [v for v in values if v is not None]
    if aggregate == "same":
        if len({json.dumps(v) for v in values}) != 1:
            raise FigureError(f"{query!r}: the values differ: {values[:8]}")
        return [values[0]]
    if not all(isinstance(v, int | float) for v in present) or not present:
        raise FigureError(f"{query!r}: {aggregate} of values that are not numbers: {values[:8]}")
    if aggregate == "median":
        return [statistics.median(present)]
    return [{"max": max, "min": min, "sum": sum}[aggregate](present)]


def steps(path: str) -> list[str]:
    """The path's steps, split at dots outside brackets, parentheses and regexes."""
    out, depth, current, in_regex = [], 0, "", False
    for char in path:
        if char == "/" and current.endswith("~"):
            in_regex = True
        elif char == "/" and in_regex:
            in_regex = False
        elif not in_regex and char in "[(":
            depth += 1
        elif not in_regex and char in "])":
            depth -= 1
        if char == "." and depth == 0 and not in_regex:
            out.append(current)
            current = ""
        else:
            current += char
    out.append(current)
    return [s for s in out if s]


STEP = re.compile(r"(?P<name>[^\[\]]*)(?:\[(?P<select>[^\]]*)\])?$")


def walk(values: list[Any], path: list[str]) -> list[Any]:
    for step in path:
        values = [found for value in values for found in _step(value, step)]
    return values


def _step(value: Any, step: str) -> list[Any]:
    if step.startswith("~/") and step.endswith("/"):
        if not isinstance(value, str):
            raise FigureError(f"{step} applied to {value!r}, not text")
        return [_number(m) for m in re.finditer(step[2:-1], value)]
    if step.startswith("(") and step.endswith(")"):
        if not isinstance(value, dict):
            raise FigureError(f"{step} applied to {type(value).__name__}, not an object")
        return [value.get(key.strip()) for key in step[1:-1].split(",")]
    if step == "*":
        if not isinstance(value, dict):
            raise FigureError(f"* applied to {type(value).__name__}, not an object")
        return list(value.values())
    match = STEP.match(step)
    if match is None:
        raise FigureError(f"cannot read the step {step!r}")
    name, select = match["name"], match["select"]
    if name.endswith("?"):  # optional: where it is missing, nothing
        name = name[:-1]
        if not isinstance(value, dict) or name not in value:
            return []
    if name:
        if not isinstance(value, dict) or name not in value:
            raise FigureError(f"no {name!r} in {_short(value)}")
        value = value[name]
    if select is None:
        return [value]
    if not isinstance(value, list):
        raise FigureError(f"[{select}] applied to {type(value).__name__}, not a list")
    if select == "":
        return list(value)
    if re.fullmatch(r"-?\d+", select):
        return [value[int(select)]]
    if re.fullmatch(r"-?\d*:-?\d*", select):
        start, stop = (int(x) if x else None for x in select.split(":"))
        return list(value[start:stop])
    # k=v pairs, split at a comma that starts the next key (a value may hold a comma).
    pairs = [pair.partition("=") for pair in re.split(r",(?=[\w.-]+=)", select)]
    if any(not sep for _, sep, _ in pairs):
        raise FigureError(f"cannot read the selection [{select}]")
    wanted = {k: v.split("|") for k, _, v in pairs}
    return [
        item
        for item in value
        if isinstance(item, dict) and all(_text(item.get(k)) in v for k, v in wanted.items())
    ]


def compare(text: str, values: list[Any], query: str) -> str | None:
    shown = text.strip()
    approximate = shown.startswith("~")
    numbers = list(NUMBER.finditer(shown))
    if not numbers:
        parts = [part.lower() for part in re.split(r"\s+/\s+", shown)]
        nothing = all(v is None or v == "never" for v in values)
        if nothing and all(part in NOTHING for part in parts) and len(parts) in (1, len(values)):
            return None
        return f"[{text}] shows no number; {query!r} gives {values[:8]}"
    ranged = len(numbers) == 2 and RANGE_DASH.search(shown) is not None
    if ranged:  # the range of the values there are
        values = [v for v in values if v is not None]
    if not values or any(not isinstance(v, int | float) or isinstance(v, bool) for v in values):
        return f"[{text}]: {query!r} gives values that are not numbers: {values[:8]}"
    if ranged:
        low, high = (_shown(m) for m in numbers)
        pairs = [(low, min(values)), (high, max(values))]
    elif len(numbers) == len(values):
        pairs = [(_shown(m), v) for m, v in zip(numbers, values, strict=True)]
    elif len(values) == 1 and query.startswith("same "):
        pairs = [(_shown(m), values[0]) for m in numbers]
    else:
        return f"[{text}]: {len(numbers)} number(s) shown for {len(values)} value(s) of {query!r}"
    for (figure, places, unit), value in pairs:
        tolerance = 0.05 * abs(figure) if approximate else 0.5 * 10**-places * unit
        if not math.isclose(figure, value, abs_tol=tolerance + 1e-9):
            return f"[{text}] does not match {query!r}: the file gives {value}"
    return None


def _shown(match: re.Match[str]) -> tuple[float, int, float]:
    """(the number, its decimal places, the unit its suffix scales by)."""
    digits = match.group(0).removesuffix(match["suffix"] or "").replace(",", "")
    unit = {"k": 1e3, "M": 1e6}.get(match["suffix"] or "", 1.0)
    places = -int(Decimal(digits).as_tuple().exponent)
    return float(digits) * unit, places, unit


def _number(match: re.Match[str]) -> float:
    text = match.group(1) if match.groups() else match.group(0)
    return float(text.replace(",", ""))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) < 80 else text[:77] + "..."


def main(argv: list[str]) -> int:
    """``FILE QUERY``: the values the query names (to write a figure's link); ``DOC``: every
    figure of a document that does not match its file."""
    if len(argv) == 2:
        print(evaluate(Path(argv[0]), argv[1]))
        return 0
    if len(argv) == 1:
        doc = Path(argv[0])
        results = Path(__file__).resolve().parents[2] / "docs" / "results"
        problems = [p for f in figures(doc, results) if (p := check(f)) is not None]
        print("\n".join(problems) or "every cited figure matches its file")
        return 1 if problems else 0
    print("usage: python -m tests.support.figures (RESULTS_FILE QUERY | DOC.md)")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
