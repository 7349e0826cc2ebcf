#!/usr/bin/env bash
# The committed gencode sets the protobuf runtime floor; prove it loads there without
# warnings, on both the upb and the pure-Python implementations.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOOR="$(sed -n 's/.*"protobuf>=\([0-9.]*\),.*/\1/p' pyproject.toml)"
VENV=".venv-protobuf-floor"
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c "import google.protobuf as p, sys; sys.exit(p.__version__ != '$FLOOR')" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet "protobuf==$FLOOR" h2 trio
fi
for impl in upb python; do
  PYTHONPATH=src PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=$impl "$VENV/bin/python" -W error -c "
import google.protobuf, sepp
from sepp._pb import queue_pb2 as pb
m = pb.EnqueueBatchRequest(jobs=[pb.EnqueueRequest(queue='q', job_type='t')])
assert pb.EnqueueBatchRequest.FromString(m.SerializeToString()) == m
print('protobuf', google.protobuf.__version__, '($impl): gencode loads without warnings')
"
done
