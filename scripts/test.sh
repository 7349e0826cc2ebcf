#!/usr/bin/env bash
# The project's test command (`make test`, what CI runs): set up everything on a fresh machine,
# then run lint, strict typing, the generated-code check, the docs build, and every test on every
# claimed Python and on the dependency floors (scripts/test_matrix.py, two at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"

echo "==> virtualenv and dependencies ($VENV)"
bash scripts/setup-venv.sh

echo "==> sepp server binary"
SEPP_BIN="$(bash scripts/ensure-sepp-server.sh | tail -n 1)"
export SEPP_BIN
"$SEPP_BIN" --version

echo "==> sepp-py peer virtualenv (interop tests and benchmarks)"
SEPPY_PYTHON="$(bash scripts/ensure-seppy-venv.sh | tail -n 1)"
export SEPPY_PYTHON

echo "==> nginx and HAProxy (tests/proxies; installed from the OS packages when root)"
bash scripts/ensure-proxies.sh || echo "nginx or HAProxy unavailable: the proxy tests will skip"

echo "==> generated code is up to date"
bash scripts/check-gen.sh

echo "==> ruff"
"$VENV/bin/ruff" check src tests examples benchmarks scripts docs/conf.py docs/_ext hatch_build.py
"$VENV/bin/ruff" format --check src tests examples benchmarks scripts docs/conf.py docs/_ext hatch_build.py

echo "==> mypy --strict"
"$VENV/bin/mypy" src/sepp

echo "==> docs (make docs)"
bash scripts/build-docs.sh

echo "==> pytest on every claimed Python and on the dependency floors"
"$VENV/bin/python" scripts/test_matrix.py -- "$@"
