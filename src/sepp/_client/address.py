"""Parsing `host:port`, `[v6]:port`, `http://…` and `https://…` addresses."""

from __future__ import annotations

import ipaddress
import string
from dataclasses import dataclass

from .._model.errors import DEFAULT_GRPC_PORT, ValidationError

DEFAULT_PORT = DEFAULT_GRPC_PORT
_HOST_CHARS = frozenset(string.ascii_letters + string.digits + "-_")


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
    bracketed = text.startswith("[")
    if bracketed:
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
    if bracketed:
        if not _is_ipv6(host):
            raise ValidationError("address", f"{host!r} in {address!r} is not an IPv6 address")
    elif not _is_host_name(host):
        raise ValidationError(
            "address",
            f"{address!r} is not host:port: {host!r} is not a host name or IP address"
            " (expected e.g. '127.0.0.1:50051', '[::1]:50051' or 'https://sepp.example.com')",
        )
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValidationError("address", f"invalid port {port_text!r} in {address!r}")
        port = int(port_text)
    else:
        port = DEFAULT_PORT
    return Address(host, port, tls)


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)  # a zone (`fe80::1%eth0`) included
    except ValueError:
        return False
    return True


def _is_host_name(text: str) -> bool:
    """A DNS name or an IPv4 literal: dot-separated labels of ASCII letters, digits, '-' and
    '_' (an internationalised name in its `xn--` form), none empty, none starting or ending
    with '-'; an optional final dot."""
    name = text[:-1] if text.endswith(".") else text
    if not name or len(name) > 253:
        return False
    for label in name.split("."):
        if not label or len(label) > 63 or label[0] == "-" or label[-1] == "-":
            return False
        if not all(char in _HOST_CHARS for char in label):
            return False
    return True
