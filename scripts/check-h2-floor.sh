#!/usr/bin/env bash
# The reference engine reaches into h2's internals (src/sepp/wire/_h2_overrides.py) and the
# codec into hpack's decoder table (src/sepp/wire/_codec.py). The main venv tests the newest
# h2 and hpack; this runs the sans-IO engine tests again on the declared floor (h2 and the
# oldest hpack it accepts), on both engines, with the differential fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
H2_FLOOR="$(sed -n 's/.*"h2>=\([0-9.]*\),.*/\1/p' pyproject.toml)"
HPACK_FLOOR="4.0.0"  # h2 4.1's own floor for hpack
VENV=".venv-h2-floor"
want="h2==$H2_FLOOR hpack==$HPACK_FLOOR"
if [[ ! -x "$VENV/bin/python" || "$(cat "$VENV/.stamp" 2>/dev/null)" != "$want" ]]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet "h2==$H2_FLOOR" "hpack==$HPACK_FLOOR" \
    "hyperframe<7" trio protobuf pytest pytest-trio hypothesis
  echo "$want" > "$VENV/.stamp"
fi
"$VENV/bin/python" -c "import h2, hpack; print('h2', h2.__version__, 'hpack', hpack.__version__)"
PYTHONPATH=src:tests "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/unit/test_wire_connection.py tests/unit/test_wire_codec.py \
  tests/unit/test_wire_differential.py tests/unit/test_wire_hpack.py
