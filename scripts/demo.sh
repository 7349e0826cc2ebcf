#!/usr/bin/env bash
# The README's demo command (`make demo`): examples/main.py against $SEPP_ADDR, or against a
# sepp server it starts itself (installed into the cache on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
if [[ -z "${SEPP_ADDR:-}" ]]; then
  SEPP_BIN="$(bash scripts/ensure-sepp-server.sh | tail -n 1)"
  export SEPP_BIN
fi
exec .venv/bin/python examples/main.py
