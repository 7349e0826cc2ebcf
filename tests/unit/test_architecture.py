"""The machine the tests run on is the one the run names, and its byte order is the one it has.

scripts/test_matrix.py runs the smoke selection on riscv64, s390x (big-endian) and ppc64le
Pythons under qemu-user and names the machine in SEPP_TEST_MACHINE: a part that quietly ran on
the host's Python (a wrong path, a wrapper gone astray) would prove nothing about them, so this
fails. Without the variable (every other run) the machine is the host's, and its byte order
still has to be what its architecture says.
"""

from __future__ import annotations

import array
import os
import platform
import struct
import sys

import pytest

pytestmark = pytest.mark.arch_smoke

# platform.machine() -> its byte order, for the machines whose Linux has one only.
BYTE_ORDER = {
    "x86_64": "little",
    "aarch64": "little",
    "riscv64": "little",
    "ppc64le": "little",
    "s390x": "big",
    "ppc64": "big",
}


def test_the_interpreter_runs_on_the_machine_the_run_names() -> None:
    expected = os.environ.get("SEPP_TEST_MACHINE", "").strip() or platform.machine()
    assert platform.machine() == expected, (
        f"SEPP_TEST_MACHINE={expected}, but {sys.executable} runs on {platform.machine()}"
    )
    if expected in BYTE_ORDER:
        assert sys.byteorder == BYTE_ORDER[expected]


def test_the_native_byte_order_is_the_one_sys_byteorder_names() -> None:
    # What our code must never depend on, checked to be what the platform says it is: on
    # s390x the native order is big-endian, and code that packs "=I" or casts a memoryview
    # would write these bytes, not the wire's.
    native = struct.pack("=I", 0x01020304)
    assert native == (0x01020304).to_bytes(4, sys.byteorder)
    words = array.array("I", [0x01020304])
    assert words.itemsize == 4 and native == bytes(memoryview(words).cast("B"))
    assert (native == b"\x01\x02\x03\x04") is (sys.byteorder == "big")
