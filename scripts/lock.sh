#!/usr/bin/env bash
# Re-pins the whole dependency tree: installs the project with its test extras into a scratch
# virtualenv (from pyproject.toml's pins alone) and writes what pip resolved to constraints.txt.
# Run after changing a dependency in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"${PYTHON:-python3}" -m venv "$scratch"
"$scratch/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip==25.3"
"$scratch/bin/python" -m pip install --quiet --disable-pip-version-check ".[test]"
{
  echo "# The whole dependency tree, pinned (scripts/lock.sh writes this file)."
  "$scratch/bin/python" -m pip freeze --disable-pip-version-check --exclude-editable \
    | grep -v '^rethink-mn[= ]'
} > constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) packages"
