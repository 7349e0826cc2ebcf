"""The API key never leaks; TLS verifies by default; plaintext warnings come once."""

from __future__ import annotations

import logging

import pytest
import trio
from opentelemetry import trace
from otel_support import install

import sepp
from sepp.testing import sepp_server

# In the smoke selection of the emulated architectures' parts (tests/conftest.py).
pytestmark = pytest.mark.arch_smoke

KEY = "s3cr3t-key-value-42"
CONFIG = {
    "admin": {"enabled": False},
    "storage": {"persist_mode": "buffer"},
    "auth": {"api_keys": [{"name": "app", "key": KEY}]},
}


async def test_api_key_never_appears_in_logs_errors_reprs_or_spans(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    exporter, _ = install()
    seen: list[str] = []
    async with sepp_server(CONFIG) as server:
        with trace.get_tracer("t").start_as_current_span("app"):
            async with sepp.open(
                server.address, api_key=KEY, retry_policy=sepp.RetryPolicy(max_attempts=2)
            ) as client:
                seen.append(repr(client))
                await client.enqueue("sec", "t")
                jobs = await client.reserve("sec", wait_timeout=1)
                assert jobs is not None
                seen.append(repr(jobs[0]))
                await client.ack(jobs[0].ctx)
                for bad in (client.ack(jobs[0].ctx), client.reserve("", wait_timeout=0)):
                    with pytest.raises(sepp.SeppError) as info:
                        await bad
                    seen.append(str(info.value) + repr(info.value))
            # A wrong key and a dead server produce errors too.
            async with sepp.open(server.address, api_key=KEY + "x") as client:
                with pytest.raises(sepp.UnauthenticatedError) as auth:
                    await client.get_server_info()
                seen.append(str(auth.value))
    with pytest.raises(sepp.ConnectError) as conn:
        async with sepp.open(server.address, api_key=KEY, connect_timeout=1):
            pass
    seen.append(str(conn.value) + repr(conn.value))
    spans = exporter.get_finished_spans()
    assert spans
    seen += [str(dict(s.attributes or {})) + str(s.events) for s in spans]
    seen.append(caplog.text)
    assert all(KEY not in text for text in seen)
    # Exactly one plaintext warning per client that sent the key.
    warnings = [r for r in caplog.records if "plaintext" in r.getMessage()]
    assert len(warnings) == 3  # three clients opened with a key over plaintext


async def test_default_tls_verifies_the_certificate(tmp_path: object) -> None:
    from pathlib import Path

    from fixtures.certificates import CA

    tmp = Path(str(tmp_path))
    ca = CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    (tmp / "c.pem").write_bytes(cert.cert_chain_pem)
    (tmp / "k.pem").write_bytes(cert.key_pem)
    cfg = {
        "admin": {"enabled": False},
        "server": {"tls_cert_path": str(tmp / "c.pem"), "tls_key_path": str(tmp / "k.pem")},
    }
    async with sepp_server(cfg) as server:
        # System roots do not know this private CA: refused, never downgraded.
        for opts in ({"tls": True}, {}):
            address = server.address if opts else f"https://{server.address}"
            with trio.fail_after(10), pytest.raises(sepp.ConnectError) as info:
                async with sepp.open(address, connect_timeout=3, **opts):  # type: ignore[arg-type]
                    pass
            assert (
                "CERTIFICATE_VERIFY_FAILED" in str(info.value)
                or "certificate" in str(info.value).lower()
            )
        async with sepp.open(f"https://{server.address}", tls_ca_cert=ca.cert_pem) as c:
            assert (await c.get_server_info()).server_version
