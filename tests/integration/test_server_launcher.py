"""``sepp.testing`` against the real sepp server binary.

These tests need the pinned server (``scripts/ensure-sepp-server.sh`` installs
it, or set ``SEPP_BIN``). A missing binary makes them FAIL, never skip.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest
import trio

import sepp
from sepp.testing import (
    SEPP_SERVER_VERSION,
    ExternalSeppServer,
    SeppServer,
    SeppServerNotFound,
    SeppServerStartError,
    _binary,
    find_sepp_binary,
    sepp_server,
)
from sepp.testing._config_schema import SCHEMA, TableList

pytest_plugins = ["pytester"]

INSTALL_HINT = f"cargo install sepp --version {SEPP_SERVER_VERSION} --locked"
FAST = {"storage": {"persist_mode": "buffer"}}


def tcp_connects(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def alive(server: SeppServer) -> bool:
    # A function call, so mypy does not narrow ``server.running`` across stop/start.
    return server.running


def listening_lines(server: SeppServer) -> list[str]:
    return [line for line in server.output_lines if "queue server listening" in line]


def test_pinned_binary_is_available() -> None:
    binary = find_sepp_binary()
    version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert SEPP_SERVER_VERSION in version, version


async def test_starts_and_accepts_tcp() -> None:
    with trio.fail_after(60):
        async with sepp_server(FAST) as server:
            assert alive(server)
            assert server.host == "127.0.0.1"
            assert server.address == f"127.0.0.1:{server.port}"
            assert server.config_path.is_file()
            stream = await trio.open_tcp_stream(server.host, server.port)
            await stream.aclose()
            [line] = listening_lines(server)
            assert f"addr={server.address}" in line
            assert str(server.data_dir) in line
            assert "\x1b" not in line
            workdir = server.config_path.parent.parent
        assert not alive(server)
        assert server.returncode == 0  # SIGTERM is a clean shutdown
        assert not workdir.exists()
        assert not tcp_connects(server.port)


async def test_stop_and_start_reuse_port_and_data_dir() -> None:
    with trio.fail_after(120):
        async with sepp_server(FAST) as server:
            port, data_dir = server.port, server.data_dir
            await server.stop()
            assert not alive(server)
            assert server.returncode == 0
            assert not tcp_connects(port)
            assert data_dir.is_dir()

            await server.start()
            assert alive(server)
            assert (server.port, server.data_dir) == (port, data_dir)
            assert tcp_connects(port)

            await server.restart(kill=True)
            assert alive(server) and server.port == port
            assert tcp_connects(port)
            lines = listening_lines(server)
            assert len(lines) == 3
            assert all(f"addr=127.0.0.1:{port}" in line for line in lines)
            assert all(f"db_path={data_dir}" in line for line in lines)


async def test_start_retries_while_the_port_is_briefly_busy() -> None:
    with trio.fail_after(120):
        async with sepp_server(FAST) as server:
            port = server.port
            await server.stop()
            squatter = socket.socket()
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(server.start)
                    await trio.sleep(1.5)
                    squatter.close()
            finally:
                squatter.close()
            assert alive(server) and server.port == port
            assert any("in use" in line.lower() for line in server.output_lines)


async def test_start_gives_up_when_the_port_stays_busy() -> None:
    with trio.fail_after(120):
        async with sepp_server(FAST, startup_timeout=3) as server:
            port = server.port
            await server.stop()
            with socket.socket() as squatter:
                squatter.bind(("127.0.0.1", port))
                squatter.listen()
                with pytest.raises(SeppServerStartError) as info:
                    await server.start()
            assert "in use" in str(info.value).lower()
            assert not alive(server)


async def test_a_retry_the_deadline_cuts_short_still_says_the_port_is_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a loaded machine the last retry may not even print before the startup deadline:
    # the error must still name the busy port, not "no listening line".
    async with sepp_server(FAST, startup_timeout=3) as server:
        await server.stop()
        attempts = iter(
            [
                SeppServerStartError("failed: exited", ["Address already in use (os error 98)"], 1),
                SeppServerStartError("failed: no 'queue server listening' line", [], None),
            ]
        )

        async def start_once(deadline: float) -> None:
            raise next(attempts)

        monkeypatch.setattr(server, "_start_once", start_once)
        with pytest.raises(SeppServerStartError) as info:
            await server.start()
        assert "already in use" in " ".join(info.value.output_lines)


async def test_queues_and_named_api_keys_config() -> None:
    config = {
        "server": {"strict_queues": True},
        "auth": {
            "api_keys": [
                {"name": "suite", "key": "suite-secret-0001"},
                {"name": "other", "key": "other-secret-0002"},
            ]
        },
        "storage": {"dead_letter_retention_ms": 600_000, "persist_mode": "buffer"},
        "limits": {"max_wait_timeout_ms": 30_000},
        "queues": [
            {
                "name": "main",
                "allowed_job_types": ["echo", "boom"],
                "default_max_attempts": 2,
                "retry_backoff": "exponential",
                "retry_delay_ms": 1000,
                "retry_delay_max_ms": 8000,
            },
            {"name": "second", "default_priority": 5},
        ],
    }
    with trio.fail_after(60):
        async with sepp_server(config) as server:
            [line] = listening_lines(server)
            # String fields are quoted in the text log format.
            assert 'auth="enabled"' in line
            assert 'strict_queues="enabled"' in line
            assert "declared_queues=2" in line
            assert tcp_connects(server.port)


async def test_plain_string_api_keys_are_refused_by_this_server() -> None:
    # sepp 0.1.1 only takes named entries: api_keys = [{ name = ..., key = ... }].
    with trio.fail_after(60), pytest.raises(SeppServerStartError) as info:
        async with sepp_server({"auth": {"api_keys": ["plain-key"]}}, check_config=False):
            pass  # pragma: no cover
    assert "api_keys" in str(info.value) and info.value.returncode == 1


async def test_a_config_key_of_the_wrong_type_is_named_before_the_server_starts() -> None:
    config = {"limits": {"max_enqueue_batch": "10"}}
    # The server alone exits with a raw deserialiser dump that names neither key nor type.
    with trio.fail_after(60), pytest.raises(SeppServerStartError) as raw:
        async with sepp_server(config, check_config=False):
            pass  # pragma: no cover
    assert raw.value.returncode == 1
    with pytest.raises(SeppServerStartError) as info:
        async with sepp_server(config):
            pass  # pragma: no cover
    assert str(info.value).startswith(
        "config key 'limits.max_enqueue_batch' must be an integer from 0 to 4294967295, got '10'"
    )
    assert info.value.returncode is None and info.value.output_lines == []


async def test_a_misspelled_config_key_is_named_instead_of_ignored() -> None:
    config = {"limits": {"max_enqueue_batches": 10}}
    # The server alone starts and keeps the default: the misspelling would go unnoticed.
    with trio.fail_after(60):
        async with sepp_server(config, check_config=False) as server:
            assert alive(server)
    with pytest.raises(
        SeppServerStartError, match=r"unknown config key 'limits\.max_enqueue_batches'"
    ):
        async with sepp_server(config):
            pass  # pragma: no cover


def test_the_config_check_knows_every_key_of_the_servers_example_config() -> None:
    # `sepp config example` lists every key, the optional ones commented out.
    example = subprocess.run(
        [find_sepp_binary(), "config", "example"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    section = ""
    listed: set[str] = set()
    for line in example.splitlines():
        header = re.fullmatch(r"#?\[\[?(\w+)\]\]?\s*", line)
        if header:
            section = header.group(1)
        entry = re.match(r"#?(\w+) = ", line)
        if entry and section:
            listed.add(f"{section}.{entry.group(1)}")
    known = {
        f"{name}.{key}"
        for name, table in SCHEMA.items()
        for key in (table.keys if isinstance(table, TableList) else table)
    }
    assert len(listed) > 50
    # The example shows queue entries with a few of their keys, and leaves out
    # limits.max_queue_depth (absent means unlimited); every other key must match.
    assert listed - known == set()
    unlisted = {key for key in known - listed if not key.startswith("queues.")}
    assert unlisted == {"limits.max_queue_depth"}


async def test_invalid_config_reports_server_output() -> None:
    with trio.fail_after(60), pytest.raises(SeppServerStartError) as info:
        async with sepp_server({"limits": {"default_priority": 42}}):
            pass  # pragma: no cover
    message = str(info.value)
    assert "exited with status 1" in message
    assert "default_priority" in message
    assert info.value.returncode == 1
    assert any("default_priority" in line for line in info.value.output_lines)


async def test_hot_reload_of_config() -> None:
    with trio.fail_after(60):
        async with sepp_server(FAST) as server:
            mark = server.output_line_count
            server.update_config({**FAST, "limits": {"max_wait_timeout_ms": 1234}})
            assert "max_wait_timeout_ms = 1234" in server.config_path.read_text()
            await server.wait_for_output("configuration reloaded", after=mark)

            mark = server.output_line_count
            server.update_config({"limits": {"default_priority": 42}})
            line = await server.wait_for_output("config reload failed", after=mark)
            assert "default_priority" in line
            assert alive(server)


async def test_caller_env_and_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "my-data"
    with trio.fail_after(60):
        async with sepp_server(FAST, data_dir=data_dir, env={"RUST_LOG": "sepp=debug"}) as server:
            assert server.data_dir == data_dir.resolve()
            assert any("configuration loaded" in line for line in server.output_lines)
    assert data_dir.is_dir()  # a caller-owned data dir is left in place


async def test_inherited_config_overrides_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEPP_LIMITS__DEFAULT_PRIORITY", "42")
    monkeypatch.setenv("SEPP_CONFIG", "/nonexistent/sepp.toml")
    with trio.fail_after(60):
        async with sepp_server(FAST) as server:
            assert alive(server)


async def test_body_exception_is_not_wrapped() -> None:
    with trio.fail_after(60), pytest.raises(KeyError):
        async with sepp_server(FAST) as server:
            raise KeyError("boom")
    assert not alive(server)


async def test_dead_letters_are_kept_10_minutes_unless_the_config_says_otherwise() -> None:
    # One default for sepp_server() and its fixture: a test of dead letters can drain them.
    with trio.fail_after(60):
        async with sepp_server() as server, sepp.open(server.address) as client:
            assert server.config["storage"] == {"dead_letter_retention_ms": 600_000}
            assert (await client.get_server_info()).dead_letter_retention_enabled
            await client.enqueue("q", "t", max_attempts=1)
            (job,) = await client.reserve("q") or []
            assert await client.nack(job.ctx, reason="gone")  # dead-lettered, and kept:
            (record,) = await client.drain_dead_letters("q")
            assert record.last_reason == "gone"
            server.update_config({"limits": {"max_enqueue_batch": 10}})  # the default stays
            assert server.config["storage"] == {"dead_letter_retention_ms": 600_000}
        none = {"storage": {"dead_letter_retention_ms": 0, "persist_mode": "buffer"}}
        async with sepp_server(none) as server, sepp.open(server.address) as client:
            assert server.config == none  # a config's own value wins, 0 included
            assert not (await client.get_server_info()).dead_letter_retention_enabled


async def test_cancellation_stops_the_server() -> None:
    with trio.fail_after(60):
        with trio.CancelScope() as scope:
            async with sepp_server(FAST) as server:
                scope.cancel()  # once the server is up, however long it took to start
                await trio.sleep_forever()
        assert scope.cancelled_caught
    assert not alive(server)


async def test_missing_binary_raises_not_found(tmp_path: Path) -> None:
    with pytest.raises(SeppServerNotFound) as info:
        async with sepp_server(binary=str(tmp_path / "no-such-sepp")):
            pass  # pragma: no cover
    message = str(info.value)
    assert INSTALL_HINT in message
    assert "SEPP_BIN" in message
    assert "no-such-sepp" in message


def write_script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_binary_that_exits_raises_start_error(tmp_path: Path) -> None:
    fake = write_script(tmp_path / "fake-sepp", "echo 'not a sepp server'\necho oops >&2\nexit 3\n")
    with trio.fail_after(30), pytest.raises(SeppServerStartError) as info:
        async with sepp_server(binary=fake):
            pass  # pragma: no cover
    message = str(info.value)
    assert "exited with status 3" in message
    assert "not a sepp server" in message
    assert "oops" in message
    assert info.value.returncode == 3


async def test_binary_that_never_listens_times_out(tmp_path: Path) -> None:
    fake = write_script(tmp_path / "silent-sepp", "echo starting\nexec sleep 60\n")
    with trio.fail_after(30), pytest.raises(SeppServerStartError) as info:
        async with sepp_server(binary=fake, startup_timeout=1):
            pass  # pragma: no cover
    message = str(info.value)
    assert "queue server listening" in message
    assert "starting" in message


async def test_json_log_format() -> None:
    config = {**FAST, "logging": {"format": "json"}}
    with trio.fail_after(60):
        async with sepp_server(config) as server:
            [line] = listening_lines(server)
            assert f'"addr":"{server.address}"' in line
            assert tcp_connects(server.port)


def not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """What find_sepp_binary() says with no SEPP_BIN, an empty cache and an empty PATH."""
    monkeypatch.delenv("SEPP_BIN", raising=False)
    monkeypatch.setenv("SEPP_TRIO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    with pytest.raises(SeppServerNotFound) as info:
        find_sepp_binary()
    return str(info.value)


def test_find_sepp_binary_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = not_found(tmp_path, monkeypatch)
    assert INSTALL_HINT in message
    assert "SEPP_BIN" in message

    on_path = tmp_path / "empty-path" / "sepp"
    on_path.parent.mkdir()
    write_script(on_path, "exit 0\n")
    assert find_sepp_binary() == str(on_path)

    cached = tmp_path / "cache" / f"sepp-{SEPP_SERVER_VERSION}" / "bin" / "sepp"
    cached.parent.mkdir(parents=True)
    write_script(cached, "exit 0\n")
    assert find_sepp_binary() == str(cached)

    explicit = write_script(tmp_path / "explicit-sepp", "exit 0\n")
    monkeypatch.setenv("SEPP_BIN", explicit)
    assert find_sepp_binary() == explicit

    monkeypatch.setenv("SEPP_BIN", str(tmp_path / "wrong"))
    with pytest.raises(SeppServerNotFound, match="SEPP_BIN"):
        find_sepp_binary()


# SeppServerNotFound says what a pip user can do (cargo, SEPP_BIN), and names the repository's
# own script only where it exists: in a source checkout, never from a wheel.


def test_the_advice_is_cargo_and_sepp_bin_and_the_script_only_in_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_checkout = not_found(tmp_path, monkeypatch)  # these tests run from the repository
    root = tmp_path / "cache" / "sepp-0.1.1"
    assert f"{INSTALL_HINT} --root {root}" in in_checkout
    assert "SEPP_BIN=/path/to/sepp" in in_checkout
    script = Path(__file__).resolve().parents[2] / "scripts" / "ensure-sepp-server.sh"
    assert f"in this checkout, run {script}" in in_checkout

    monkeypatch.setattr(_binary, "_repository_script", lambda: None)  # as from a wheel
    installed = not_found(tmp_path, monkeypatch)
    assert "ensure-sepp-server" not in installed and "scripts/" not in installed
    assert f"{INSTALL_HINT} --root {root}" in installed and "SEPP_BIN=" in installed


def test_the_script_is_looked_for_beside_the_source_tree_only(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout" / "src" / "sepp" / "testing" / "_binary.py"
    wheel = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "sepp" / "testing"
    script = tmp_path / "checkout" / "scripts" / "ensure-sepp-server.sh"
    script.parent.mkdir(parents=True)
    assert _binary._repository_script(str(checkout)) is None  # no script yet
    script.write_text("#!/bin/sh\n")
    assert _binary._repository_script(str(checkout)) == script.resolve()
    assert _binary._repository_script(str(wheel / "_binary.py")) is None


async def test_external_server_object() -> None:
    external = ExternalSeppServer("127.0.0.1:50051")
    assert (external.host, external.port, external.address) == (
        "127.0.0.1",
        50051,
        "127.0.0.1:50051",
    )
    assert ExternalSeppServer("[::1]:7").host == "::1"
    for call in (external.start(), external.stop(), external.restart()):
        with pytest.raises(NotImplementedError, match="SEPP_TEST_ADDR"):
            await call
    with pytest.raises(NotImplementedError):
        external.update_config({})


PLUGIN_TESTS = """
    import trio
    from sepp.testing import ExternalSeppServer, SeppServer

    async def test_fixture(sepp_server):
        assert isinstance(sepp_server, SeppServer)
        assert sepp_server.running
        line = next(l for l in sepp_server.output_lines if "queue server listening" in l)
        assert "addr=" + sepp_server.address in line
        assert "persist_mode = \\"buffer\\"" in sepp_server.config_path.read_text()
        assert "dead_letter_retention_ms = 600000" in sepp_server.config_path.read_text()
        stream = await trio.open_tcp_stream(sepp_server.host, sepp_server.port)
        await stream.aclose()
        await sepp_server.restart()
        assert sepp_server.running
"""

EXTERNAL_TESTS = """
    import pytest
    from sepp.testing import ExternalSeppServer

    async def test_fixture(sepp_server):
        assert isinstance(sepp_server, ExternalSeppServer)
        assert sepp_server.address == "127.0.0.1:65000"
        with pytest.raises(NotImplementedError):
            await sepp_server.stop()
"""


@pytest.fixture(scope="module")
def real_sepp_binary() -> str:
    # Module-scoped so it is resolved before pytester points HOME at a temp dir
    # (which would hide the default binary cache).
    return find_sepp_binary()


def use_this_checkout(monkeypatch: pytest.MonkeyPatch, binary: str) -> None:
    """Let the pytester subprocess import the same ``sepp`` package and binary as this run."""
    import sepp.testing

    src = str(Path(sepp.testing.__file__).resolve().parents[2])
    paths = [src, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.setenv("SEPP_BIN", binary)


def test_pytest_plugin_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, real_sepp_binary: str
) -> None:
    use_this_checkout(monkeypatch, real_sepp_binary)
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_plugin=textwrap.dedent(PLUGIN_TESTS))
    result = pytester.runpytest_subprocess("-p", "sepp.testing.pytest_plugin", "-q")
    result.assert_outcomes(passed=1)


def test_pytest_plugin_honours_sepp_test_addr(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, real_sepp_binary: str
) -> None:
    use_this_checkout(monkeypatch, real_sepp_binary)
    monkeypatch.setenv("SEPP_TEST_ADDR", "127.0.0.1:65000")
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_external=textwrap.dedent(EXTERNAL_TESTS))
    result = pytester.runpytest_subprocess("-p", "sepp.testing.pytest_plugin", "-q")
    result.assert_outcomes(passed=1)


def test_ensure_script_prints_the_binary() -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "ensure-sepp-server.sh"
    env = dict(os.environ)
    env["SEPP_BIN"] = find_sepp_binary()
    result = subprocess.run(
        [str(script)], capture_output=True, text=True, env=env, check=True, timeout=60
    )
    assert result.stdout.strip().splitlines()[-1] == env["SEPP_BIN"]
