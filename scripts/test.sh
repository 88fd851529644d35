#!/usr/bin/env bash
# Second command of the README: install what the tests need and run all of them.
# Needs: python3 (3.11+), Node.js 20 with npm, Java 17 (PySpark); installs Debian's chromium,
# nginx, caddy and systemd for the tests when missing (as root, or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
command_started=$(date +%s)

# --fast: only what needs no homeserver (lint, types, layering, the stub's tests, unit tests).
fast=""
if [[ "${1:-}" == "--fast" ]]; then
  fast=1
  shift
fi

scripts/bootstrap.sh --test

# Debian's packages the tests run: chromium for the browser tests, nginx and caddy for the
# reverse-proxy tests (contrib/), systemd for `systemd-analyze verify` of contrib/systemd/.
missing=()
if [[ -z "$fast" ]]; then
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
  command -v caddy >/dev/null 2>&1 || missing+=(caddy)
fi
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
if ((${#missing[@]})); then
  echo "== installing Debian's ${missing[*]} for the tests"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  # policy-rc.d-less machines start nginx's and caddy's own services on install: the tests
  # run their own instances on other ports, so those may run or not.
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "== npm ci (stub_js, bench driver)"
(cd stub_js && npm ci --no-audit --no-fund --loglevel=error)
(cd bench && npm ci --no-audit --no-fund --loglevel=error)

echo "== lint, types and package layers"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache

echo "== stub_js tests (node --test)"
(cd stub_js && npm test)

if [[ -n "$fast" ]]; then
  echo "== Python unit tests"
  exec .venv/bin/python -m pytest tests/unit "$@"
fi

echo "== Python tests (real Synapse, databases, Spark, Node.js, Chromium)"
# Two workers: most of the suite's time is spent waiting on homeservers, nodes and faults, so two
# at once on a 2-core machine take ~60 % of one's time. Tests that share session state run on
# one worker (tests/support/xdist_schedule.py). RETHINK_MN_TEST_WORKERS=0: all in one process.
suite=(.venv/bin/python -m pytest -rs -n "${RETHINK_MN_TEST_WORKERS:-2}" --dist loadgroup "$@")
load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)
suite_started=$(date +%s)
status=0
"${suite[@]}" || status=$?
# The suite's own time, printed and written with the commit, the command and the machine's load
# (bench/results/suite-*.json): the README's figure for it comes from such a file.
now=$(date +%s)
.venv/bin/python -m bench.suite_time --suite-seconds $((now - suite_started)) \
  --total-seconds $((now - command_started)) --status "$status" \
  --load-at-start "$load_at_start" -- "${suite[@]}"
exit "$status"
