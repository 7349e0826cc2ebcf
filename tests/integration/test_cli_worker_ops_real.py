"""`sepp-trio worker` as operations see it, run as a subprocess against the real server: it
waits for the server, answers its health and readiness probes and serves Prometheus metrics
over HTTP, and logs one JSON object per line."""

from __future__ import annotations

import json
import re
import signal
import socket
import textwrap
from pathlib import Path

import pytest
import trio

import sepp
from sepp.testing import SeppServer
from tests.integration.test_cli_real import Running, spawn

OPS_APP = textwrap.dedent(
    """
    import sepp

    router = sepp.Router()

    @router.handler("ok")
    async def ok(payload, ctx):
        pass

    @router.handler("boom", backoff=sepp.Backoff(0.01, max=0.01))
    async def boom(payload, ctx):
        raise ValueError("boom")
    """
)


@pytest.fixture
def ops_dir(tmp_path: Path) -> Path:
    (tmp_path / "ops_app.py").write_text(OPS_APP)
    return tmp_path


async def http_get(port: int, path: str) -> tuple[int, str]:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: worker\r\n\r\n".encode())
            answer = b""
            async for chunk in stream:
                answer += chunk
    head, _, body = answer.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def served_port(running: Running, what: str) -> int:
    await running.wait_for(f"serving {what} on 127.0.0.1:")
    match = re.search(rf"serving {re.escape(what)} on 127\.0\.0\.1:(\d+)", running.text("stderr"))
    assert match, running.out
    return int(match.group(1))


async def eventually(port: int, path: str, fragment: str) -> str:
    """The body of `path` once it contains `fragment` (polled; the worker updates it)."""
    with trio.fail_after(30):
        while True:
            _, body = await http_get(port, path)
            if fragment in body:
                return body
            await trio.sleep(0.05)


def metric(body: str, line_start: str) -> float:
    for line in body.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {line_start} in {body}")


async def test_worker_waits_for_the_server_and_serves_probes_metrics_and_json_logs(
    sepp_server: SeppServer, ops_dir: Path
) -> None:
    await sepp_server.stop()  # started alongside the server, before it is up
    args = (
        *("--log-format", "json"),
        *("worker", "ops_app:router", "--queue", "work"),
        *("--health-port", "0", "--metrics-port", "0", "--http-host", "127.0.0.1"),
    )
    async with spawn(sepp_server.address, *args, cwd=ops_dir) as running:
        health = await served_port(running, "/healthz /readyz")
        metrics = await served_port(running, "/metrics")
        assert health != metrics
        await running.wait_for("server not reachable yet")
        # The status, then the event loop's lag (measured by the probes' heartbeat).
        lag = r"\nevent loop lag: \d+\.\d{3}s\n"
        status, body = await http_get(health, "/healthz")
        assert status == 200 and re.fullmatch("ok: waiting for the server" + lag, body), body
        status, body = await http_get(health, "/readyz")
        assert status == 503 and re.fullmatch("not ready: waiting for the server" + lag, body)
        assert (await http_get(health, "/metrics"))[0] == 404  # on its own port

        await sepp_server.start()
        await running.wait_for("reserving from work")
        status, body = await http_get(health, "/readyz")
        assert status == 200 and re.fullmatch("ok: reserving" + lag, body), body
        async with sepp.open(sepp_server.address) as client:
            oks = [(await client.enqueue("work", "ok")).job_id for _ in range(3)]
            doomed = await client.enqueue("work", "boom", max_attempts=2)
            label = '{queue="work",job_type="boom"}'
            body = await eventually(
                metrics, "/metrics", f"sepp_worker_jobs_dead_lettered_total{label} 1"
            )
        ok = '{queue="work",job_type="ok"}'
        assert metric(body, f"sepp_worker_jobs_started_total{ok}") == 3
        assert metric(body, f"sepp_worker_jobs_succeeded_total{ok}") == 3
        assert metric(body, f"sepp_worker_jobs_failed_total{label}") == 2
        assert metric(body, f"sepp_worker_jobs_retried_total{label}") == 1
        assert metric(body, f"sepp_worker_job_duration_seconds_count{ok}") == 3
        assert metric(body, "sepp_worker_jobs_in_flight") == 0
        assert metric(body, 'sepp_worker_reserves_total{result="ok"}') >= 1
        assert metric(body, "sepp_worker_ready") == 1

        running.send(signal.SIGTERM)
        status = await running.wait(timeout_s=20)
    assert status == 0, running.out

    records = [json.loads(line) for line in running.text("stderr").splitlines()]
    finished = {r["job_id"]: r for r in records if " finished: " in r["message"]}
    for job_id in oks:
        record = finished[job_id]
        assert record["level"] == "INFO" and record["logger"] == "sepp.worker"
        assert (record["job_type"], record["queue"], record["attempt"]) == ("ok", "work", 1)
        assert record["outcome"] == "ack" and record["duration_s"] >= 0
        assert record["wait_s"] >= 0 and ", waited " in record["message"]
    last = finished[doomed.job_id]
    assert last["attempt"] == 2 and last["outcome"] == "error, dead-lettered"
    dead = [r for r in records if "dead-lettered:" in r["message"]]
    assert dead and dead[0]["level"] == "ERROR" and dead[0]["job_id"] == doomed.job_id
    assert "ValueError: boom" in dead[0]["exception"]


async def test_one_port_serves_probes_and_metrics_and_a_log_config_file_is_used(
    sepp_server: SeppServer, ops_dir: Path
) -> None:
    (ops_dir / "logging.json").write_text(
        json.dumps(
            {
                "version": 1,
                "formatters": {"plain": {"format": "CONFIGURED %(levelname)s %(message)s"}},
                "handlers": {
                    "err": {
                        "class": "logging.StreamHandler",
                        "formatter": "plain",
                        "stream": "ext://sys.stderr",
                    }
                },
                "root": {"level": "INFO", "handlers": ["err"]},
            }
        )
    )
    with socket.socket() as probe:  # a free port, named twice
        probe.bind(("127.0.0.1", 0))
        free = str(probe.getsockname()[1])
    args = (
        *("--log-config", "logging.json"),
        *("worker", "ops_app:router", "--queue", "work", "--http-host", "127.0.0.1"),
        *("--health-port", free, "--metrics-port", free),
    )
    async with spawn(sepp_server.address, *args, cwd=ops_dir) as running:
        port = await served_port(running, "/healthz /readyz /metrics")
        assert port == int(free)
        await running.wait_for("CONFIGURED INFO worker")
        assert (await http_get(port, "/readyz"))[0] == 200
        assert (await http_get(port, "/metrics"))[0] == 200
        running.send(signal.SIGTERM)
        assert await running.wait(timeout_s=20) == 0
    assert all(line.startswith("CONFIGURED ") for line in running.text("stderr").splitlines())


async def test_worker_burst_works_the_queue_then_exits_0(
    sepp_server: SeppServer, ops_dir: Path
) -> None:
    from tests.integration.test_cli_real import cli

    async with sepp.open(sepp_server.address) as client:
        for _ in range(5):
            await client.enqueue(sepp.EnqueueRequest("burst", "ok"))
    done = await cli(
        sepp_server.address, "worker", "ops_app:router", "--queue", "burst", "--burst", cwd=ops_dir
    )
    assert done.returncode == 0, done
    assert done.stderr.count("finished: ack") == 5, done.stderr
    async with sepp.open(sepp_server.address) as client:
        assert await client.reserve("burst", lease_duration=1, wait_timeout=0) is None
    refused = await cli(
        sepp_server.address, "worker", "ops_app:router", "--queue", "burst", "--burst",
        "--processes", "2", cwd=ops_dir,
    )  # fmt: skip
    assert refused.returncode == 2 and "--burst" in refused.stderr, refused
