"""What we publish: the sdist's and the wheel's contents, the metadata, the PyPI description.

The artefacts are built once per session with the `build` frontend (no isolation: the dev
venv has hatchling), from the working tree; the links are checked in a description built
both without project URLs (as committed) and with a docs address (from a copy of the tree
whose pyproject.toml sets one, as a release with a real home would).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

import pytest

import sepp

# The same on every interpreter and dependency version: on the matrix's main part only.
pytestmark = pytest.mark.main_only

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import hatch_build  # noqa: E402  (the build hook, from the project root)

DOCS_BASE = "https://docs.example.org/sepp-trio/en/stable/"  # a placeholder for the test only
# In the source tree, not in the sdist: the benchmarks (results, the Rust bench crate, their
# scripts) and CI's entry point. benchmarks/README.md stays: docs/performance.md includes it.
NOT_IN_SDIST = ("benchmarks/results/", "benchmarks/sepp-rs-bench/", "benchmarks/runner.py", ".ci/")
SDIST_TREES = ("src/", "tests/", "docs/", "examples/", "scripts/")
SDIST_FILES = (
    "pyproject.toml", "hatch_build.py", "README.md", "LICENSE", "Makefile",
    "requirements-dev.txt", ".readthedocs.yaml", "benchmarks/README.md", "PKG-INFO",
)  # fmt: skip


def build(source: Path, out: Path, *targets: str) -> list[Path]:
    command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), *targets]
    done = subprocess.run(command, cwd=source, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return sorted(out.iterdir())


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    built = build(ROOT, out, "--sdist", "--wheel")
    return {path.suffix: path for path in built}  # ".gz" and ".whl"


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return HeaderParser().parsestr(archive.read(name).decode())


def sdist_names(sdist: Path) -> list[str]:
    with tarfile.open(sdist) as archive:
        return [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]


def tracked(prefixes: tuple[str, ...]) -> list[str]:
    """The project's files under `prefixes`: git's list in a checkout, else the disk's."""
    done = subprocess.run(["git", "ls-files", *prefixes], cwd=ROOT, capture_output=True, text=True)
    if done.returncode == 0 and done.stdout:
        return [name for name in done.stdout.splitlines() if (ROOT / name).exists()]
    return [  # an unpacked sdist (a downstream packager's tree): what is on disk
        str(p.relative_to(ROOT))
        for prefix in prefixes
        for p in (ROOT / prefix).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and "_build" not in p.parts
    ]


# -- contents ---------------------------------------------------------------------------------


def test_the_wheel_holds_only_the_sepp_package(artefacts: dict[str, Path]) -> None:
    with zipfile.ZipFile(artefacts[".whl"]) as archive:
        names = archive.namelist()
    dist_info = f"sepp_trio-{sepp.__version__}.dist-info/"
    assert all(n.startswith(("sepp/", dist_info)) for n in names), names
    shipped = {n for n in names if n.startswith("sepp/")}
    assert shipped == {name.removeprefix("src/") for name in tracked(("src/sepp",))}
    assert {"sepp/py.typed", "sepp/_pb/queue_pb2.py", f"{dist_info}licenses/LICENSE"} <= {*names}


def test_the_sdist_has_what_a_packager_needs_to_build_and_test_and_no_benchmarks(
    artefacts: dict[str, Path],
) -> None:
    names = set(sdist_names(artefacts[".gz"]))
    missing = [n for n in [*tracked(SDIST_TREES), *SDIST_FILES] if n not in names]
    assert not missing, f"not in the sdist: {missing}"
    unwanted = sorted(n for n in names if n.startswith(NOT_IN_SDIST) or "__pycache__" in n)
    assert not unwanted, f"in the sdist but should not be: {unwanted}"
    assert not any(n.startswith("docs/_build/") for n in names)


def test_the_sdist_builds_the_same_wheel(artefacts: dict[str, Path], tmp_path: Path) -> None:
    with tarfile.open(artefacts[".gz"]) as archive:
        archive.extractall(tmp_path, filter="data")
    (unpacked,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    (rebuilt,) = build(unpacked, tmp_path / "out", "--wheel")
    with zipfile.ZipFile(rebuilt) as again, zipfile.ZipFile(artefacts[".whl"]) as first:
        assert sorted(again.namelist()) == sorted(first.namelist())
        assert {n: again.read(n) for n in again.namelist() if n.startswith("sepp/")} == {
            n: first.read(n) for n in first.namelist() if n.startswith("sepp/")
        }
    assert wheel_metadata(rebuilt).as_string() == wheel_metadata(artefacts[".whl"]).as_string()


# -- metadata ---------------------------------------------------------------------------------


def test_the_metadata_says_what_the_package_is_with_pep_639_licence_fields_only(
    artefacts: dict[str, Path],
) -> None:
    meta = wheel_metadata(artefacts[".whl"])
    assert "Trio-native client for the sepp durable job queue" in meta["Summary"]
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"
    assert meta["License"] is None  # the legacy field
    classifiers = meta.get_all("Classifier")
    assert not [c for c in classifiers if c.startswith("License ::")]
    for prefix in ("Development Status ::", "Operating System ::", "Topic ::", "Framework ::"):
        assert any(c.startswith(prefix) for c in classifiers), prefix
    assert "job queue" in meta["Keywords"].split(",")
    assert meta["Requires-Python"] == ">=3.11"
    assert not [r for r in meta.get_all("Requires-Dist") if r.startswith("exceptiongroup")]
    assert meta["Dynamic"] is None  # nothing left for an installer to compute again


def test_every_python_version_classifier_is_one_the_matrix_runs() -> None:
    # scripts/test_matrix.py takes its list from the classifiers: one source for both.
    sys.path.insert(0, str(ROOT / "scripts"))
    import test_matrix

    with open(ROOT / "pyproject.toml", "rb") as file:
        requires = tomllib.load(file)["project"]["requires-python"]
    versions = test_matrix.claimed_versions()
    assert versions[0] == requires.removeprefix(">=")
    assert [int(v.split(".")[1]) for v in versions] == list(
        range(int(versions[0].split(".")[1]), int(versions[-1].split(".")[1]) + 1)
    )  # no gap between the oldest and the newest


def test_without_a_home_there_are_no_project_urls_and_no_relative_links(
    artefacts: dict[str, Path],
) -> None:
    meta = wheel_metadata(artefacts[".whl"])
    assert meta.get_all("Project-URL") is None
    description = meta.get_payload()
    assert isinstance(description, str)
    assert "## Quickstart" in description and "Developing" not in description
    for target in link_targets(description):
        assert target.startswith("https://"), target
    assert "](docs/" not in description and "(docs/" not in description


def test_with_a_docs_address_every_docs_link_points_at_an_existing_page_and_section(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("hatch_build.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "\nurls = {}\n" in pyproject
    home = f'urls = {{ Documentation = "{DOCS_BASE}", Source = "https://example.org/src" }}'
    (tree / "pyproject.toml").write_text(pyproject.replace("\nurls = {}\n", f"\n{home}\n"))
    (wheel,) = build(tree, tmp_path / "out", "--wheel")
    meta = wheel_metadata(wheel)
    assert sorted(meta.get_all("Project-URL")) == [
        f"Changelog, {DOCS_BASE}changelog.html",
        f"Documentation, {DOCS_BASE}",
        "Source, https://example.org/src",
    ]
    description = meta.get_payload()
    assert isinstance(description, str)
    readme_links = [t for t in link_targets((ROOT / "README.md").read_text()) if "://" not in t]
    docs_links = [t for t in link_targets(description) if t.startswith(DOCS_BASE)]
    assert len(docs_links) == len(readme_links) >= 15  # each relative link, rewritten
    for target in link_targets(description):
        assert target.startswith("https://"), target
    for url in docs_links:
        page, _, anchor = url.removeprefix(DOCS_BASE).partition("#")
        source = ROOT / "docs" / f"{page.removesuffix('.html') or 'index'}.md"
        assert source.exists(), url
        if anchor:
            assert anchor in heading_slugs(source.read_text()), url


@pytest.mark.needs("twine")
def test_twine_check_passes(artefacts: dict[str, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, artefacts.values())],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- the link rewriting itself ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "rewritten"),
    [
        ("docs/index.md", "[x](https://d.example/)"),
        ("docs/cli.md", "[x](https://d.example/cli.html)"),
        ("docs/quickstart.md#a-server", "[x](https://d.example/quickstart.html#a-server)"),
        ("https://trio.readthedocs.io", "[x](https://trio.readthedocs.io)"),
        ("LICENSE", "x"),  # no address for it: the words stay
    ],
)
def test_links_are_rewritten_to_the_docs_site_or_reduced_to_their_text(
    target: str, rewritten: str
) -> None:
    assert hatch_build.pypi_description(f"[x]({target})", "https://d.example") == rewritten
    without = "x" if "://" not in target else f"[x]({target})"
    assert hatch_build.pypi_description(f"[x]({target})", "") == without


def link_targets(markdown: str) -> list[str]:
    targets = [m["target"] for m in hatch_build._LINK.finditer(markdown)]
    targets += re.findall(r"""(?:href|src)=["']([^"']+)""", markdown)
    return targets


def heading_slugs(markdown: str) -> set[str]:
    """MyST's (GitHub-style) anchors for the page's headings, as myst_heading_anchors makes."""
    slugs = set()
    for line in markdown.splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            text = re.sub(r"[^\w\- ]", "", match[1].strip().lower())
            slugs.add(text.replace(" ", "-"))
    return slugs
