#!/usr/bin/env bash
# Regenerate the protobuf code and fail if it differs from what is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
"$VENV/bin/python" scripts/gen_proto.py
if ! git diff --quiet --exit-code -- src/sepp/_pb || [[ -n "$(git ls-files --others --exclude-standard src/sepp/_pb)" ]]; then
  echo "check-gen: src/sepp/_pb differs from a fresh 'make gen'; commit the regenerated code" >&2
  git --no-pager diff --stat -- src/sepp/_pb >&2
  exit 1
fi
echo "check-gen: generated code is up to date"
