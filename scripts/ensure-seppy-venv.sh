#!/usr/bin/env bash
# Create (or reuse) a private virtualenv holding the official peer client
# `sepp-py` 0.1.0, so tests and benchmarks can drive it as a subprocess
# (tests/peers/seppy_driver.py).
#
# sepp-py also imports as `sepp`, exactly like this project, so it must never
# be installed into the project's own environment.
#
# Idempotent: a venv that already has the pinned versions is left alone.
# Env:
#   SEPPY_VENV   venv location (default: <repo>/.venv-seppy)
#   SEPPY_PYTHON interpreter used to create it (default: python3)
# The last line on stdout is the venv's python path. Progress goes to stderr.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SEPPY_VENV:-$repo_root/.venv-seppy}"
base_python="${SEPPY_PYTHON:-python3}"

# Pinned peer + what the driver needs: sepp-py's `otel` extra (api + sdk) for
# the tracing interop ops (listed explicitly so the import check can rely on them).
SEPPY_REQUIREMENTS=(
    "sepp-py==0.1.0"
    "opentelemetry-api>=1.20"
    "opentelemetry-sdk>=1.20"
)
# Bump this when SEPPY_REQUIREMENTS changes so existing venvs get refreshed.
stamp_value="v1 ${SEPPY_REQUIREMENTS[*]}"

log() { printf 'ensure-seppy-venv: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Serialise concurrent callers (e.g. parallel test processes). The lock lives
# in $TMPDIR so nothing untracked appears in the work tree.
mkdir -p "$(dirname "$venv")"
venv="$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")"
venv_python="$venv/bin/python"
stamp="$venv/.seppy-stamp"
if command -v flock >/dev/null 2>&1; then
    lock="${TMPDIR:-/tmp}/ensure-seppy-venv-$(printf '%s' "$venv" | cksum | cut -d' ' -f1).lock"
    exec 9>"$lock"
    flock 9
fi

# -I (isolated mode) everywhere: a PYTHONPATH pointing at this repo's src/
# must not shadow sepp-py's `sepp`.
import_check() {
    "$venv_python" -I - <<'EOF'
import importlib.metadata as md
assert md.version("sepp-py") == "0.1.0", md.version("sepp-py")
import sepp, grpc, opentelemetry.sdk.trace  # noqa: F401
from sepp import SeppClient, Worker  # noqa: F401
EOF
}

check_venv() {
    [[ -x "$venv_python" ]] || return 1
    [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]] || return 1
    import_check >/dev/null 2>&1
}

if check_venv; then
    log "reusing $venv"
    printf '%s\n' "$venv_python"
    exit 0
fi

command -v "$base_python" >/dev/null 2>&1 || die "interpreter '$base_python' not found"

if [[ ! -x "$venv_python" ]]; then
    if [[ -e "$venv" && ! -f "$venv/pyvenv.cfg" && -n "$(ls -A "$venv" 2>/dev/null)" ]]; then
        die "$venv exists, is not empty and is not a virtualenv; refusing to replace it"
    fi
    log "creating venv $venv with $base_python ($("$base_python" --version 2>&1))"
    rm -rf "$venv"
    "$base_python" -m venv "$venv" || die "python -m venv failed (on Debian: apt-get install python3-venv)"
fi

# Refuse to clobber something that is not a venv we could have made.
[[ -f "$venv/pyvenv.cfg" ]] || die "$venv exists but is not a virtualenv"

rm -f "$stamp"
log "installing ${SEPPY_REQUIREMENTS[*]}"
"$venv_python" -I -m pip install --disable-pip-version-check --no-input --quiet \
    "${SEPPY_REQUIREMENTS[@]}" >&2 || die "pip install into $venv failed"

import_check >&2 || die "venv $venv was installed but importing sepp-py 0.1.0 fails (see above)"
printf '%s\n' "$stamp_value" >"$stamp"
log "ready: $venv"
printf '%s\n' "$venv_python"
