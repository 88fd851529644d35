"""Records how long the test suite took: scripts/test.sh calls this after the suite has run.

    .venv/bin/python -m bench.suite_time --suite-seconds S --total-seconds T --status N \
        --load-at-start "L1 L5 L15" [--out FILE] -- <the suite's command>

Prints the time and writes it, with the commit, the command and the machine's load
(bench/provenance.py), to bench/results/suite-<time>.json (or --out). The README's figure for
the suite's time comes from such a file.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from bench.provenance import Source, write_results

ROOT = Path(__file__).resolve().parents[1]


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite-seconds", type=float, required=True, help="the Python suite")
    parser.add_argument("--total-seconds", type=float, required=True, help="the whole command")
    parser.add_argument("--status", type=int, required=True, help="the suite's exit status")
    parser.add_argument(
        "--load-at-start", required=True, help="the load average as the suite began (1 5 15)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the suite's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # The suite's own command and the load as it began (this script only writes them down);
    # the load at the end is taken now, as the suite has just ended.
    source = Source.begin()
    source.command = shlex.join(command)
    source.loadavg_at_start = [float(x) for x in args.load_at_start.split()]
    began = time.time() - args.suite_seconds
    source.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began))
    out = args.out or ROOT / "bench" / "results" / f"suite-{time.strftime('%Y%m%dT%H%M%S')}.json"
    write_results(
        out,
        {
            "python_suite_s": round(args.suite_seconds, 1),
            "whole_command_s": round(args.total_seconds, 1),
            "exit_status": args.status,
        },
        source,
    )
    print(
        f"== the Python suite took {minutes(args.suite_seconds)} (the whole command "
        f"{minutes(args.total_seconds)}, installs included; exit status {args.status}); "
        f"recorded in {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
