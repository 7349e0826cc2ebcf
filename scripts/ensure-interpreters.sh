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
#   py3.13-riscv64 <path>   CPython 3.13 from Debian trixie's `python3.13`, `python3.13-venv`
#   py3.13-s390x <path>     (and `libstdc++6`, for protobuf's upb) for riscv64, s390x
#   py3.13-ppc64le <path>   (big-endian) and ppc64el, unpacked and patched like the sid
#                     Pythons, run by qemu-user (trixie's static `qemu-user` binaries, unpacked
#                     too). Where binfmt_misc runs the
#                     architecture's ELF files through qemu (an entry of the machine's, or one
#                     this script registers as root, mounting binfmt_misc if it must), <path>
#                     is the interpreter itself; elsewhere (or with SEPP_TRIO_BINFMT=0) it is
#                     a wrapper script beside it that names the emulator, so that what starts
#                     `sys.executable` (the tests' subprocesses, venvs) works either way. A
#                     file of trixie's that the mirror does not serve for that architecture
#                     (its point-release updates, for some) is taken from sid instead, and said.
#
# Those lines are the LAST lines on stdout (in that order, or only the ones asked for:
# `ensure-interpreters.sh py3.13t`; no argument means all seven); progress goes to stderr.
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

# The emulated architectures: the name's suffix (Python's platform.machine()) -> Debian's.
declare -A DEBIAN_ARCH=([riscv64]=riscv64 [s390x]=s390x [ppc64le]=ppc64el)
ALL=(pypy3.11 py3.13t py3.14 py3.15 py3.13-riscv64 py3.13-s390x py3.13-ppc64le)

wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${ALL[@]}")
for name in "${wanted[@]}"; do
    case " ${ALL[*]} " in
        *" $name "*) ;;
        *) die "unknown interpreter '$name' ($(printf '%s, ' "${ALL[@]}" | sed 's/, $//'))" ;;
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
foreign_arch() {  # foreign_arch SUITE: ARCH when SUITE is SUITE-ARCH (DEBIAN_ARCH's), else nothing
    case " ${DEBIAN_ARCH[*]} " in *" ${1##*-} "*) printf '%s\n' "${1##*-}" ;; esac
}

suite_get() {  # suite_get SUITE ARGS...: SUITE's private apt-get, one at a time (lists, archives)
    # SUITE-ARCH: that suite's packages of a foreign architecture, only them, the suite first.
    local state="$DIR/apt-$1" arch=() foreign
    foreign="$(foreign_arch "$1")"
    [ -z "$foreign" ] || arch=(-o "APT::Architecture=$foreign" -o "APT::Architectures::=$foreign"
        -o "APT::Default-Release=${1%-*}" -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false)
    shift
    APT=(apt-get -q
        -o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status"
        -o "Dir::Cache=$state" -o "Dir::Cache::archives=$state/archives"
        -o Debug::NoLocking=1 -o Acquire::Languages=none -o APT::Sandbox::User=root "${arch[@]}")
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
    if [ "$(foreign_arch "$suite")" ]; then # SUITE-ARCH: the suite's binaries, and sid's where it lacks one
        printf 'deb [signed-by=%s] %s %s main\ndeb [signed-by=%s] %s sid main\n' \
            "$KEYRING" "$mirror" "${suite%-*}" "$KEYRING" "$mirror" >"$state/sources.list"
    else
        printf 'deb [signed-by=%s] %s %s main\ndeb-src [signed-by=%s] %s %s main\n' \
            "$KEYRING" "$mirror" "$suite" "$KEYRING" "$mirror" "$suite" >"$state/sources.list"
    fi
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

debian_python_ready() {  # debian_python_ready HOME VERSION PYTHON: the unpacked root's last steps
    # PYTHON runs the root's interpreter (it, or its emulator's wrapper); the root is HOME/root.
    local home=$1 version=$2 python=$3 root="$1/root"
    # Debian's ensurepip takes pip and setuptools from WHEEL_PKG_DIR, which names the host's
    # directory: point it at the root's (the Debian wheels unpacked there).
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
    "$python" -c 'import ctypes, hashlib, lzma, sqlite3, ssl, venv, zoneinfo, ensurepip
import sysconfig, sys
assert sysconfig.get_config_var("WHEEL_PKG_DIR").startswith(sys.argv[1]), "WHEEL_PKG_DIR"' "$root" ||
        die "the unpacked CPython $version does not start or lacks a module"
    # And a virtualenv made with it gets the root's pip, not the host's (or none).
    local pip_wheel pip_version
    pip_wheel="$(basename "$(compgen -G "$wheels/pip-*.whl" | head -n 1)")"
    pip_version="${pip_wheel#pip-}"
    pip_version="${pip_version%%-*}"
    "$python" -m venv "$home/venv-check" >&2 &&
        "$home/venv-check/bin/python" -m pip --version | grep -q "^pip $pip_version " ||
        die "python$version -m venv does not install the root's pip $pip_version"
    rm -rf "$home/venv-check"
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
    debian_python_ready "$home" "$version" "$bin"
    touch "$home/.complete"
    log "CPython $version from $count $suite packages in $((SECONDS - started))s: $("$bin" -VV)"
    printf '%s\n' "$bin"
}

QEMU_MACHINES=(riscv64 s390x ppc64le)

provide_qemu() {  # provide_qemu: trixie's qemu-user (static) for QEMU_MACHINES; prints its bin dir
    local home="$DIR/qemu-user-$SUITE"
    exec 9>"$home.lock"
    flock 9
    if [ -f "$home/.complete" ]; then
        printf '%s\n' "$home/bin"
        return
    fi
    local started=$SECONDS
    trixie_apt
    rm -rf "$home"
    mkdir -p "$home/debs/partial" "$home/unpacked"
    # 71 MB with every architecture's emulator (statically linked: no dependencies): three kept.
    trixie_get -o "Dir::Cache::archives=$home/debs" -y install --download-only \
        --no-install-recommends qemu-user >&2 || die "downloading $SUITE's qemu-user failed"
    local deb members=() machine
    deb="$(compgen -G "$home/debs/qemu-user_*.deb" | head -n 1)" || die "no qemu-user package"
    for machine in "${QEMU_MACHINES[@]}"; do
        members+=("./usr/bin/qemu-$machine" "./usr/share/qemu/binfmt.d/qemu-$machine.conf")
    done
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$home/unpacked" "${members[@]}" ||
        die "$deb lacks one of ${members[*]}"
    mv "$home/unpacked/usr/bin" "$home/bin"
    mv "$home/unpacked/usr/share/qemu/binfmt.d" "$home/binfmt.d"
    rm -rf "$home/debs" "$home/unpacked"
    for machine in "${QEMU_MACHINES[@]}"; do
        "$home/bin/qemu-$machine" --version >/dev/null || die "$home/bin/qemu-$machine does not run"
    done
    touch "$home/.complete"
    log "qemu-user in $((SECONDS - started))s: $("$home/bin/qemu-s390x" --version | head -n 1)"
    printf '%s\n' "$home/bin"
}

reports_machine() {  # reports_machine PYTHON MACHINE: PYTHON starts and is MACHINE's
    [ "$(timeout 300 "$1" -S -c 'import platform; print(platform.machine())' 2>/dev/null)" = "$2" ]
}

binfmt_runs() {  # binfmt_runs MACHINE QEMU PYTHON: PYTHON (MACHINE's ELF) runs through binfmt_misc
    # An entry of the machine's does, or one registered here as root (binfmt_misc mounted if it
    # is not: a container may allow it); SEPP_TRIO_BINFMT=0 says not to use it.
    local machine=$1 qemu=$2 python=$3 misc=/proc/sys/fs/binfmt_misc
    [ "${SEPP_TRIO_BINFMT:-1}" != 0 ] || return 1
    reports_machine "$python" "$machine" && return 0
    [ "$(id -u)" = 0 ] || return 1
    [ -e "$misc/register" ] || mount -t binfmt_misc binfmt_misc "$misc" 2>/dev/null || return 1
    local name="sepp-trio-qemu-$machine" type offset magic mask flags
    [ -e "$misc/$name" ] && return 1 # ours is there and does not run it
    # Debian's entry (magic and mask) with our emulator; F: opened now, so it keeps working
    # whatever happens to the path (and in other mount namespaces).
    IFS=: read -r _ _ type offset magic mask _ flags <"$(dirname "$qemu")/../binfmt.d/qemu-$machine.conf"
    printf ':%s:%s:%s:%s:%s:%s:%s\n' "$name" "$type" "$offset" "$magic" "$mask" "$qemu" "$flags" \
        >"$misc/register" 2>/dev/null || return 1
    log "registered $qemu with binfmt_misc for $machine's ELF binaries ($misc/$name)"
    reports_machine "$python" "$machine"
}

fetch_served() {  # fetch_served SUITE-ARCH DIR PACKAGE...: their closure into DIR, sid's where need be
    # A mirror may lack some of a suite's files for an architecture (here: trixie's point-release
    # updates of libc6, zlib, openssl, ... for s390x and ppc64el): those packages come from sid.
    local state=$1 debs=$2 output round failed from_sid=()
    shift 2
    for round in 1 2 3 4 5; do
        output="$(suite_get "$state" -o "Dir::Cache::archives=$debs" -y install --download-only \
            --no-install-recommends "$@" "${from_sid[@]/%//sid}" 2>&1)" && return 0
        mapfile -t failed < <(grep -oE 'Failed to fetch [^ ]+\.deb +404' <<<"$output" |
            sed -E 's|^Failed to fetch ([^ ]*/)?([^/_ ]+)_.*|\2|')
        if [ ${#failed[@]} -eq 0 ] || [ "$round" = 5 ]; then
            printf '%s\n' "$output" >&2
            die "downloading ${state%-*}'s $* for ${state##*-} failed"
        fi
        log "the mirror serves no ${state%-*} file of ${failed[*]} for ${state##*-}: taking sid's"
        from_sid+=("${failed[@]}")
    done
}

provide_emulated_python() {  # provide_emulated_python MACHINE: trixie's CPython 3.13 there, emulated
    local machine=$1 arch=${DEBIAN_ARCH[$1]} version=3.13
    local home="$DIR/python$version-$SUITE-$arch" root bin wrapper qemu
    # libstdc++6, which every real system has: protobuf's upb wheel for s390x needs it (without
    # it protobuf quietly falls back to its pure-Python build).
    local packages=("python$version" "python$version-venv" libstdc++6)
    exec 9>"$home.lock" # one maker at a time; the others wait here and find its result
    flock 9
    root="$home/root"
    bin="$root/usr/bin/python$version"
    # Beside the interpreter, so that its prefix is found from the wrapper's path as from its own.
    wrapper="$bin-qemu"
    qemu="$(provide_qemu)/qemu-$machine"
    # .complete names the packages: a root made from another list is made again.
    if [ "$(cat "$home/.complete" 2>/dev/null)" != "${packages[*]}" ] || ! [ -x "$bin" ]; then
        local started=$SECONDS count byteorder=little
        [ "$machine" != s390x ] || byteorder=big
        as_root_install patchelf
        suite_apt "$SUITE-$arch"
        rm -rf "$home"
        mkdir -p "$root" "$home/debs/partial"
        fetch_served "$SUITE-$arch" "$home/debs" "${packages[@]}"
        count="$(unpack_debs "$home/debs" "$root")"
        rm -rf "$home/debs"
        [ -x "$bin" ] || die "$bin is not in $SUITE's python$version package for $arch"
        point_at_root "$root" "$bin"
        # qemu named explicitly, and told the name the program was started by ("$0": a venv's
        # python, linked to this), from which Python finds its prefix or its venv.
        printf '#!/bin/sh\n# CPython %s for %s (Debian %s), run by qemu-user.\nexec %s -0 "$0" %s "$@"\n' \
            "$version" "$machine" "$SUITE" "$qemu" "$bin" >"$wrapper"
        chmod +x "$wrapper"
        debian_python_ready "$home" "$version" "$wrapper"
        [ "$("$wrapper" -c 'import platform, sys; print(platform.machine(), sys.byteorder)')" = \
            "$machine $byteorder" ] || die "$wrapper is not a $byteorder-endian $machine Python"
        printf '%s\n' "${packages[*]}" >"$home/.complete"
        log "CPython $version for $machine from $count packages in $((SECONDS - started))s:" \
            "$("$wrapper" -VV)"
    fi
    if binfmt_runs "$machine" "$qemu" "$bin"; then
        printf '%s\n' "$bin"
    else
        printf '%s\n' "$wrapper"
    fi
}

out=()
for name in "${wanted[@]}"; do
    case "$name" in
        pypy3.11) out+=("pypy3.11 $(provide_pypy)") ;;
        py3.13t) out+=("py3.13t $(provide_py313t)") ;;
        py3.14 | py3.15) out+=("$name $(provide_debian_python "${name#py}")") ;;
        py3.13-*) out+=("$name $(provide_emulated_python "${name#py3.13-}")") ;;
    esac
done
printf '%s\n' "${out[@]}"
