#!/usr/bin/env bash
# First command of the README: install everything and run the whole stack locally
# (a loopback-only Synapse from PyPI, SQLite, the node). Ctrl-C stops it all.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/rethink-mn up "$@"
