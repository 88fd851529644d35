"""Every figure the README and docs/benchmark.md cite matches the results file it names
(tests/support/figures.py; the convention is in docs/benchmark.md, "How figures name their
source"). First the checker on files made up here: it must fail on a figure that does not
match."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.figures import EN_DASH, Figure, check, figures

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "results"
DOCS = (ROOT / "README.md", ROOT / "docs" / "benchmark.md")


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    (results / "run.json").write_text(
        json.dumps(
            {
                "results": [
                    {"scenario": "none", "db": "sqlite", "recovery": None, "n": 3000, "s": 0.04},
                    {"scenario": "kill", "db": "sqlite", "recovery": 2.385, "n": 3000, "s": 1.1},
                    {"scenario": "kill", "db": "pg", "recovery": 1.094, "n": 42000, "s": 1.43},
                ],
                "detail": "the longest stretch 44 ms; then 53 ms",
                "messages": 7_200_000,
            }
        )
    )
    (results / "log.txt").write_text("== 812 passed in 1034.5s ==\n== 799 passed in 660.0s ==\n")
    return tmp_path / "doc.md"


def problems(doc: Path, line: str) -> list[str | None]:
    doc.write_text(f'Some text.\n\n{line}\n\n```\n[9](results/run.json "sum results[].n")\n```\n')
    found = figures(doc, doc.parent / "results")
    assert found, "no figure found"
    return [check(f) for f in found]


@pytest.mark.parametrize(
    "line",
    [
        'within [2.4 s](results/run.json "max results[].recovery")',
        '[48,000 messages](results/run.json "sum results[].n")',
        '[3](results/run.json "count results[]")',
        '[1.09](results/run.json "results[scenario=kill,db=pg].recovery")',
        '[1,094 ms](results/run.json "results[scenario=kill,db=pg].recovery * 1000")',
        '[n/a](results/run.json "results[scenario=none].recovery")',
        f'[0.04{EN_DASH}1.43 s](results/run.json "results[].s")',
        '[3,000](results/run.json "same results[db=sqlite].n")',
        '[~7,000,000](results/run.json "messages")',
        '[7.2M messages](results/run.json "messages")',
        f'[44{EN_DASH}53 ms](results/run.json "detail.~/(\\d+) ms/")',
        f'[11{EN_DASH}17 min](results/log.txt "/passed in ([\\d.]+)s/ / 60")',
    ],
)
def test_a_figure_that_matches_its_file_passes(doc: Path, line: str) -> None:
    assert problems(doc, line) == [None]


@pytest.mark.parametrize(
    "line",
    [
        # README's "within 1.3 s in every scenario" against a file that says 2.385 s.
        'within [1.3 s](results/run.json "max results[].recovery")',
        # "180,000 messages" against files that hold fewer.
        '[180,000 messages](results/run.json "sum results[].n")',
        '[2](results/run.json "count results[]")',
        '[3,000](results/run.json "same results[].n")',  # not all the same
        '[0.2 s](results/run.json "results[].s")',  # one number for three values
        '[~6,000,000](results/run.json "messages")',  # beyond 5 %
        '[n/a](results/run.json "results[scenario=kill,db=pg].recovery")',
        '[1.3 s](results/run.json "results[scenario=gone].recovery")',  # names nothing
        '[1.3 s](results/run.json "results[].nothing")',
        "[1.3 s](results/run.json)",  # no query: names the file, not the figure
        '[1.3 s](results/missing.json "x")',
        f'[10{EN_DASH}17 min](results/log.txt "/passed in ([\\d.]+)s/ / 60")',
    ],
)
def test_a_figure_that_does_not_match_its_file_fails(doc: Path, line: str) -> None:
    [problem] = problems(doc, line)
    assert problem is not None


def test_figures_in_code_blocks_and_links_elsewhere_are_not_figures(doc: Path) -> None:
    doc.write_text("[the README](README.md) and\n```\n[1](results/run.json)\n```\n")
    assert figures(doc, doc.parent / "results") == []


# -- the docs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_cited_figure_matches_its_results_file(path: Path) -> None:
    cited = figures(path, RESULTS)
    assert cited, f"{path.name} cites no figure"
    wrong = [problem for figure in cited if (problem := check(figure)) is not None]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_results_files_are_named_as_links_that_are_checked(path: Path) -> None:
    """A results file named in the text but not linked would name a source no check reads:
    every mention is a link (a figure's, or a section's source)."""
    text = path.read_text()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    named = re.findall(r"`(?:docs/)?results/[^`]*\.\w+`", prose) + [
        name for name in re.findall(r"`([\w.-]+)`", prose) if (RESULTS / name).is_file()
    ]
    assert named == [], f"{path.name}: results files named without a link: {named[:10]}"


def test_the_readme_cites_every_figure_with_its_query() -> None:
    """In the README every link to a results file is a checked figure."""
    bare = [f.where for f in figures(ROOT / "README.md", RESULTS) if not f.query]
    assert bare == [], bare


def test_a_figure_is_where_the_reader_sees_it(doc: Path) -> None:
    doc.write_text('x\n[2.4 s](results/run.json "max results[].recovery") y\n')
    [figure] = figures(doc, doc.parent / "results")
    assert figure == Figure(doc, 2, "2.4 s", "results/run.json", "max results[].recovery")
