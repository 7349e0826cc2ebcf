"""The kernel's floor under a big enqueue: client CPU to put 1 MiB on a loopback TCP socket.

    python -m benchmarks.loopback_floor [--mib 1000] [--rounds 5]

A child process reads and discards; this one sends, a blocking socket, and measures its own CPU
(user + system, ``time.process_time``) per MiB, alternating in rounds:

- ``sendall``: the MiB as one buffer, one ``sendall``: what the kernel's TCP send costs alone
  (on loopback it also runs the receiver's side of TCP in the sender's system call);
- ``codec``: a 1 MiB-payload EnqueueBatch request in its parts (``wire_requests``), framed by
  our codec engine (``start_call`` with the server's windows open, ``buffers_to_send``: 16 KiB
  DATA frames as views of the payload between their 9-byte headers) and sent with ``sendmsg``,
  as the drivers do: the wire layer's floor without trio, flow control or a server.

The ratio codec/sendall is what framing 1 MiB in 16 KiB DATA frames costs over the bare send.
What a real enqueue adds on top (trio's reader and writer tasks, the server's WINDOW_UPDATEs,
the call itself) is `make bench`'s ``enqueue_1m`` row minus ``codec`` here.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import time

from sepp._model import wire_requests
from sepp._model.types import EnqueueRequest, Payload
from sepp.wire.codec._connection import CodecGrpcConnection
from sepp.wire.drivers._sending import advance, send_some

MIB = 1 << 20
_BIG = 1 << 30


def _open_connection() -> CodecGrpcConnection:
    conn = CodecGrpcConnection(authority="localhost")
    conn.initiate()
    settings = struct.pack(">HL", 0x4, 2**31 - 1)  # INITIAL_WINDOW_SIZE: no stream limit
    window = struct.pack(">L", _BIG)
    conn.receive_data(
        struct.pack(">HBBBL", 0, len(settings), 0x4, 0, 0)
        + settings
        + struct.pack(">HBBBL", 0, 4, 0x8, 0, 0)
        + window
    )
    conn.data_to_send()
    return conn


def _drain(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    buf = bytearray(MIB)
    while conn.recv_into(buf):
        pass
    os._exit(0)


def measure(mib: int, rounds: int) -> dict[str, list[float]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    pid = os.fork()
    if pid == 0:
        _drain(listener)
    sock = socket.create_connection(listener.getsockname())
    payload = os.urandom(MIB)
    request = EnqueueRequest("queue", "job", payload=Payload.bytes(payload))
    conn = _open_connection()
    sent_by_codec = 0

    def by_codec() -> None:
        nonlocal conn, sent_by_codec
        conn.start_call("EnqueueBatch", wire_requests.enqueue_batch([request]))
        buffers = conn.buffers_to_send()
        while buffers:
            advance(buffers, send_some(sock, buffers))
        sent_by_codec += 1
        if sent_by_codec % 500 == 0:  # a fresh connection before its window runs out
            conn = _open_connection()

    modes = {"sendall": lambda: sock.sendall(payload), "codec": by_codec}
    for send in modes.values():
        for _ in range(20):  # warm-up
            send()
    per_mib: dict[str, list[float]] = {name: [] for name in modes}
    per_round = max(1, mib // rounds)
    for _ in range(rounds):
        for name, send in modes.items():
            started = time.process_time()
            for _ in range(per_round):
                send()
            per_mib[name].append((time.process_time() - started) / per_round)
    sock.close()
    os.waitpid(pid, 0)
    return per_mib


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mib", type=int, default=1000, help="MiB sent per mode in all")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    per_mib = measure(args.mib, args.rounds)
    for name, values in per_mib.items():
        print(
            f"{name:8} {statistics.median(values) * 1e3:.3f} ms CPU per MiB"
            f" (rounds {min(values) * 1e3:.3f}-{max(values) * 1e3:.3f})"
        )
    ratios = [c / s for c, s in zip(per_mib["codec"], per_mib["sendall"], strict=True)]
    print(
        f"codec/sendall {statistics.median(ratios):.2f}"
        f" ({min(ratios):.2f}-{max(ratios):.2f}) per round"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
