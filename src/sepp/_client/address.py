"""Parsing `host:port`, `[v6]:port`, `http://…` and `https://…` addresses."""

from __future__ import annotations

from dataclasses import dataclass

from .._model.errors import ValidationError

DEFAULT_PORT = 50051


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    tls: bool | None  # None: the scheme did not say


def parse_address(address: object) -> Address:
    if not isinstance(address, str) or not address.strip():
        raise ValidationError("address", "must be a non-empty str such as '127.0.0.1:50051'")
    text = address.strip()
    tls: bool | None = None
    lowered = text.lower()
    if lowered.startswith("https://"):
        tls, text = True, text[8:]
    elif lowered.startswith("http://"):
        tls, text = False, text[7:]
    elif "://" in text:
        raise ValidationError("address", f"unsupported scheme in {address!r} (use http or https)")
    text = text.rstrip("/")
    if "/" in text or "?" in text or "#" in text or "@" in text:
        raise ValidationError("address", f"{address!r} must be host:port with no path")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValidationError("address", f"unclosed '[' in {address!r}")
        host, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValidationError("address", f"unexpected text after ']' in {address!r}")
        port_text = rest[1:] if rest else ""
    elif text.count(":") > 1:
        raise ValidationError("address", f"IPv6 addresses need brackets: '[{text}]:port'")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ValidationError("address", f"no host in {address!r}")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValidationError("address", f"invalid port {port_text!r} in {address!r}")
        port = int(port_text)
    else:
        port = DEFAULT_PORT
    return Address(host, port, tls)
