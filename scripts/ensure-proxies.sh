#!/usr/bin/env bash
# Make sure nginx and HAProxy are available for the proxy tests (tests/proxies) and print
# where they are: one `name: path (version)` line each on stdout.
#
# Lookup: $SEPP_NGINX / $SEPP_HAPROXY, then PATH, then /usr/sbin. When one is missing and we
# are root on a machine with apt-get, install the Debian packages (`nginx-light`, or `nginx`
# where the light flavour is gone, and `haproxy`) after an `apt-get update`, without letting
# their post-install scripts start the system services. Idempotent: quick when both are there.
#
# Exits 1 when either cannot be had; the proxy tests then skip and say how to get them.
set -euo pipefail

log() { printf 'ensure-proxies: %s\n' "$*" >&2; }

find_bin() {  # find_bin ENV_VALUE NAME -> path or nothing
    local given="$1" name="$2"
    if [[ -n "$given" && -x "$given" ]]; then
        printf '%s\n' "$given"
    elif command -v "$name" >/dev/null 2>&1; then
        command -v "$name"
    elif [[ -x "/usr/sbin/$name" ]]; then
        printf '%s\n' "/usr/sbin/$name"
    fi
}

nginx_bin="$(find_bin "${SEPP_NGINX:-}" nginx)"
haproxy_bin="$(find_bin "${SEPP_HAPROXY:-}" haproxy)"

if [[ -z "$nginx_bin" || -z "$haproxy_bin" ]]; then
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        log "nginx or haproxy is missing and this is not root with apt-get; install them with"
        log "  sudo apt-get install nginx-light haproxy   (or your OS's nginx and haproxy)"
        log "or point SEPP_NGINX / SEPP_HAPROXY at the binaries"
        exit 1
    fi
    packages=()
    if [[ -z "$nginx_bin" ]]; then
        if apt-cache show nginx-light >/dev/null 2>&1; then packages+=(nginx-light); else packages+=(nginx); fi
    fi
    [[ -n "$haproxy_bin" ]] || packages+=(haproxy)
    # Keep the packages' post-install scripts from starting system-wide daemons on port 80.
    created_policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    export DEBIAN_FRONTEND=noninteractive
    log "apt-get update"
    # Other installers (scripts/ensure-interpreters.sh, ensure-sepp-server.sh) may hold apt.
    apt-get update -qq -o DPkg::Lock::Timeout=600 >&2
    log "apt-get install ${packages[*]}"
    apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${packages[@]}" >&2
    if [[ -n "$created_policy" ]]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
    nginx_bin="$(find_bin "${SEPP_NGINX:-}" nginx)"
    haproxy_bin="$(find_bin "${SEPP_HAPROXY:-}" haproxy)"
    if [[ -z "$nginx_bin" || -z "$haproxy_bin" ]]; then
        log "installed ${packages[*]} but nginx or haproxy is still missing"
        exit 1
    fi
fi

nginx_version="$("$nginx_bin" -v 2>&1 | sed -n 's/^nginx version: //p')"
haproxy_version="$("$haproxy_bin" -v 2>&1 | sed -n '1s/^HAProxy version \([^ ]*\).*/\1/p')"
printf 'nginx: %s (%s)\n' "$nginx_bin" "$nginx_version"
printf 'haproxy: %s (haproxy %s)\n' "$haproxy_bin" "$haproxy_version"
