#!/usr/bin/env bash
# Make sure PostgreSQL's server binaries (initdb, pg_ctl, postgres) are available for the
# outbox tests (tests/fixtures/postgres.py starts a throw-away cluster from them) and print
# where they are: one `postgres: BINDIR (version)` line on stdout.
#
# Lookup: $SEPP_PG_BIN (a directory), then `pg_config --bindir`, then the newest
# /usr/lib/postgresql/*/bin, then initdb on PATH. When missing and we are root on a machine with
# apt-get, install Debian's `postgresql` package after an `apt-get update`, without letting its
# post-install scripts start the system cluster. Idempotent: quick when they are there.
#
# Exits 1 when they cannot be had; the outbox tests then FAIL (never skip) and say how to get
# them.
set -euo pipefail

log() { printf 'ensure-postgres: %s\n' "$*" >&2; }

find_bindir() {
    local dir
    if [[ -n "${SEPP_PG_BIN:-}" && -x "${SEPP_PG_BIN}/initdb" ]]; then
        printf '%s\n' "$SEPP_PG_BIN"; return
    fi
    if command -v pg_config >/dev/null 2>&1; then
        dir="$(pg_config --bindir 2>/dev/null || true)"
        if [[ -n "$dir" && -x "$dir/initdb" ]]; then printf '%s\n' "$dir"; return; fi
    fi
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [[ -n "$dir" && -x "$dir/initdb" ]]; then printf '%s\n' "$dir"; return; fi
    if command -v initdb >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v initdb)")"
    fi
}

bindir="$(find_bindir)"
if [[ -z "$bindir" ]]; then
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        log "PostgreSQL is missing and this is not root with apt-get; install it with"
        log "  sudo apt-get install postgresql   (or your OS's PostgreSQL server package)"
        log "or point SEPP_PG_BIN at the directory holding initdb and pg_ctl"
        exit 1
    fi
    # Keep the package's post-install scripts from starting the system-wide cluster.
    created_policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    export DEBIAN_FRONTEND=noninteractive
    log "apt-get update"
    # Other installers (ensure-proxies.sh, ensure-interpreters.sh) may hold apt.
    apt-get update -qq -o DPkg::Lock::Timeout=600 >&2
    log "apt-get install postgresql"
    apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends postgresql >&2
    if [[ -n "$created_policy" ]]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
    bindir="$(find_bindir)"
    if [[ -z "$bindir" ]]; then
        log "installed postgresql but initdb is still missing"
        exit 1
    fi
fi

version="$("$bindir/postgres" --version 2>/dev/null | sed -n 's/^postgres (PostgreSQL) //p')"
printf 'postgres: %s (%s)\n' "$bindir" "$version"
