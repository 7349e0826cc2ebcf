"""`worker --processes N`: the flag, the supervisor's words for a child's end, and the merge of
the children's metrics into one exposition (what Prometheus parses)."""

from __future__ import annotations

import argparse
import functools
import http.client
import os
import signal
from dataclasses import dataclass, field

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from sepp._cli._parser import build_parser
from sepp._cli._worker_command import usable_cpus
from sepp._cli.fleet.group_http import GroupProbes, serve_group
from sepp._cli.fleet.messages import HEALTH_PATH, Ports, encode
from sepp._cli.fleet.supervisor import child_arguments, describe_exit
from sepp._probes import prometheus
from sepp._probes.http1 import TEXT
from sepp._worker.monitor import Health, WorkerMonitor, feed_of


def parse(*extra: str) -> object:
    return build_parser().parse_args(["worker", "app:router", "--queue", "q", *extra])


def test_processes_defaults_to_one_and_auto_is_the_usable_cpus() -> None:
    assert parse().processes == 1  # type: ignore[attr-defined]
    assert parse("--processes", "3").processes == 3  # type: ignore[attr-defined]
    assert parse("--processes", "auto").processes == usable_cpus()  # type: ignore[attr-defined]
    if hasattr(os, "sched_getaffinity"):  # Linux
        assert usable_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", ""])
def test_processes_refuses_what_is_not_a_count(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse("--processes", bad)
    assert f"--processes: not a positive number or auto: {bad!r}" in capsys.readouterr().err


def test_children_serve_on_free_loopback_ports_only_what_the_group_serves() -> None:
    args = parse("--processes", "2", "--metrics-port", "9100", "--http-host", "0.0.0.0")
    child = child_arguments(args)  # type: ignore[arg-type]
    assert (child.processes, child.health_port, child.metrics_port) == (1, None, 0)
    assert child.http_host == "127.0.0.1"
    assert args.metrics_port == 9100 and args.processes == 2  # type: ignore[attr-defined]


def test_a_childs_end_in_words() -> None:
    assert describe_exit(0) == "exited with status 0"
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(-signal.SIGSEGV) == "was killed by SIGSEGV"
    assert describe_exit(None) == "is still running"


def merge_metrics(texts: dict[int, str]) -> list[str]:
    """The lines the group's /metrics has of its children's (before its own families)."""
    texts_by_label = {str(index): text for index, text in sorted(texts.items())}
    return prometheus.write(prometheus.merge(texts_by_label, "process")).splitlines()


def test_a_sample_gets_the_process_label_first() -> None:
    text = 'm{a="b"} 1\nm 2.5\nm{} 1\nm{a="x {y} z"} 1\n'
    assert merge_metrics({0: text})[:4] == [
        'm{process="0",a="b"} 1',
        'm{process="0"} 2.5',
        'm{process="0"} 1',
        # A label value may hold spaces and braces.
        'm{process="0",a="x {y} z"} 1',
    ]


def test_the_childrens_families_are_merged_one_family_each() -> None:
    monitor = WorkerMonitor()
    feed_of(monitor).reserve_done(0.002, None)
    text = monitor.prometheus_text()
    merged = merge_metrics({0: text, 1: text})
    helps = [line for line in merged if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps)) == text.count("# HELP ")
    # Each family's samples follow its HELP and TYPE, from both children.
    start = merged.index("# TYPE sepp_worker_reserves_total counter")
    assert merged[start + 1 : start + 5] == [
        'sepp_worker_reserves_total{process="0",result="ok"} 1',
        'sepp_worker_reserves_total{process="0",result="error"} 0',
        'sepp_worker_reserves_total{process="1",result="ok"} 1',
        'sepp_worker_reserves_total{process="1",result="error"} 0',
    ]
    bucket = 'sepp_worker_reserve_duration_seconds_bucket{process="1",le="0.005"} 1'
    assert bucket in merged
    assert merge_metrics({}) == []


@given(st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True))
def test_every_sample_of_every_child_is_kept_once(indexes: list[int]) -> None:
    text = WorkerMonitor().prometheus_text()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    merged = merge_metrics(dict.fromkeys(indexes, text))
    merged_samples = [line for line in merged if not line.startswith("#")]
    assert len(merged_samples) == len(samples) * len(indexes)
    for index in indexes:
        assert sum(f'{{process="{index}"' in line for line in merged_samples) == len(samples)


@dataclass
class FakeChild:
    index: int
    pid: int | None
    ports: Ports = field(default_factory=Ports)
    running: bool = True
    state: str = "starting"
    restarts: int = 0

    @property
    def label(self) -> str:
        return f"child {self.index} (pid {self.pid})"


@dataclass
class FakeFleet:
    children: list[FakeChild]
    stopping: bool = False


async def serve_answers(nursery: trio.Nursery, answers: dict[str, bytes]) -> int:
    """A child's probe port: `answers` by path (status line and body), on 127.0.0.1."""

    async def handle(stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += await stream.receive_some(4096)
        path = head.split()[1].decode()
        status, body = answers[path].split(b"\n", 1)
        await stream.send_all(b"HTTP/1.1 " + status + b"\r\nConnection: close\r\n\r\n" + body)
        await stream.aclose()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


def health_answer(health: Health) -> bytes:
    return b"200 OK\n" + encode(health)


async def test_the_group_probes_name_the_child_that_fails_and_a_restart_is_no_liveness_failure(
    nursery: trio.Nursery,
) -> None:
    fine = await serve_answers(
        nursery, {HEALTH_PATH: health_answer(Health(True, True, "reserving", 0.0021))}
    )
    held = (
        "the event loop has not run for 3.200s, over max_loop_lag 1s (a handler holds it?);"
        " reserving"
    )
    stuck = await serve_answers(
        nursery, {HEALTH_PATH: health_answer(Health(False, False, held, 3.2))}
    )
    waiting = await serve_answers(
        nursery, {HEALTH_PATH: health_answer(Health(True, False, "waiting for the server", None))}
    )
    broken = await serve_answers(nursery, {HEALTH_PATH: b"200 OK\nok: reserving\n"})
    zero = FakeChild(0, 11, Ports(health=fine))
    one = FakeChild(1, 12, Ports(health=fine))
    fleet = FakeFleet([zero, one])
    probes = GroupProbes(fleet)
    assert await probes.readyz() == (
        200,
        TEXT,
        b"ok: child 0 (pid 11): reserving (loop lag 0.002s); child 1 (pid 12): reserving (loop"
        b" lag 0.002s)\n",
    )
    one.running, one.state = False, "restarting after pid 12 was killed by SIGKILL"
    assert (await probes.healthz())[0] == 200  # the supervisor is on it
    assert await probes.readyz() == (
        503,
        TEXT,
        b"not ready: child 1: restarting after pid 12 was killed by SIGKILL\n",
    )
    one.running, one.pid, one.ports = True, 13, Ports()
    assert (await probes.readyz())[2] == b"not ready: child 1 (pid 13): starting\n"
    one.ports = Ports(health=stuck)
    assert await probes.healthz() == (
        503,
        TEXT,
        f"not ready: child 1 (pid 13): {held} (loop lag 3.200s)\n".encode(),
    )
    one.ports = Ports(health=waiting)
    assert (await probes.healthz())[0] == 200  # live, not ready
    assert (await probes.readyz())[2] == b"not ready: child 1 (pid 13): waiting for the server\n"
    one.ports = Ports(health=broken)  # no Health: as good as no answer
    assert (await probes.healthz())[2] == b"not ready: child 1 (pid 13): no answer within 2s\n"
    one.ports = Ports(health=fine)
    fleet.stopping = True
    assert (await probes.readyz())[2].startswith(b"not ready: shutting down")


def blocking_get(port: int, path: str) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.headers["Content-Type"], answer.read().decode()
    finally:
        conn.close()


async def test_the_group_serves_its_probes_and_merged_metrics_from_the_probe_server(
    nursery: trio.Nursery,
) -> None:
    child_text = WorkerMonitor().prometheus_text().encode()
    child = await serve_answers(
        nursery,
        {
            HEALTH_PATH: health_answer(Health(True, True, "reserving", None)),
            "/metrics": b"200 OK\n" + child_text,
        },
    )
    fleet = FakeFleet([FakeChild(0, 11, Ports(child, child)), FakeChild(1, 12)])
    fleet.children[1].restarts = 2
    args = argparse.Namespace(health_port=0, metrics_port=0, http_host="127.0.0.1")
    health, metrics = await nursery.start(serve_group, fleet, args)
    # Asked from a thread, as Prometheus would ask: the server's thread hands it to this run.
    status, content_type, body = await trio.to_thread.run_sync(blocking_get, health, "/healthz")
    assert (status, content_type) == (200, TEXT)
    assert body == "ok: child 0 (pid 11): reserving; child 1 (pid 12): starting\n"
    assert (await trio.to_thread.run_sync(blocking_get, health, "/metrics"))[0] == 404
    status, content_type, body = await trio.to_thread.run_sync(blocking_get, metrics, "/metrics")
    assert (status, content_type) == (200, prometheus.CONTENT_TYPE)
    lines = body.splitlines()
    assert 'sepp_worker_ready{process="0"} 0' in lines
    assert not [line for line in lines if 'process="1",' in line]  # it serves no metrics
    assert lines[-8:] == [
        "# HELP sepp_worker_process_up 1 if the worker process answered this scrape.",
        "# TYPE sepp_worker_process_up gauge",
        'sepp_worker_process_up{process="0"} 1',
        'sepp_worker_process_up{process="1"} 0',
        "# HELP sepp_worker_process_restarts_total Worker processes started again after an"
        " unexpected exit.",
        "# TYPE sepp_worker_process_restarts_total counter",
        'sepp_worker_process_restarts_total{process="0"} 0',
        'sepp_worker_process_restarts_total{process="1"} 2',
    ]
