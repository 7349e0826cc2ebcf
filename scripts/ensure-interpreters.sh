#!/usr/bin/env bash
# Provide the interpreters that the test matrix runs besides the CPythons found on the machine,
# cached, and print where they are:
#
#   pypy3.11 <path>   PyPy 3.11 from Debian trixie's `pypy3` package (not installable on
#                     bookworm itself: it needs trixie's libc). Its packages and their
#                     dependencies are unpacked into a private root, and the `pypy3.11` binary's
#                     ELF interpreter and RPATH are pointed at that root's loader and libraries
#                     (patchelf), so it runs on the host as a native program: no chroot, no
#                     LD_LIBRARY_PATH leaking into the programs it starts, and `-m venv` works.
#   py3.13t <path>    free-threaded CPython 3.13 built from Debian's python3.13 source tarball
#                     (the orig tarball of trixie's source package) with
#                     `./configure --disable-gil`, installed into its own prefix.
#   py3.14 <path>     CPython 3.14 and 3.15 from Debian sid's binary packages (`python3.X`,
#   py3.15 <path>     `python3.X-venv`, `libpython3.X-stdlib`, the pip and setuptools wheels that
#                     `-m venv` installs, and their closure), unpacked and patched like PyPy. One
#                     step more: the root's sysconfig data names the host's
#                     /usr/share/python-wheels/ as the place of those wheels (Debian's ensurepip
#                     has none bundled), so `-m venv` would quietly install the host's old pip;
#                     it is pointed at the root's copy.
#
# Those lines are the LAST lines on stdout (in that order, or only the ones asked for:
# `ensure-interpreters.sh py3.13t`; no argument means all four); progress goes to stderr.
# They live under ${SEPP_TRIO_CACHE:-$HOME/.cache/sepp-trio}/interpreters/ and are made only
# when missing (a second run prints at once). Each is made by one run at a time (flock): a
# parallel caller waits for the first one's result.
#
# The packages come through apt with a private configuration per Debian suite (its own sources
# list, lists and an empty dpkg status, so apt resolves the whole dependency closure) that
# points at the Debian mirror configured for this machine (DEBIAN_MIRROR overrides it). Building
# 3.13t needs a C toolchain and the usual -dev packages: installed with apt-get when root and
# missing.
set -euo pipefail

CACHE_ROOT="${SEPP_TRIO_CACHE:-${HOME:?HOME is not set}/.cache/sepp-trio}"
DIR="$CACHE_ROOT/interpreters"
SUITE=trixie
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
PY313_BUILD_DEPS=(gcc make pkg-config xz-utils libssl-dev libffi-dev zlib1g-dev libbz2-dev
    liblzma-dev libsqlite3-dev libreadline-dev uuid-dev libgdbm-dev libncurses-dev)

log() { printf 'ensure-interpreters: %s\n' "$*" >&2; }
die() {
    printf 'ensure-interpreters: ERROR: %s\n' "$*" >&2
    exit 1
}

wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=(pypy3.11 py3.13t py3.14 py3.15)
for name in "${wanted[@]}"; do
    case "$name" in
        pypy3.11 | py3.13t | py3.14 | py3.15) ;;
        *) die "unknown interpreter '$name' (pypy3.11, py3.13t, py3.14, py3.15)" ;;
    esac
done

mkdir -p "$DIR"

as_root_install() {  # as_root_install PACKAGE... : install the missing Debian packages, or fail
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" ||
            missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || die "missing Debian packages (install them as root): ${missing[*]}"
    log "installing ${missing[*]}"
    # Another installer (scripts/ensure-proxies.sh, make test runs both at once) may hold apt.
    apt-get -q -o DPkg::Lock::Timeout=600 update >&2
    DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 install -y \
        --no-install-recommends "${missing[@]}" >&2
}

debian_mirror() {  # the Debian archive this machine's apt uses (not the security one)
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        printf '%s\n' "$DEBIAN_MIRROR"
        return
    fi
    local uri
    uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
        2>/dev/null | grep -v '^[[:space:]]*#' | grep -oE '(https?|mirror\+[a-z]+)://[^][[:space:]]+' |
        grep -v -e security -e '/debian-ports' | grep '/debian/\?$' | head -n 1 || true)"
    printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

APT=()
apt_ready=""
suite_get() {  # suite_get SUITE ARGS...: SUITE's private apt-get, one at a time (lists, archives)
    local state="$DIR/apt-$1"
    shift
    APT=(apt-get -q
        -o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status"
        -o "Dir::Cache=$state" -o "Dir::Cache::archives=$state/archives"
        -o Debug::NoLocking=1 -o Acquire::Languages=none -o APT::Sandbox::User=root)
    (
        flock 8
        "${APT[@]}" "$@"
    ) 8>"$DIR/.apt.lock"
}
suite_apt() {  # suite_apt SUITE: its private apt state, the index fetched once a (sub)shell
    case " $apt_ready " in *" $1 "*) return 0 ;; esac
    local suite=$1 state="$DIR/apt-$1" mirror
    mirror="$(debian_mirror)"
    mkdir -p "$state/lists/partial" "$state/archives/partial"
    : >"$state/status"
    printf 'deb [signed-by=%s] %s %s main\ndeb-src [signed-by=%s] %s %s main\n' \
        "$KEYRING" "$mirror" "$suite" "$KEYRING" "$mirror" "$suite" >"$state/sources.list"
    log "apt index of Debian $suite from $mirror"
    suite_get "$suite" update >&2 || die "apt-get update for $suite failed"
    apt_ready="$apt_ready $suite"
}
trixie_get() { suite_get "$SUITE" "$@"; }
trixie_apt() { suite_apt "$SUITE"; }

unpack_debs() {  # unpack_debs DIR ROOT: every .deb in DIR into ROOT (then removed); prints how many
    local count=0
    for deb in "$1"/*.deb; do
        [ -e "$deb" ] || continue
        dpkg-deb -x "$deb" "$2"
        count=$((count + 1))
    done
    rm -f "$1"/*.deb
    printf '%s\n' "$count"
}

point_at_root() {  # point_at_root ROOT BIN: BIN's loader and RPATH into ROOT
    # The loader and libraries of the root, by absolute path: the host's are older. RPATH,
    # not RUNPATH: it also serves the libraries' own dependencies (libpypy's libffi, ...) and
    # the extension modules the interpreter loads.
    local root=$1 bin=$2 loader libc
    loader="$(patchelf --print-interpreter "$bin")"
    [ -e "$root$loader" ] || loader="/usr$loader" # merged /usr: /lib64 is /usr/lib64
    libc="$(find "$root/usr/lib" -name libc.so.6 | head -n 1)"
    [ -e "$root$loader" ] && [ -n "$libc" ] || die "no loader or libc in $root"
    patchelf --set-interpreter "$root$loader" --force-rpath --set-rpath "$(dirname "$libc")" "$bin"
}

provide_pypy() {
    local home="$DIR/pypy3.11-$SUITE" root bin
    exec 9>"$home.lock" # one maker at a time; the others wait here and find its result
    flock 9
    root="$home/root"
    bin="$root/usr/bin/pypy3.11"
    if [ -f "$home/.complete" ] && [ -x "$bin" ]; then
        printf '%s\n' "$bin"
        return
    fi
    local started=$SECONDS
    as_root_install patchelf
    trixie_apt
    rm -rf "$home"
    mkdir -p "$root"
    rm -f "$DIR/apt-$SUITE/archives"/*.deb
    trixie_get -y install --download-only --no-install-recommends pypy3 pypy3-venv >&2 ||
        die "downloading $SUITE's pypy3 failed"
    local count
    count="$(unpack_debs "$DIR/apt-$SUITE/archives" "$root")"
    [ -x "$bin" ] || die "$bin is not in $SUITE's pypy3 package any more"
    point_at_root "$root" "$bin"
    "$bin" -c 'import ctypes, hashlib, lzma, sqlite3, ssl, venv' ||
        die "the unpacked PyPy does not start or lacks a module"
    touch "$home/.complete"
    log "PyPy from $count $SUITE packages in $((SECONDS - started))s: $("$bin" -VV 2>&1 | tr '\n' ' ')"
    printf '%s\n' "$bin"
}

provide_py313t() {
    local home="$DIR/python3.13t-debian" bin
    exec 9>"$home.lock" # one maker at a time; the others wait here and find its result
    flock 9
    bin="$home/bin/python3.13t"
    if [ -f "$home/.complete" ] && [ -x "$bin" ]; then
        printf '%s\n' "$bin"
        return
    fi
    local started=$SECONDS
    as_root_install "${PY313_BUILD_DEPS[@]}"
    trixie_apt
    # The orig tarball of the source package, with the size and hash apt's index gives.
    local line url file hash
    line="$(trixie_get --print-uris source python3.13 | grep -E "\.orig\.tar\.xz' " | head -n 1)" ||
        die "apt finds no python3.13 orig tarball in $SUITE"
    url="$(printf '%s' "$line" | cut -d"'" -f2)"
    file="$(printf '%s' "$line" | awk '{ print $2 }')"
    hash="$(printf '%s' "$line" | grep -oE 'SHA256:[0-9a-f]{64}')"
    local build="$DIR/build-python3.13t"
    rm -rf "$build" "$home"
    mkdir -p "$build"
    log "downloading $url"
    /usr/lib/apt/apt-helper -o APT::Sandbox::User=root download-file "$url" "$build/$file" "$hash" >&2 ||
        die "downloading $url failed"
    tar -xJf "$build/$file" -C "$build"
    local src
    src="$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
    log "building $(basename "$src") free-threaded (log: $build/build.log)"
    if ! (cd "$src" && ./configure --prefix="$home" --disable-gil --with-ensurepip=install \
        --disable-test-modules >"$build/build.log" 2>&1 &&
        make -j"$(nproc)" >>"$build/build.log" 2>&1 && make install >>"$build/build.log" 2>&1); then
        tail -n 40 "$build/build.log" >&2
        die "building free-threaded CPython failed (log: $build/build.log)"
    fi
    "$bin" -c 'import sys, ctypes, hashlib, lzma, sqlite3, ssl, venv; assert not sys._is_gil_enabled()' ||
        die "$bin does not start, lacks a module or has the GIL on"
    rm -rf "$build"
    touch "$home/.complete"
    log "free-threaded CPython built in $((SECONDS - started))s: $("$bin" -VV)"
    printf '%s\n' "$bin"
}

provide_debian_python() {  # provide_debian_python 3.X: CPython 3.X from Debian sid's packages
    local version=$1 suite=sid
    local home="$DIR/python$version-$suite" root bin
    exec 9>"$home.lock" # one maker at a time; the others wait here and find its result
    flock 9
    root="$home/root"
    bin="$root/usr/bin/python$version"
    if [ -f "$home/.complete" ] && [ -x "$bin" ]; then
        printf '%s\n' "$bin"
        return
    fi
    local started=$SECONDS
    as_root_install patchelf
    suite_apt "$suite"
    rm -rf "$home"
    mkdir -p "$root" "$home/debs/partial"
    # Its own archive directory: 3.14 and 3.15 are made at once by the matrix's parts.
    suite_get "$suite" -o "Dir::Cache::archives=$home/debs" -y install --download-only \
        --no-install-recommends "python$version" "python$version-venv" \
        "libpython$version-stdlib" python3-pip-whl python3-setuptools-whl >&2 ||
        die "downloading $suite's python$version failed"
    local count
    count="$(unpack_debs "$home/debs" "$root")"
    rm -rf "$home/debs"
    [ -x "$bin" ] || die "$bin is not in $suite's python$version package"
    point_at_root "$root" "$bin"
    # Debian's ensurepip takes pip and setuptools from WHEEL_PKG_DIR, which names the host's
    # directory: point it at the root's (the sid wheels unpacked there).
    local wheels="$root/usr/share/python-wheels" data
    compgen -G "$wheels/pip-*.whl" >/dev/null || die "no pip wheel in $wheels"
    for data in "$root/usr/lib/python$version"/_sysconfigdata_*.py; do
        [ -e "$data" ] || die "no _sysconfigdata_*.py in $root/usr/lib/python$version"
        grep -q "'WHEEL_PKG_DIR': '$wheels/'" "$data" && continue # a symlink to one done
        grep -q "'WHEEL_PKG_DIR': '/usr/share/python-wheels/\?'" "$data" ||
            die "$data does not name /usr/share/python-wheels/ as WHEEL_PKG_DIR any more"
        sed -i --follow-symlinks \
            "s|'WHEEL_PKG_DIR': '/usr/share/python-wheels/\?'|'WHEEL_PKG_DIR': '$wheels/'|" "$data"
    done
    "$bin" -c 'import ctypes, hashlib, lzma, sqlite3, ssl, venv, zoneinfo, ensurepip
import sysconfig, sys
assert sysconfig.get_config_var("WHEEL_PKG_DIR").startswith(sys.argv[1]), "WHEEL_PKG_DIR"' "$root" ||
        die "the unpacked CPython $version does not start or lacks a module"
    # And a virtualenv made with it gets the root's pip, not the host's (or none).
    local pip_wheel pip_version
    pip_wheel="$(basename "$(compgen -G "$wheels/pip-*.whl" | head -n 1)")"
    pip_version="${pip_wheel#pip-}"
    pip_version="${pip_version%%-*}"
    "$bin" -m venv "$home/venv-check" >&2 &&
        "$home/venv-check/bin/python" -m pip --version | grep -q "^pip $pip_version " ||
        die "python$version -m venv does not install the root's pip $pip_version"
    rm -rf "$home/venv-check"
    touch "$home/.complete"
    log "CPython $version from $count $suite packages in $((SECONDS - started))s: $("$bin" -VV)"
    printf '%s\n' "$bin"
}

out=()
for name in "${wanted[@]}"; do
    case "$name" in
        pypy3.11) out+=("pypy3.11 $(provide_pypy)") ;;
        py3.13t) out+=("py3.13t $(provide_py313t)") ;;
        py3.14 | py3.15) out+=("$name $(provide_debian_python "${name#py}")") ;;
    esac
done
printf '%s\n' "${out[@]}"
