#!/usr/bin/env bash
# Create .venv with sepp-trio (editable) and the dev tools. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
stamp="$VENV/.sepp-trio-deps"
want="$(cat pyproject.toml requirements-dev.txt docs/requirements.txt | sha256sum | cut -c1-16)"
if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e . -r requirements-dev.txt
echo "$want" > "$stamp"
