#!/usr/bin/env bash
# Creates .venv and installs the node (and, with --test, what the tests need) at pinned versions.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
extras=""
[[ "${1:-}" == "--test" ]] && extras="[test]"

if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade "pip==25.3"
# constraints.txt pins the whole dependency tree; pyproject.toml pins the direct dependencies.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".${extras}"
