"""The bytes on the wire are the same on every machine: big-endian HTTP/2 and gRPC framing,
little-endian protobuf fixed-width fields, whatever order the processor has.

A native-order format (`struct.pack("I", ...)`, `"=d"`, a memoryview cast, an `array`) writes
the wire's bytes on x86-64 and others on s390x: the matrix's s390x part would catch it under
qemu, and the scan below catches it here, on any machine. The golden values pin what the
codec writes, byte for byte, on the machine that runs them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sepp._model import wire_format
from sepp.wire import _framing

SRC = Path(__file__).resolve().parents[2] / "src" / "sepp"
STRUCT_CALLS = {"Struct", "pack", "unpack", "pack_into", "unpack_from", "iter_unpack", "calcsize"}
EXPLICIT_ORDER = ("<", ">", "!")


def _sources() -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(SRC)), ast.parse(path.read_text()))
        for path in sorted(SRC.rglob("*.py"))
        if "_pb" not in path.relative_to(SRC).parts  # protoc's, on protobuf's runtime
    ]


def byte_order_problems(name: str, tree: ast.Module) -> list[str]:
    """What in a module's source depends on the machine's byte order, or may."""
    found = []
    struct_names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "struct"
        for alias in node.names
    }
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            )
            for module in {"array", "ctypes", "numpy"} & set(modules):
                found.append(f"{where}: imports {module} (native byte order)")
        if isinstance(node, ast.Attribute) and node.attr == "byteorder":
            found.append(f"{where}: reads {ast.unparse(node)}")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        is_struct = (
            isinstance(func, ast.Attribute)
            and ast.unparse(func.value) == "struct"
            and called in STRUCT_CALLS
        ) or (isinstance(func, ast.Name) and called in struct_names)
        if is_struct:
            fmt = node.args[0] if node.args else None
            if not (isinstance(fmt, ast.Constant) and isinstance(fmt.value, str)):
                found.append(f"{where}: {ast.unparse(node)[:60]}: a format that is not a literal")
            elif not fmt.value.startswith(EXPLICIT_ORDER):
                found.append(f"{where}: struct format {fmt.value!r} has no explicit byte order")
        elif called in ("to_bytes", "from_bytes"):
            order = node.args[1] if len(node.args) > 1 else None
            order = next((k.value for k in node.keywords if k.arg == "byteorder"), order)
            if not (isinstance(order, ast.Constant) and order.value in ("big", "little")):
                found.append(f"{where}: {ast.unparse(node)[:60]}: no literal byte order")
        elif called == "cast" and not (
            isinstance(func, ast.Name) or ast.unparse(func) == "typing.cast"
        ):
            found.append(f"{where}: {ast.unparse(node)[:60]}: a memoryview cast (native order)")
    return found


def test_no_code_of_ours_depends_on_the_machine_s_byte_order() -> None:
    sources = _sources()
    assert len(sources) > 100  # the scan sees the package
    problems = [problem for name, tree in sources for problem in byte_order_problems(name, tree)]
    assert problems == []


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ('import struct\nstruct.pack("I", 1)', "struct format 'I' has no explicit byte order"),
        ('import struct\nstruct.Struct("=d")', "struct format '=d' has no explicit byte order"),
        ('from struct import unpack as u\nu("HL", b"")', "struct format 'HL'"),
        ("import struct\nstruct.pack(FORMAT, 1)", "a format that is not a literal"),
        ("n.to_bytes(4, sys.byteorder)", "no literal byte order"),
        ("int.from_bytes(b'ab')", "no literal byte order"),
        ('memoryview(b"abcd").cast("I")', "a memoryview cast"),
        ("import array", "imports array"),
        ("import sys\nsys.byteorder", "reads sys.byteorder"),
    ],
)
def test_the_scan_finds_each_kind_of_native_order(source: str, problem: str) -> None:
    found = byte_order_problems("m.py", ast.parse(source))
    assert [f for f in found if problem in f], found


def test_the_scan_passes_what_states_its_order() -> None:
    source = (
        "import struct, typing\n"
        'struct.Struct(">HBBBL"); struct.pack("<d", 1.0); struct.unpack("!L", b"")\n'
        'n.to_bytes(3, "big"); int.from_bytes(b"ab", byteorder="little")\n'
        "typing.cast(int, 1)\n"
    )
    assert byte_order_problems("m.py", ast.parse(source)) == []


# -- what the codec writes, on this machine -------------------------------------------------


# (The scan reads the source, the same everywhere; these run on the emulated machines too.)
@pytest.mark.arch_smoke
def test_protobuf_fixed_width_fields_are_little_endian_and_varints_are_base_128() -> None:
    assert wire_format.double(1.5) == bytes.fromhex("000000000000f83f")
    assert wire_format.double(-2.0) == bytes.fromhex("00000000000000c0")
    assert wire_format.varint(300) == b"\xac\x02"
    assert wire_format.varint(0x0102030405) == bytes.fromhex("85888c9010")
    assert wire_format.varint(-1) == b"\xff" * 9 + b"\x01"  # 64-bit two's complement
    data = wire_format.varint(0x0102030405) + wire_format.double(1.5)
    assert wire_format.read_varint(data, 0, len(data)) == (0x0102030405, 5)


@pytest.mark.arch_smoke
def test_the_grpc_message_prefix_is_a_flag_then_a_big_endian_length() -> None:
    message = bytes(range(256)) * 257  # 65,792 bytes: 0x00010100
    framed = _framing.encode_message(message)
    assert framed[:5] == b"\x00\x00\x01\x01\x00" and framed[5:] == message
    decoder = _framing.MessageDecoder(None)
    decoder.feed(framed[:3])  # the prefix split across chunks
    decoder.feed(framed[3:])
    assert decoder.message == message
