#!/usr/bin/env bash
# The docs site (`make docs`): Sphinx from a fresh environment (-E, so changed docstrings are
# never missed), every warning an error (-W), every cross-reference to our API checked (-n).
# The examples in the pages run in the test suite (tests/docs), not here.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
"$VENV/bin/sphinx-build" -E -W --keep-going -n -q -b html docs docs/_build/html
echo "docs built: docs/_build/html/index.html"
