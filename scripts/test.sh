#!/usr/bin/env bash
# The project's test command (`make test`, what CI runs): set up everything on a fresh machine,
# then run lint, strict typing, the generated-code check, the docs build, and every test on every
# claimed Python (3.14 and 3.15 from Debian sid's packages), on the dependency floors, on PyPy
# 3.11, on free-threaded CPython 3.13 and, under qemu-user, a smoke selection on riscv64, s390x
# and ppc64le (scripts/test_matrix.py, three at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
CACHE_ROOT="${SEPP_TRIO_CACHE:-$HOME/.cache/sepp-trio}"

# PyPy, free-threaded CPython, sid's 3.14 and 3.15 and trixie's 3.13 for riscv64, s390x and
# ppc64el (with qemu-user) for the matrix: made (once, then cached) in the background while
# the steps before the matrix run; the matrix's parts wait (flock).
mkdir -p "$CACHE_ROOT/interpreters"
interpreters_log="$CACHE_ROOT/interpreters/provision.log"
echo "==> PyPy 3.11, free-threaded CPython 3.13, CPython 3.14 and 3.15, CPython 3.13 for riscv64, s390x and ppc64le, in the background (log: $interpreters_log)"
bash scripts/ensure-interpreters.sh >"$interpreters_log" 2>&1 &
interpreters_pid=$!

# The sepp server likewise (a cold `cargo install` takes 7-8 minutes here, beside the 3.13t
# build; 4.7 alone): the lint, type and docs steps need no server; the matrix waits for it below.
server_log="$CACHE_ROOT/ensure-sepp-server.log"
server_path="$CACHE_ROOT/ensure-sepp-server.path"
echo "==> sepp server binary, in the background (log: $server_log)"
bash scripts/ensure-sepp-server.sh >"$server_path" 2>"$server_log" &
server_pid=$!

echo "==> virtualenv and dependencies ($VENV)"
bash scripts/setup-venv.sh

echo "==> sepp-py peer virtualenv (interop tests and benchmarks)"
SEPPY_PYTHON="$(bash scripts/ensure-seppy-venv.sh | tail -n 1)"
export SEPPY_PYTHON

echo "==> nginx and HAProxy (tests/proxies; installed from the OS packages when root)"
bash scripts/ensure-proxies.sh || echo "nginx or HAProxy unavailable: the proxy tests will fail, saying how to get them"

echo "==> PostgreSQL (the outbox tests; installed from the OS packages when root)"
bash scripts/ensure-postgres.sh || echo "PostgreSQL unavailable: the outbox tests will fail, saying how to get it"

echo "==> generated code is up to date"
bash scripts/check-gen.sh

echo "==> ruff"
"$VENV/bin/ruff" check src tests examples benchmarks scripts docs/conf.py docs/_ext hatch_build.py
"$VENV/bin/ruff" format --check src tests examples benchmarks scripts docs/conf.py docs/_ext hatch_build.py

echo "==> mypy --strict"
"$VENV/bin/mypy" src/sepp

echo "==> docs (make docs)"
bash scripts/build-docs.sh

echo "==> PyPy 3.11, free-threaded CPython 3.13, CPython 3.14 and 3.15, the emulated 3.13s"
if wait "$interpreters_pid"; then
    tail -n 7 "$interpreters_log"
else  # their matrix parts try again and fail with the reason; the other parts still run
    echo "scripts/ensure-interpreters.sh failed (the end of $interpreters_log):"
    tail -n 20 "$interpreters_log"
fi

echo "==> sepp server binary"
if ! wait "$server_pid"; then
    echo "scripts/ensure-sepp-server.sh failed (the end of $server_log):"
    tail -n 30 "$server_log"
    exit 1
fi
SEPP_BIN="$(tail -n 1 "$server_path")"
export SEPP_BIN
"$SEPP_BIN" --version

echo "==> pytest on every claimed Python, the dependency floors, PyPy, free-threaded, riscv64, s390x, ppc64le"
"$VENV/bin/python" scripts/test_matrix.py -- "$@"
