#!/usr/bin/env bash
# Make sure a sepp server binary is available and print its path.
#
# The path is the LAST line on stdout; everything else (progress, timing,
# warnings) goes to stderr, so `SEPP_BIN="$(scripts/ensure-sepp-server.sh)"`
# works. Idempotent: a second run finds the cached binary and prints at once.
#
# Lookup order:
#   1. $SEPP_BIN, if it is set and names an executable file;
#   2. ${SEPP_TRIO_CACHE:-$HOME/.cache/sepp-trio}/sepp-$SEPP_VERSION/bin/sepp;
#   3. otherwise install it there with
#        cargo install sepp --version $SEPP_VERSION --locked --root <that dir>
#      (if the build fails for want of `protoc`, install the Debian package
#      protobuf-compiler when running as root, and try once more).
#
# Exits non-zero, with the reason on stderr, if no binary can be had.
set -euo pipefail

SEPP_VERSION=0.1.1

CACHE_ROOT="${SEPP_TRIO_CACHE:-${HOME:?HOME is not set}/.cache/sepp-trio}"
INSTALL_ROOT="$CACHE_ROOT/sepp-$SEPP_VERSION"
CACHED_BIN="$INSTALL_ROOT/bin/sepp"

log() { printf 'ensure-sepp-server: %s\n' "$*" >&2; }
die() {
    printf 'ensure-sepp-server: ERROR: %s\n' "$*" >&2
    exit 1
}

check_version() {
    # Warn (do not fail) if a binary is not the pinned release.
    local bin="$1" reported
    if ! reported="$("$bin" --version 2>/dev/null)"; then
        log "warning: '$bin --version' failed; is it really a sepp server binary?"
        return 0
    fi
    reported="${reported%%$'\n'*}"
    case "$reported" in
        *" $SEPP_VERSION"*) ;;
        *) log "warning: $bin reports '$reported'; the tests are pinned to sepp $SEPP_VERSION" ;;
    esac
}

found() {
    check_version "$1"
    printf '%s\n' "$1"
    exit 0
}

# 1. Explicit override.
if [ -n "${SEPP_BIN:-}" ]; then
    if [ -f "$SEPP_BIN" ] && [ -x "$SEPP_BIN" ]; then
        found "$SEPP_BIN"
    fi
    log "warning: SEPP_BIN='$SEPP_BIN' is not an executable file; ignoring it"
fi

# 2. Cache.
if [ -x "$CACHED_BIN" ]; then
    found "$CACHED_BIN"
fi

# 3. Install.
command -v cargo >/dev/null 2>&1 ||
    die "no sepp binary at $CACHED_BIN and 'cargo' is not on PATH. Install Rust (https://rustup.rs) and re-run, or set SEPP_BIN to an existing sepp binary."

mkdir -p "$CACHE_ROOT" || die "cannot create the cache directory $CACHE_ROOT"

# Serialise concurrent runs (parallel CI jobs sharing a cache) when flock exists.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE_ROOT/.sepp-$SEPP_VERSION.lock"
    if ! flock -n 9; then
        log "another run is installing sepp $SEPP_VERSION; waiting for it"
        flock 9
    fi
    if [ -x "$CACHED_BIN" ]; then
        found "$CACHED_BIN"
    fi
fi

BUILD_LOG="$(mktemp "${TMPDIR:-/tmp}/sepp-cargo-install.XXXXXX")"
trap 'rm -f "$BUILD_LOG"' EXIT

run_install() {
    log "installing: cargo install sepp --version $SEPP_VERSION --locked --root $INSTALL_ROOT"
    log "(this compiles the server from source and takes several minutes)"
    # cargo's output goes to stderr so that stdout carries only the path.
    cargo install sepp --version "$SEPP_VERSION" --locked --root "$INSTALL_ROOT" 2>&1 |
        tee "$BUILD_LOG" >&2
}

install_protoc() {
    if command -v protoc >/dev/null 2>&1; then
        return 1 # protoc is there, so that was not the problem
    fi
    if [ "$(id -u)" -ne 0 ]; then
        log "the build needs protoc, and installing it needs root: run 'apt-get install -y protobuf-compiler' (or set PROTOC=/path/to/protoc)"
        return 1
    fi
    command -v apt-get >/dev/null 2>&1 || {
        log "the build needs protoc and there is no apt-get to install it with"
        return 1
    }
    log "the build needs protoc; installing protobuf-compiler"
    # make test runs other installers (ensure-interpreters.sh, ensure-proxies.sh) at once.
    local wait=(-o DPkg::Lock::Timeout=600)
    { apt-get update "${wait[@]}" &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${wait[@]}" protobuf-compiler; } >&2
}

started=$SECONDS
status=0
run_install || status=$?
if [ "$status" -ne 0 ] && grep -qiE 'protoc' "$BUILD_LOG"; then
    if install_protoc; then
        status=0
        run_install || status=$?
    fi
fi
elapsed=$((SECONDS - started))
log "cargo install took ${elapsed}s ($((elapsed / 60))m$((elapsed % 60))s), exit status $status"

if [ "$status" -ne 0 ]; then
    die "'cargo install sepp --version $SEPP_VERSION --locked --root $INSTALL_ROOT' failed (exit $status); see the cargo output above"
fi
[ -x "$CACHED_BIN" ] || die "cargo install reported success but $CACHED_BIN does not exist"

found "$CACHED_BIN"
