"""Per-call CPU floor of sepp-trio's layers, without sockets, server or scheduling noise.

    python -m benchmarks.micro [--calls 20000] [--experiment PATCHES]
    python -m benchmarks.micro --compare no_frame_repr hpack_cache all [--repeats 5]

Two measurements, each in µs of CPU per call (``time.process_time``):

- **wire**: each sans-IO engine (``codec``, our HTTP/2 codec, the default; ``h2``, the
  reference on h2 + hpack + hyperframe) for a unary call, client side only: ``start_call`` +
  ``data_to_send``, then ``receive_data`` of the server's HEADERS + DATA + trailers. An
  in-memory h2 server answers with response bytes recorded from a real sepp server. Calls go
  in groups of 1 and of 64 concurrent streams.
- **api**: ``Client.enqueue`` / ``Client.ack`` / ``Client.reserve`` (64 jobs, per job) over a
  fake channel that returns the recorded response at once: validation, protobuf, conversion,
  retry wrapper, tracing no-ops; no I/O and no task switch.

What neither covers (trio's task switches, the reader/writer tasks, socket syscalls) is the rest
of the harness's CPU per operation. ``--compare`` runs the baseline and each
benchmarks/experiments.py patch set in fresh interpreters, alternating, and prints medians.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class _BlockOtel:
    """A meta-path finder that makes ``opentelemetry`` unimportable."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)")
        return None


def _record_responses() -> dict[str, bytes]:
    """Real response bodies from a throw-away sepp server (one per method we replay)."""
    import trio

    import sepp
    import sepp.testing

    recorded: dict[str, bytes] = {}

    async def main() -> None:
        config = {"admin": {"enabled": False}, "storage": {"persist_mode": "buffer"}}
        async with sepp.testing.sepp_server(config) as server:
            async with sepp.open(server.address) as client:
                channel = client._channel
                real_call = channel.call

                async def recording_call(method: str, request: bytes, **kw: Any) -> bytes:
                    body = await real_call(method, request, **kw)
                    recorded[method] = body
                    return body

                channel.call = recording_call  # type: ignore[method-assign]
                payload = sepp.Payload(b"x" * 256, "application/octet-stream")
                await client.get_server_info()
                await client.enqueue_batch(
                    [sepp.EnqueueRequest("micro", "bench", payload=payload) for _ in range(64)]
                )
                jobs = await client.reserve(["micro"], wait_timeout=2, max_jobs=64)
                assert jobs is not None and len(jobs) == 64, jobs
                reserve_body = recorded["Reserve"]
                await client.ack(jobs[0].ctx)
                await client.enqueue("micro", "bench", payload=payload)
                recorded["Reserve"] = reserve_body

    trio.run(main)
    return recorded


def _wire(
    calls: int, concurrency: int, recorded: dict[str, bytes], engine: str
) -> dict[str, float]:
    import h2.config
    import h2.connection
    import h2.events

    from sepp._pb import queue_pb2 as pb
    from sepp.wire._engine import connection_class
    from sepp.wire._framing import encode_message

    client = connection_class(engine)(  # type: ignore[arg-type]
        authority="127.0.0.1:50051", user_agent="sepp-trio/micro"
    )
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_inbound_headers=False,
            validate_outbound_headers=False,
            normalize_inbound_headers=False,
            normalize_outbound_headers=False,
        )
    )
    server.initiate_connection()
    client.initiate()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())

    request = pb.EnqueueBatchRequest(
        jobs=[pb.EnqueueRequest(queue="micro", job_type="bench")]
    ).SerializeToString()
    response = encode_message(recorded["EnqueueBatch"])
    resp_headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    trailers = [(b"grpc-status", b"0")]
    t_send = t_recv = 0.0
    done = 0
    i = 0
    while done < calls:
        k = min(concurrency, calls - done)
        c0 = time.process_time()
        for _ in range(k):
            i += 1
            client.start_call("EnqueueBatch", request, timeout=30.0 - (i % 997) * 1e-3)
        out = client.data_to_send()
        c1 = time.process_time()
        t_send += c1 - c0
        for ev in server.receive_data(out):
            if isinstance(ev, h2.events.DataReceived) and ev.flow_controlled_length:
                server.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                server.send_headers(ev.stream_id, resp_headers)
                server.send_data(ev.stream_id, response)
                server.send_headers(ev.stream_id, trailers, end_stream=True)
        back = server.data_to_send()
        c0 = time.process_time()
        events = client.receive_data(back)
        extra = client.data_to_send()
        c1 = time.process_time()
        t_recv += c1 - c0
        finished = sum(1 for e in events if type(e).__name__ == "CallFinished")
        if finished != k:
            raise RuntimeError(f"expected {k} finished calls, got {finished}")
        if extra:
            server.receive_data(extra)
        done += k
    return {
        "send_us": t_send / calls * 1e6,
        "receive_us": t_recv / calls * 1e6,
        "total_us": (t_send + t_recv) / calls * 1e6,
    }


def _wire_floor(calls: int, concurrency: int, recorded: dict[str, bytes]) -> dict[str, float]:
    """The same exchange with a minimal unary-only HTTP/2 client instead of h2: a constant
    per-method header block (no HPACK dynamic table on our side, no Huffman), frames packed
    with struct, responses split with struct and only the header blocks fed to hpack's
    decoder. Not a client (no flow control, SETTINGS or errors): an estimate of the floor."""
    import struct

    import h2.config
    import h2.connection
    import h2.events
    import hpack

    from sepp.wire._framing import encode_message
    from sepp.wire._status import encode_grpc_timeout

    frame = struct.Struct(">HBBBI")  # 24-bit length as 16+8 bits, type, flags, stream id

    def pack_frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
        n = len(payload)
        return frame.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload

    def literal(name: bytes, value: bytes) -> bytes:
        # Literal header field without indexing, new name (RFC 7541 6.2.2), no Huffman.
        assert len(name) < 127 and len(value) < 127
        return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value

    enc = hpack.Encoder()
    enc.header_table_size = 0  # what a table-less encoder would announce
    static_part = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/sepp.v1.QueueService/EnqueueBatch"),
        (b":authority", b"127.0.0.1:50051"),
        (b"te", b"trailers"),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"sepp-trio/micro"),
    ]
    block = enc.encode(static_part, huffman=False)  # table size 0: nothing gets indexed
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_inbound_headers=False,
            validate_outbound_headers=False,
            normalize_inbound_headers=False,
            normalize_outbound_headers=False,
        )
    )
    server.initiate_connection()
    settings = struct.pack(">HI", 0x4, 1 << 30)  # INITIAL_WINDOW_SIZE: 1 GiB per stream
    window = pack_frame(8, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65535))  # connection window
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + pack_frame(4, 0, 0, settings) + window
    server.receive_data(preface)
    server.data_to_send()
    server.receive_data(pack_frame(4, 1, 0, b""))  # ack the server's SETTINGS
    decoder = hpack.Decoder()
    request = encode_message(b"\x0a\x03abc")
    response = encode_message(recorded["EnqueueBatch"])
    t_send = t_recv = 0.0
    done, stream_id, i = 0, 1, 0
    unpack = frame.unpack_from
    while done < calls:
        k = min(concurrency, calls - done)
        c0 = time.process_time()
        parts = []
        for _ in range(k):
            i += 1
            timeout = encode_grpc_timeout(30.0 - (i % 997) * 1e-3)
            parts.append(pack_frame(1, 4, stream_id, block + literal(b"grpc-timeout", timeout)))
            parts.append(pack_frame(0, 1, stream_id, request))
            stream_id += 2
        out = b"".join(parts)
        c1 = time.process_time()
        t_send += c1 - c0
        for ev in server.receive_data(out):
            if isinstance(ev, h2.events.DataReceived) and ev.flow_controlled_length:
                server.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                server.send_headers(
                    ev.stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")]
                )
                server.send_data(ev.stream_id, response)
                server.send_headers(ev.stream_id, [(b"grpc-status", b"0")], end_stream=True)
        back = server.data_to_send()
        c0 = time.process_time()
        pos, finished, view = 0, 0, memoryview(back)
        bodies: dict[int, bytes] = {}
        while pos + 9 <= len(back):
            hi, lo, kind, flags, sid = unpack(back, pos)
            n = (hi << 8) | lo
            payload = view[pos + 9 : pos + 9 + n]
            pos += 9 + n
            if kind == 1:  # HEADERS (the server sends no PADDED/PRIORITY flags here)
                headers = decoder.decode(bytes(payload), raw=True)
                if flags & 1:
                    status = next(v for k_, v in headers if k_ == b"grpc-status")
                    if status == b"0" and sid in bodies:
                        finished += 1
            elif kind == 0:  # DATA
                bodies[sid] = bytes(payload[5:])
        c1 = time.process_time()
        t_recv += c1 - c0
        if finished != k:
            raise RuntimeError(f"floor: expected {k} finished calls, got {finished}")
        done += k
    return {
        "send_us": t_send / calls * 1e6,
        "receive_us": t_recv / calls * 1e6,
        "total_us": (t_send + t_recv) / calls * 1e6,
    }


def _api(calls: int, recorded: dict[str, bytes]) -> dict[str, float]:
    import trio

    import sepp
    from sepp._client.client import Client
    from sepp._client.retry import NO_RETRY
    from sepp._runtime.trio_runtime import TRIO
    from sepp._util.log import Log

    class FakeChannel:
        async def call(self, method: str, request: bytes, **kw: Any) -> bytes:
            return recorded[method]

    out: dict[str, float] = {}

    async def main() -> None:
        client = Client(
            FakeChannel(),  # type: ignore[arg-type]
            address="micro",
            rpc_timeout=30.0,
            retry_policy=NO_RETRY,
            log=Log(None),
            runtime=TRIO,
        )
        payload = sepp.Payload(b"x" * 256, "application/octet-stream")
        await client.enqueue("micro", "bench", payload=payload)  # fetches the limits once
        c0 = time.process_time()
        for _ in range(calls):
            await client.enqueue("micro", "bench", payload=payload)
        out["enqueue_us"] = (time.process_time() - c0) / calls * 1e6
        jobs = await client.reserve(["micro"], max_jobs=64)
        assert jobs
        ctx = jobs[0].ctx
        c0 = time.process_time()
        for _ in range(calls):
            await client.ack(ctx)
        out["ack_us"] = (time.process_time() - c0) / calls * 1e6
        rounds = max(1, calls // 64)
        c0 = time.process_time()
        for _ in range(rounds):
            await client.reserve(["micro"], max_jobs=64)
        out["reserve_per_job_us"] = (time.process_time() - c0) / (rounds * 64) * 1e6

    trio.run(main)
    return out


def measure(calls: int, experiment: str | None, otel: bool) -> dict[str, Any]:
    if not otel:
        sys.meta_path.insert(0, _BlockOtel())
    if experiment:
        from . import experiments

        experiments.apply(experiment)
    if str(REPO / "src") not in sys.path:
        sys.path.insert(0, str(REPO / "src"))
    recorded = _record_responses()
    return {
        "codec_1": _wire(calls // 4, 1, recorded, "codec"),
        "codec_64": _wire(calls, 64, recorded, "codec"),
        "h2_1": _wire(calls // 4, 1, recorded, "h2"),
        "h2_64": _wire(calls, 64, recorded, "h2"),
        "floor_64": _wire_floor(calls, 64, recorded),
        "api": _api(calls, recorded),
    }


def _flatten(result: dict[str, Any]) -> dict[str, float]:
    return {f"{k}.{kk}": vv for k, v in result.items() for kk, vv in v.items()}


def compare(variants: list[str], repeats: int, calls: int, otel: bool) -> None:
    names = ["baseline", *variants]
    samples: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            argv = [sys.executable, "-m", "benchmarks.micro", "--json", "--calls", str(calls)]
            if name != "baseline":
                argv += ["--experiment", name]
            if otel:
                argv.append("--otel")
            proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
            samples[name].append(_flatten(json.loads(proc.stdout.strip().splitlines()[-1])))
            print(f"  repeat {r + 1}/{repeats}: {name} done", file=sys.stderr, flush=True)
    keys = list(samples["baseline"][0])
    width = max(len(n) for n in names)
    print(f"CPU µs per call, best of {repeats} fresh interpreters (lower is better)\n")
    print(f"{'':{width}}  " + "  ".join(f"{k:>22}" for k in keys))
    # The minimum: the run least disturbed by other work on a shared machine.
    base = {k: min(s[k] for s in samples["baseline"]) for k in keys}
    for name in names:
        med = {k: min(s[k] for s in samples[name]) for k in keys}
        cells = []
        for k in keys:
            delta = "" if name == "baseline" else f" ({(med[k] / base[k] - 1) * 100:+.0f}%)"
            cells.append(f"{med[k]:>14.1f}{delta:>8}")
        print(f"{name:{width}}  " + "  ".join(cells))


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro", description=__doc__)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--experiment", default=None, help="benchmarks/experiments.py patches")
    p.add_argument(
        "--compare", nargs="+", default=None, metavar="PATCHES", help="patch sets to A/B"
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--otel", action="store_true", help="let sepp-trio import opentelemetry")
    p.add_argument("--json", action="store_true", help="print one JSON line (for --compare)")
    a = p.parse_args()
    if a.compare:
        compare(a.compare, a.repeats, a.calls, a.otel)
        return 0
    result = measure(a.calls, a.experiment, a.otel)
    if a.json:
        print(json.dumps(result))
    else:
        for section, values in result.items():
            print(section, {k: round(v, 1) for k, v in values.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
