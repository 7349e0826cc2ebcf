"""`import sepp` loads what opening a client needs and nothing else; the rest loads on first
use, and every public name still resolves (attribute, `from sepp import *`, `dir()`)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

import sepp
from sepp._util.lazy import lazy_module

# Not imported by `import sepp` (none of them is imported by trio either: checked below).
DEFERRED = (
    "opentelemetry",  # the `otel` extra, installed in the dev environment
    "h2",  # the reference wire engine
    "hyperframe",
    "hpack",  # the codec's header decoder: with the first connection
    "google.protobuf",  # the messages: when a client connects
    "sepp._pb",
    "sepp.wire.codec",  # the codec engine: with the first connection
    "argparse",  # the command line
    "sepp._cli",
    "sepp.testing",
    "sepp._worker.worker",
    "sepp._worker.router",
    "sepp._scheduling.schedule",
    "sepp._scheduling.scheduler",
    "sepp._client.sync",
    "zoneinfo",
    "sepp._model.rejection_reasons",
    "json",
    "sepp._payloads.task",  # typed jobs: on first use of sepp.Task or a codec
    "sepp._payloads.codecs",
    "pydantic",  # never, unless a model of theirs is used
    "msgspec",
)


def run_python(code: str) -> object:
    """Run `code` in a fresh interpreter; it prints one Python literal (repr, not json, which
    `import sepp` must not import), returned here."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout)


def imported(*statements: str) -> set[str]:
    """The modules a fresh interpreter holds after `statements`."""
    code = "; ".join([*statements, "import sys", "print(sorted(sys.modules))"])
    result = run_python(code)
    assert isinstance(result, list)
    return set(result)


def loaded(modules: set[str], name: str) -> bool:
    return any(m == name or m.startswith(f"{name}.") for m in modules)


def test_import_sepp_leaves_the_rest_for_first_use() -> None:
    trio_alone = imported("import trio")
    assert not [name for name in DEFERRED if loaded(trio_alone, name)]
    with_sepp = imported("import sepp")
    assert "sepp._client.client" in with_sepp  # opening a client needs no further import
    assert [name for name in DEFERRED if loaded(with_sepp, name)] == []


def test_first_use_loads_what_was_deferred() -> None:
    modules = imported(
        "import sepp",
        "sepp.Worker, sepp.Scheduler, sepp.QueueFull",
        "sepp.Payload.json(1)",
        "sepp._client.otel.AVAILABLE",
        "sepp._model.message_codec.select('protobuf')",
        "sepp._model.message_codec.preload()",
    )
    for name in (
        "sepp._worker.worker",
        "sepp._scheduling.scheduler",
        "sepp._model.rejection_reasons",
        "json",
        "opentelemetry",
        "sepp._pb.queue_pb2",
    ):
        assert loaded(modules, name), name


DEFAULT_CODEC_CALLS = (
    "import os; os.environ.pop('SEPP_MESSAGE_CODEC', None)",  # the default, whatever ours
    "import sepp",
    "from sepp._client import operations as ops",
    "ops.read_ack(b'\\x0a\\x01j')",
    "ops.drain_dead_letters_call('q', 3)",
    "ops.reserve_call('q', lease_duration=30, wait_timeout=1, max_jobs=2, worker_id=None)",
)


def test_the_default_message_codec_imports_protobuf_only_at_connect() -> None:
    modules = imported(*DEFAULT_CODEC_CALLS)
    assert "sepp._model.wire_responses" in modules
    assert not loaded(modules, "google.protobuf") and not loaded(modules, "sepp._pb")


def test_without_upb_the_default_message_codec_never_imports_protobuf() -> None:
    # PyPy and free-threaded builds run pure-Python protobuf; protobuf's own switch stands in.
    modules = imported(
        "import os; os.environ['PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'] = 'python'",
        *DEFAULT_CODEC_CALLS,
        "sepp._model.message_codec.preload()",
        "assert sepp._model.message_codec.RESPONSES is sepp._model.wire_responses",
    )
    assert not loaded(modules, "google.protobuf") and not loaded(modules, "sepp._pb")


def test_the_default_message_codec_loads_protobuf_at_connect_exactly_where_upb_runs() -> None:
    result = run_python(
        "; ".join(
            [
                *DEFAULT_CODEC_CALLS,
                "import sys",
                "codec = sepp._model.message_codec",
                "codec.preload()",
                "from google.protobuf.internal import api_implementation as impl",
                "print([impl.Type() == 'upb', 'sepp._pb.queue_pb2' in sys.modules, "
                "codec.RESPONSES.reserved_jobs.__module__])",
            ]
        )
    )
    assert isinstance(result, list)
    upb, pb_loaded, reader = result
    assert pb_loaded is upb
    assert reader == ("sepp._model.protobuf_codec" if upb else "sepp._model.wire_responses")


def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    result = run_python(
        "import sepp; ns = {}; exec('from sepp import *', ns); "
        "print({'all': sepp.__all__, 'star': sorted(ns), "
        "'missing': [n for n in sepp.__all__ if getattr(sepp, n, None) is None], "
        "'dir': dir(sepp)})"
    )
    assert isinstance(result, dict)
    assert result["missing"] == []
    assert set(result["all"]) <= set(result["star"])
    assert set(result["all"]) <= set(result["dir"])


def test_dataclass_tasks_never_import_pydantic_or_msgspec() -> None:
    # Both are installed in the dev environment; a codec is picked without importing them.
    modules = imported(
        "import dataclasses, sepp, trio",
        "from sepp.testing import job_context",
        "W = dataclasses.make_dataclass('W', [('user', int)])",
        "task = sepp.Task('q', 'w', W)",
        "router = sepp.Router()",
        "exec('async def handle(job, ctx): pass')",
        "router.task(task)(handle)",
        "trio.run(router.lookup('w'), task.encode(W(1)), job_context())",
        "assert task.decode(task.encode(W(1))) == W(1)",
    )
    assert "sepp._payloads.codecs" in modules
    assert not loaded(modules, "pydantic") and not loaded(modules, "msgspec")
    with_models = imported("import pydantic, sepp", "sepp.Task('q', 'w', pydantic.BaseModel)")
    assert loaded(with_models, "pydantic") and not loaded(with_models, "msgspec")


def test_lazy_names_are_the_defining_modules_objects() -> None:
    from sepp._model import rejection_reasons as _rejection_reasons
    from sepp._scheduling import schedule as _schedule
    from sepp._scheduling import scheduler as _scheduler
    from sepp._worker import router as _router
    from sepp._worker import worker as _worker

    assert sepp.Worker is _worker.Worker
    assert sepp.HandlerError is _worker.HandlerError
    assert sepp.Router is _router.Router
    assert sepp.Schedule is _schedule.Schedule
    assert sepp.Scheduler is _scheduler.Scheduler
    assert sepp.QueueFull is _rejection_reasons.QueueFull
    assert issubclass(sepp.QueueFull, sepp.JobRejection)
    assert sepp.describe_job_rejection(sepp.QueueClosing("q")) == "queue 'q' is closing"


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        sepp.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(sepp, "Wroker")
    with pytest.raises(ImportError):
        from sepp import NoSuchThing  # type: ignore[attr-defined]  # noqa: F401


def test_a_lazy_module_imports_on_first_use_then_is_a_plain_module() -> None:
    result = run_python(
        "import sys, types; from sepp._util.lazy import lazy_module; "
        "m = lazy_module('sepp._model.rejection_reasons'); "
        "before = 'sepp._model.rejection_reasons' in sys.modules; "
        "cls = m.QueueFull; real = sys.modules['sepp._model.rejection_reasons']; "
        "print([before, cls is real.QueueFull, type(m) is types.ModuleType, "
        "m.UnknownQueue is real.UnknownQueue])"
    )
    assert result == [False, True, True, True]


def test_a_lazy_module_for_a_missing_module_raises_on_use() -> None:
    missing = lazy_module("sepp._no_such_module")
    assert isinstance(missing, types.ModuleType)
    with pytest.raises(ModuleNotFoundError):
        missing.anything  # noqa: B018


def test_the_type_checking_imports_repeat_the_public_table() -> None:
    # Type checkers read the `if TYPE_CHECKING:` imports; the runtime reads `_PUBLIC`.
    source = Path(sepp.__file__).read_text(encoding="utf-8")
    block = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    typed = {
        alias.asname or alias.name: (node.module or "")
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == {name: module for name, (module, _) in sepp._PUBLIC.items()}
    assert sorted(sepp.__all__) == sorted(typed)


def test_public_objects_present_as_sepp() -> None:
    for name in sepp.__all__:
        value = getattr(sepp, name)
        # Our classes and functions; not type aliases such as CallNext (on Python 3.10 a
        # generic alias passes isinstance(..., type)).
        if (isinstance(value, type) and typing.get_origin(value) is None) or inspect.isfunction(
            value
        ):
            assert value.__module__ == "sepp", name
    assert repr(sepp.Router) == "<class 'sepp.Router'>"
