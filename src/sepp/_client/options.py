"""The options of `sepp.open()`, checked once and resolved into what the Client and its
Channel are built from."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from datetime import timedelta

from .._model import validate as v
from .._model.errors import ValidationError
from .._util.log import Log, LoggerLike
from .._version import __version__
from ..wire import WIRE_ENGINES, WireEngine
from ..wire.drivers import ChannelOptions, Endpoint
from . import otel as _otel
from .address import parse_address
from .batching import Batching
from .retry import NO_RETRY, RetryPolicy

DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 272 * 1024 * 1024
"""The default `max_receive_message_bytes` of `sepp.open()`, 272 MiB: it fits the largest
reserve a default server can send (256 jobs with 1 MiB payloads) and the envelope. Lower it to
bound memory against a misconfigured or hostile server."""
USER_AGENT = f"sepp-trio/{__version__}"


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    endpoint: Endpoint
    address: str  # for messages: host:port
    secret_metadata: tuple[tuple[bytes, bytes], ...]
    connect_timeout_s: float
    rpc_timeout_s: float | None
    keepalive_interval_s: float | None
    keepalive_timeout_s: float
    max_receive_message_bytes: int
    retry_policy: RetryPolicy
    enqueue_batching: Batching | None
    validate_locally: bool
    wire_engine: WireEngine | None
    log: Log

    @classmethod
    def parse(
        cls,
        address: str,
        *,
        api_key: str | None,
        tls: bool | ssl.SSLContext | None,
        tls_ca_cert: bytes | str | os.PathLike[str] | None,
        tls_domain: str | None,
        retry_policy: RetryPolicy | None,
        connect_timeout: float | timedelta,
        rpc_timeout: float | timedelta | None,
        max_receive_message_bytes: int | None,
        logger: LoggerLike | None,
        keepalive_interval: float | timedelta | None,
        keepalive_timeout: float | timedelta,
        enqueue_batching: Batching | None,
        validate_locally: bool,
        wire_engine: WireEngine | None = None,
    ) -> ConnectOptions:
        """Check every option (ValidationError) before anything is opened."""
        parsed = parse_address(address)
        wants_tls = (
            bool(tls) or tls_ca_cert is not None or tls_domain is not None or parsed.tls is True
        )
        if parsed.tls is True and tls is False:
            raise ValidationError("tls", "an https:// address never falls back to plaintext")
        if parsed.tls is False and wants_tls:
            raise ValidationError("tls", "TLS options given for an http:// (plaintext) address")
        if tls_domain is not None:
            v.utf8_text("tls_domain", tls_domain)
        connect_s = v.seconds("connect_timeout", connect_timeout)
        rpc_s = None if rpc_timeout is None else v.seconds("rpc_timeout", rpc_timeout)
        keepalive_s = (
            None
            if keepalive_interval is None
            else v.seconds("keepalive_interval", keepalive_interval)
        )
        keepalive_timeout_s = v.seconds("keepalive_timeout", keepalive_timeout)
        if max_receive_message_bytes is None:
            max_receive = DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
        else:
            max_receive = v.whole_number(
                "max_receive_message_bytes", max_receive_message_bytes, low=1, high=2**32
            )
        if enqueue_batching is not None and not isinstance(enqueue_batching, Batching):
            raise ValidationError("enqueue_batching", "must be a sepp.Batching")
        if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
            raise ValidationError("retry_policy", "must be a sepp.RetryPolicy")
        if wire_engine is not None and wire_engine not in WIRE_ENGINES:
            raise ValidationError(
                "wire_engine", f"must be one of {', '.join(map(repr, WIRE_ENGINES))} or None"
            )
        log = Log(logger)
        secret: list[tuple[bytes, bytes]] = []
        if api_key is not None:
            key = v.header_safe_api_key(api_key)
            secret.append((b"authorization", b"Bearer " + key.encode("ascii")))
            if not wants_tls:
                log.warning("sepp: an API key is configured without TLS; it travels in plaintext")
        ssl_context = _ssl_context(tls, tls_ca_cert) if wants_tls else None
        endpoint = Endpoint(parsed.host, parsed.port, ssl_context, tls_domain)
        return cls(
            endpoint=endpoint,
            address=(
                f"{parsed.host}:{parsed.port}" if ":" not in parsed.host else endpoint.authority
            ),
            secret_metadata=tuple(secret),
            connect_timeout_s=connect_s,
            rpc_timeout_s=rpc_s,
            keepalive_interval_s=keepalive_s,
            keepalive_timeout_s=keepalive_timeout_s,
            max_receive_message_bytes=max_receive,
            retry_policy=retry_policy or NO_RETRY,
            enqueue_batching=enqueue_batching,
            validate_locally=bool(validate_locally),
            wire_engine=wire_engine,
            log=log,
        )

    def channel_options(self) -> ChannelOptions:
        """What a channel for `endpoint` is built with (each runtime builds its own)."""
        return {
            "user_agent": USER_AGENT,
            "secret_metadata": self.secret_metadata,
            "connect_timeout": self.connect_timeout_s,
            "max_receive_message_bytes": self.max_receive_message_bytes,
            "keepalive_interval": self.keepalive_interval_s,
            "keepalive_timeout": self.keepalive_timeout_s,
            "wire_engine": self.wire_engine,
            "log": self.log,
            "on_transparent_retry": _otel.count_transparent_retry,
        }


def _ssl_context(
    tls: bool | ssl.SSLContext | None,
    tls_ca_cert: bytes | str | os.PathLike[str] | None,
) -> ssl.SSLContext:
    if isinstance(tls, ssl.SSLContext):
        context = tls
    elif tls_ca_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        try:
            if isinstance(tls_ca_cert, bytes):
                context.load_verify_locations(cadata=tls_ca_cert.decode("ascii"))
            else:
                context.load_verify_locations(cafile=os.fspath(tls_ca_cert))
        except (OSError, ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
            raise ValidationError("tls_ca_cert", f"cannot load the CA certificate: {exc}") from None
    else:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.set_alpn_protocols(["h2"])
    return context
