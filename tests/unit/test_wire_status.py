"""gRPC status codes, grpc-message decoding, HTTP/RST mappings and grpc-timeout encoding."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sepp.wire._status import (
    StatusCode,
    decode_grpc_message,
    encode_grpc_timeout,
    parse_grpc_status,
    status_from_http,
    status_from_rst,
)

# In the smoke selection of the emulated architectures' parts (tests/conftest.py).
pytestmark = pytest.mark.arch_smoke

# -- status codes ------------------------------------------------------------------------------


def test_status_codes_match_the_grpc_numbering() -> None:
    assert [c.value for c in StatusCode] == list(range(17))
    assert StatusCode(14) is StatusCode.UNAVAILABLE
    assert StatusCode.UNAUTHENTICATED == 16


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        (b"0", StatusCode.OK),
        (b"14", StatusCode.UNAVAILABLE),
        (b"16", StatusCode.UNAUTHENTICATED),
        (b" 5 ", StatusCode.NOT_FOUND),
        (b"17", StatusCode.UNKNOWN),
        (b"999", StatusCode.UNKNOWN),
        (b"0000", StatusCode.UNKNOWN),
        (b"-1", StatusCode.UNKNOWN),
        (b"", StatusCode.UNKNOWN),
        (b"OK", StatusCode.UNKNOWN),
        (b"1e1", StatusCode.UNKNOWN),
        (b"\xd9\xa1", StatusCode.UNKNOWN),  # Arabic-Indic digit one in UTF-8
        (b"\xff\x00", StatusCode.UNKNOWN),
    ],
)
def test_parse_grpc_status(raw: bytes | None, expected: StatusCode | None) -> None:
    assert parse_grpc_status(raw) is expected


@given(st.binary(max_size=12))
def test_parse_grpc_status_is_total(raw: bytes) -> None:
    assert isinstance(parse_grpc_status(raw), StatusCode)


# -- grpc-message ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ""),
        (b"", ""),
        (b"plain text", "plain text"),
        (b"100%25 sure", "100% sure"),
        (b"caf%C3%A9", "café"),
        (b"line%0Abreak", "line\nbreak"),
        (b"%zz", "%zz"),  # not an escape: kept literally
        (b"50%", "50%"),  # truncated escape at the end
        (b"%4", "%4"),
        (b"%C3", "\ufffd"),  # half a UTF-8 sequence
        (b"%FF%FE", "\ufffd\ufffd"),  # not UTF-8 at all
        (b"raw \xc3\xa9", "raw é"),  # unescaped UTF-8 from a sloppy server
        (b"raw \xff", "raw \ufffd"),
    ],
)
def test_decode_grpc_message(raw: bytes | None, expected: str) -> None:
    assert decode_grpc_message(raw) == expected


@given(st.binary(max_size=200))
@example(b"%")
@example(b"%%%")
@example(b"%e9%")
def test_decode_grpc_message_is_total(raw: bytes) -> None:
    assert isinstance(decode_grpc_message(raw), str)


@given(st.text(max_size=60))
def test_decode_grpc_message_inverts_percent_encoding(text: str) -> None:
    # What a conforming server sends: UTF-8, with everything outside printable ASCII (and %)
    # percent-encoded.
    encoded = b"".join(
        bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
        for b in text.encode("utf-8", "surrogatepass")
    )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates are not text a server can send
    assert decode_grpc_message(encoded) == text


# -- HTTP and RST_STREAM mappings --------------------------------------------------------------


@pytest.mark.parametrize(
    ("http", "code"),
    [
        (400, StatusCode.INTERNAL),
        (401, StatusCode.UNAUTHENTICATED),
        (403, StatusCode.PERMISSION_DENIED),
        (404, StatusCode.UNIMPLEMENTED),
        (429, StatusCode.UNAVAILABLE),
        (502, StatusCode.UNAVAILABLE),
        (503, StatusCode.UNAVAILABLE),
        (504, StatusCode.UNAVAILABLE),
        (500, StatusCode.UNKNOWN),
        (301, StatusCode.UNKNOWN),
        (418, StatusCode.UNKNOWN),
        (0, StatusCode.UNKNOWN),
    ],
)
def test_status_from_http(http: int, code: StatusCode) -> None:
    assert status_from_http(http) is code


@pytest.mark.parametrize(
    ("rst", "code"),
    [
        (0x0, StatusCode.INTERNAL),  # NO_ERROR without a status
        (0x1, StatusCode.INTERNAL),  # PROTOCOL_ERROR
        (0x2, StatusCode.INTERNAL),  # INTERNAL_ERROR
        (0x3, StatusCode.INTERNAL),  # FLOW_CONTROL_ERROR
        (0x7, StatusCode.UNAVAILABLE),  # REFUSED_STREAM
        (0x8, StatusCode.CANCELLED),
        (0xB, StatusCode.RESOURCE_EXHAUSTED),  # ENHANCE_YOUR_CALM
        (0xC, StatusCode.PERMISSION_DENIED),  # INADEQUATE_SECURITY
        (0xD, StatusCode.INTERNAL),  # HTTP_1_1_REQUIRED
        (0xDEAD, StatusCode.INTERNAL),  # unknown code
    ],
)
def test_status_from_rst(rst: int, code: StatusCode) -> None:
    assert status_from_rst(rst) is code


# -- grpc-timeout ------------------------------------------------------------------------------

_UNIT_SECONDS = {
    "H": Fraction(3600),
    "M": Fraction(60),
    "S": Fraction(1),
    "m": Fraction(1, 1000),
    "u": Fraction(1, 1_000_000),
    "n": Fraction(1, 1_000_000_000),
}
_TIMEOUT_RE = re.compile(rb"([0-9]{1,8})([HMSmun])")
_MAX_SECONDS = 99_999_999 * 3600


def decode_timeout(value: bytes) -> Fraction:
    match = _TIMEOUT_RE.fullmatch(value)
    assert match is not None, value
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2).decode()]


@pytest.mark.parametrize(
    ("seconds", "wire"),
    [
        (1.5, b"1500m"),
        (30.0, b"30000m"),
        (0.25, b"250m"),
        (0.0015, b"2m"),  # rounded up, never down
        (1e-9, b"1m"),  # never zero for a live call
        (0.0, b"1m"),
        (-3.0, b"1m"),  # an already-passed deadline still sends a valid header
        (99_999.999, b"99999999m"),
        (100_000.0, b"100000S"),  # past 8 digits of ms: whole seconds
        (1e9, b"16666667M"),
        (1e12, b"99999999H"),  # beyond the largest expressible value: clamped
        (math.inf, b"99999999H"),
        (math.nan, b"99999999H"),
    ],
)
def test_encode_grpc_timeout_examples(seconds: float, wire: bytes) -> None:
    assert encode_grpc_timeout(seconds) == wire


@given(st.floats(min_value=0.0, max_value=_MAX_SECONDS, allow_nan=False))
@example(0.001)
@example(99_999.999)
@example(99_999.9995)
@example(100_000.0000001)
@example(6_000_000.0 - 1e-9)
@example(float(_MAX_SECONDS))
def test_encode_grpc_timeout_fits_and_never_shortens(seconds: float) -> None:
    wire = encode_grpc_timeout(seconds)
    assert _TIMEOUT_RE.fullmatch(wire), wire  # at most 8 digits and a valid unit
    sent = decode_timeout(wire)
    # Never shorter than asked, up to the float's own rounding (a relative 1e-15).
    assert sent >= Fraction(seconds) * (1 - Fraction(1, 10**15))
    assert sent > 0


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_encode_grpc_timeout_is_total(seconds: float) -> None:
    assert _TIMEOUT_RE.fullmatch(encode_grpc_timeout(seconds))
