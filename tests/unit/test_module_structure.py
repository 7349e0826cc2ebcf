"""The package's own import graph: no cycles, not even through TYPE_CHECKING or lazy imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

# The same on every interpreter and dependency version: on the matrix's main part only.
pytestmark = pytest.mark.main_only

SRC = Path(__file__).resolve().parents[2] / "src"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = SRC.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def import_graph() -> dict[str, set[str]]:
    """sepp module → the sepp modules it imports anywhere (top level, functions, TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {}
    for path in (SRC / "sepp").rglob("*.py"):
        if "_pb" in path.parts:
            continue  # generated code
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                if target.split(".")[0] != "sepp":
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges.add(sub if _is_module(sub) else target)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.split(".")[0] == "sepp")
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            cycle = visit(target, [*path, node])
            if cycle is not None:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_is_read_from_the_sources() -> None:
    graph = import_graph()
    assert "sepp._model.errors" in graph["sepp._model.validate"]  # a plain relative import
    # `from .._model import message_codec as mc`
    assert "sepp._model.message_codec" in graph["sepp._client.operations"]
    assert "sepp.wire" in graph["sepp._model.errors"]  # a relative import of a subpackage
    assert "sepp.wire._calls" in graph["sepp.wire.codec._connection"]  # of a parent's module


def test_sepp_modules_import_each_other_without_cycles() -> None:
    graph = import_graph()
    graph.pop("sepp")  # the package namespace imports everything; nothing imports it back
    assert find_cycle(graph) is None


# The layers, lowest first: a module may import its own layer and the ones before it. The
# package namespace (`sepp`), `sepp.__main__`, the command line, `sepp.testing` and
# `sepp.contrib` (integrations with other services, each behind an extra) sit on top and may
# import anything. docs/contributing.md ("Architecture") draws the same picture.
# `_runtime` is the one seam to trio, asyncio and anyio that the client and the services share;
# `_probes` (the HTTP server and the Prometheus format) is at the bottom, for every service.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sepp._version", "sepp._pb", "sepp._util", "sepp._probes"),
    ("sepp.wire",),
    ("sepp._model",),
    ("sepp._runtime",),
    ("sepp._client",),
    ("sepp._limits",),
    ("sepp._payloads",),
    ("sepp._worker", "sepp._scheduling", "sepp._outbox"),
)
TOP = ("sepp", "sepp.__main__", "sepp._cli", "sepp.testing", "sepp.contrib")
SERVICES = ("sepp._worker", "sepp._scheduling", "sepp._outbox")
# Within a layer, packages that never import each other: the two engines inside `wire` (and
# only drivers import drivers), and the three services, whose shared parts are `_runtime`'s
# and `_probes`'.
INDEPENDENT = (
    ("sepp.wire.codec", "sepp.wire.h2ref", "the engines are independent"),
    ("sepp.wire.h2ref", "sepp.wire.codec", "the engines are independent"),
    *(
        (importer, other, "the services are independent")
        for importer in SERVICES
        for other in SERVICES
        if other != importer
    ),
)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int | None:
    """The layer `module` belongs to (None: the top, which may import anything)."""
    if any(module == top or (top != "sepp" and _within(module, top)) for top in TOP):
        return None
    for rank, prefixes in enumerate(LAYERS):
        if any(_within(module, prefix) for prefix in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS (and the docs)")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        rank = layer_of(module)
        for target in sorted(targets):
            target_rank = layer_of(target)
            if rank is not None and (target_rank is None or target_rank > rank):
                found.append(f"{module} imports {target}, a layer above it")
            for importer, forbidden, why in INDEPENDENT:
                if _within(module, importer) and _within(target, forbidden):
                    found.append(f"{module} imports {target}: {why}")
            if _within(target, "sepp.wire.drivers") and not _within(module, "sepp.wire.drivers"):
                if _within(module, "sepp.wire"):
                    found.append(f"{module} imports {target}: the engines know no driver")
    return found


def test_every_module_is_in_a_layer_and_imports_only_those_below() -> None:
    assert layer_violations(import_graph()) == []


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = import_graph()
    graph["sepp._model.types"] = {*graph["sepp._model.types"], "sepp._client.client"}
    graph["sepp.wire._framing"] = {*graph["sepp.wire._framing"], "sepp._model.errors"}
    graph["sepp.wire.codec._connection"] = {"sepp.wire.h2ref._connection"}
    graph["sepp._scheduling.scheduler"] = {
        *graph["sepp._scheduling.scheduler"],
        "sepp._worker.shutdown",
    }
    graph["sepp._runtime.concurrency"] = {*graph["sepp._runtime.concurrency"], "sepp._client.sync"}
    graph["sepp._outbox.metrics"] = {*graph["sepp._outbox.metrics"], "sepp._worker.monitor"}
    graph["sepp._probes.server"] = {*graph["sepp._probes.server"], "sepp._model.errors"}
    assert layer_violations(graph) == [
        "sepp._model.types imports sepp._client.client, a layer above it",
        "sepp._outbox.metrics imports sepp._worker.monitor: the services are independent",
        "sepp._probes.server imports sepp._model.errors, a layer above it",
        "sepp._runtime.concurrency imports sepp._client.sync, a layer above it",
        "sepp._scheduling.scheduler imports sepp._worker.shutdown: the services are independent",
        "sepp.wire._framing imports sepp._model.errors, a layer above it",
        "sepp.wire.codec._connection imports sepp.wire.h2ref._connection: the engines are"
        " independent",
    ]


def private_import_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of another package's private modules.

    The rule: a module whose name starts with one underscore (`_x.py`, or a package `_x/`)
    is private to the package P that holds it. It, and any name in it, may be imported only
    by a module inside P: P's own modules, P's `__init__`, and the modules of P's
    subpackages at any depth. Every other module imports P's public `__init__` names
    instead (`from sepp.wire.drivers import RpcError`, never `from sepp.wire.drivers._base
    import RpcError`). Every underscored part of an imported name counts: `sepp._model.types`
    is private to `sepp` (so any sepp module may import it), `sepp.wire.drivers._trio` to
    `sepp.wire.drivers`. So a subpackage uses its parents' private modules (`wire/codec/`
    imports `wire/_calls.py`), a package never reaches into a subpackage's (`wire/_engine.py`
    takes `CodecGrpcConnection` from `wire/codec/__init__.py`), and no layer into another's.
    Dunder names (`__main__`) are not private. Tests, benchmarks and scripts may import
    anything; this holds for `src/sepp`.
    """
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            parts = target.split(".")
            for index, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:index])
                    if not _within(module, owner):
                        found.append(f"{module} imports {target}, private to {owner}")
                        break
    return found


def test_no_module_imports_the_private_modules_of_another_package() -> None:
    assert private_import_violations(import_graph()) == []


def test_the_private_import_check_sees_a_reach_into_another_package() -> None:
    graph = {
        "sepp._client.client": {"sepp.wire.drivers._base", "sepp._model.types", "sepp.wire"},
        "sepp.wire._engine": {"sepp.wire.codec._connection", "sepp.wire.codec"},
        "sepp.wire.codec._windows": {"sepp.wire._calls", "sepp.wire.codec._frames"},
        "sepp.wire.drivers": {"sepp.wire.drivers._trio"},
        "sepp": {"sepp.wire._status", "sepp._version", "sepp.__main__"},
    }
    assert private_import_violations(graph) == [
        "sepp imports sepp.wire._status, private to sepp.wire",
        "sepp._client.client imports sepp.wire.drivers._base, private to sepp.wire.drivers",
        "sepp.wire._engine imports sepp.wire.codec._connection, private to sepp.wire.codec",
    ]


# The Worker and the Scheduler take what they need of trio (clock, sleeping, cancel scopes,
# nurseries, events, threads, calls from other threads) from `_runtime/concurrency.py` alone
# (trio's members are `trio_runtime`'s, the client's too), so that another library provides one
# runtime module; the monitor's HTTP server (`_probes`) is a thread of plain sockets, under every
# runtime.
TRIO_SEAM = ("sepp._runtime.concurrency",)


def imports_trio(source: str, library: str = "trio") -> bool:
    """Whether `source` imports trio (or `library`) anywhere (top level, functions,
    TYPE_CHECKING)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(
            alias.name.split(".")[0] == library for alias in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] == library:
                return True
    return False


def trio_importers(*packages: str) -> list[str]:
    found = []
    for path in sorted((SRC / "sepp").rglob("*.py")):
        name = _module_name(path)
        if any(_within(name, package) for package in packages):
            if imports_trio(path.read_text(encoding="utf-8")):
                found.append(name)
    return found


def test_the_worker_and_the_scheduler_reach_trio_only_through_their_seam() -> None:
    assert [
        name
        for name in trio_importers(*SERVICES, "sepp._probes", "sepp._limits")
        if name not in TRIO_SEAM
    ] == []
    assert trio_importers("sepp._runtime.concurrency") == ["sepp._runtime.concurrency"]


# Within the runtime layer, each library is imported by its own runtime only (and trio by the
# services' `concurrency`, for trio's TaskStatus and TooSlowError): the protocols
# (`protocol`), the picking of a runtime (`running`) and `shutdown_handle` import none of them,
# so each runtime is one module beside them; `wall_clock` reads whichever runs (lazily).
RUNTIME_IMPORTERS = {
    "trio": ["sepp._runtime.concurrency", "sepp._runtime.trio_runtime", "sepp._runtime.wall_clock"],
    "anyio": ["sepp._runtime.asyncio_runtime"],  # only once a service runs under asyncio
    "asyncio": ["sepp._runtime.asyncio_runtime", "sepp._runtime.wall_clock"],
}


def test_in_the_runtime_layer_each_library_is_imported_by_its_implementations_only() -> None:
    for library, importers in RUNTIME_IMPORTERS.items():
        found = [
            _module_name(path)
            for path in sorted((SRC / "sepp" / "_runtime").rglob("*.py"))
            if imports_trio(path.read_text(encoding="utf-8"), library)
        ]
        assert found == importers, library


# Under asyncio they run on anyio, which only the asyncio runtime (its services' members)
# imports. It is not imported under trio (a test runs a Worker there and looks).
ANYIO_SEAM = ["sepp._runtime.asyncio_runtime"]


def imports_anyio(source: str) -> bool:
    return imports_trio(source, "anyio")


def test_the_worker_and_the_scheduler_reach_anyio_only_through_their_seam() -> None:
    importers = [
        _module_name(path)
        for path in sorted((SRC / "sepp").rglob("*.py"))
        if any(
            _within(_module_name(path), p)
            for p in ("sepp._runtime", *SERVICES, "sepp._probes", "sepp._limits")
        )
        and imports_anyio(path.read_text(encoding="utf-8"))
    ]
    assert importers == ANYIO_SEAM
    assert imports_anyio("def f():\n    import anyio.lowlevel")
    assert not imports_anyio("from .asyncio_runtime import ASYNCIO")


def test_the_trio_check_sees_every_form_of_import() -> None:
    assert imports_trio("import trio")
    assert imports_trio("import trio.lowlevel as ll")
    assert imports_trio("def f():\n    from trio import sleep")
    assert imports_trio("if TYPE_CHECKING:\n    from trio.abc import Stream")
    assert not imports_trio("from .concurrency import sleep\nimport triolet")


# Within `wire`, only the trio driver imports trio: the engines and the drivers' shared core
# (`_base`, `_core`, `_tls`, `_sending`) have no event loop, so the blocking driver, and a
# driver for another loop, build on them without it.
TRIO_IN_WIRE = ("sepp.wire.drivers._trio", "sepp.wire.drivers._waiters")


def test_within_wire_only_the_trio_driver_imports_trio() -> None:
    assert [name for name in trio_importers("sepp.wire") if name not in TRIO_IN_WIRE] == []
    assert trio_importers("sepp.wire.drivers._trio") == ["sepp.wire.drivers._trio"]


# Who may import trio at all. On the client side (`_model`, `_client`, `_payloads`, `wire`) only
# the trio runtime and the trio driver do: the shared client code reaches trio through the
# `Runtime` it is given (`_runtime/protocol.py`). Beyond them, only the Worker's and the
# Scheduler's seam above, and the command line and `sepp.testing`, trio applications both.
TRIO_USERS = (
    "sepp._runtime.trio_runtime",
    # the wall clock follows a trio run's clock (a MockClock's virtual time), only once trio
    # is imported and a run is on
    "sepp._runtime.wall_clock",
    *TRIO_IN_WIRE,
    *TRIO_SEAM,
    "sepp._cli",
    "sepp.testing",
)


def trio_violations(importers: list[str]) -> list[str]:
    return [
        f"{module} imports trio: reach it through the Runtime"
        for module in sorted(importers)
        if not any(_within(module, allowed) for allowed in TRIO_USERS)
    ]


def test_only_the_trio_runtime_imports_trio_on_the_client_side() -> None:
    importers = trio_importers("sepp")
    assert "sepp._runtime.trio_runtime" in importers  # the check sees a plain `import trio`
    assert trio_violations(importers) == []


def test_the_trio_check_sees_a_trio_import() -> None:
    importers = [*trio_importers("sepp"), "sepp._client.batching", "sepp._model.types", "sepp"]
    assert trio_violations(importers) == [
        "sepp imports trio: reach it through the Runtime",
        "sepp._client.batching imports trio: reach it through the Runtime",
        "sepp._model.types imports trio: reach it through the Runtime",
    ]


# asyncio, likewise: only the asyncio runtime and the asyncio driver (with its cancel scopes)
# import it, so `import sepp` under trio never loads it (the runtime is imported when a client
# is opened, or a service run, under asyncio).
ASYNCIO_USERS = (
    "sepp._runtime.asyncio_runtime",
    "sepp._runtime.wall_clock",  # a clock installed for a loop; only once asyncio is imported
    "sepp.wire.drivers._asyncio",
    "sepp.wire.drivers._asyncio_scopes",
)


def imports_asyncio(source: str) -> bool:
    """Whether `source` imports asyncio anywhere (top level, functions, TYPE_CHECKING)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(
            alias.name.split(".")[0] == "asyncio" for alias in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] == "asyncio":
                return True
    return False


def asyncio_violations(
    packages: tuple[str, ...] = (
        "sepp._runtime",
        "sepp._client",
        "sepp._model",
        "sepp.wire",
        "sepp._probes",
    ),
) -> list[str]:
    found = []
    for path in sorted((SRC / "sepp").rglob("*.py")):
        name = _module_name(path)
        if any(_within(name, package) for package in packages) and name not in ASYNCIO_USERS:
            if imports_asyncio(path.read_text(encoding="utf-8")):
                found.append(f"{name} imports asyncio: reach it through the Runtime")
    return found


def test_on_the_client_side_only_the_asyncio_runtime_and_driver_import_asyncio() -> None:
    assert asyncio_violations() == []
    assert imports_asyncio(
        (SRC / "sepp" / "_runtime" / "asyncio_runtime.py").read_text(encoding="utf-8")
    )


def test_the_asyncio_check_sees_every_form_of_import() -> None:
    assert imports_asyncio("import asyncio")
    assert imports_asyncio("def f():\n    from asyncio import sleep")
    assert imports_asyncio("if TYPE_CHECKING:\n    import asyncio.events as e")
    assert not imports_asyncio("import sys\nasyncio = sys.modules.get('asyncio')")
