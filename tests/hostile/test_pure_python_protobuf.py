"""The hostile server's malformed responses on the pure-Python protobuf, which a platform
without upb's wheels (PyPy, free-threaded CPython) runs: its parse errors do not name the
message type, so our own label must name the RPC whose response was malformed.

The tests run in a child pytest with PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python, so every
part of the test matrix (upb or not) runs them on that implementation: on the protobuf message
codec (ours never imports protobuf) and the trio front end over our engine, as the labels are
the client's, the same under every front end and engine (the child ran all twelve
combinations once: 384 tests, 55 s of every part's time).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# The generated classes as the message codec: ours (the default) does not use protobuf.
PURE = os.environ | {
    "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python",
    "SEPP_MESSAGE_CODEC": "protobuf",
}
# The test ids' front end, engine and message codec (conftest.py and the hostile suite's own).
ONE_COMBO = "trio-codec-protobuf"


def test_malformed_responses_name_their_rpc_on_the_pure_python_protobuf(tmp_path: Path) -> None:
    which = subprocess.run(
        [sys.executable, "-c", "from google.protobuf.internal import api_implementation as a;"
         "import sepp._pb.queue_pb2; print(a.Type())"],
        env=PURE, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert which.stdout.strip() == "python", which.stderr
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path}",
         str(TESTS / "hostile" / "test_hostile_server.py"), "-k", "malformed and " + ONE_COMBO],
        cwd=TESTS.parent, env=PURE, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed[1]) >= 30, done.stdout[-2000:]
