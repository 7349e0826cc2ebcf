#!/usr/bin/env bash
# `make release-check`: build the sdist and the wheel as a release would (isolated build),
# `twine check --strict` both, then install the wheel into a fresh virtualenv on every Python
# the package claims (found as scripts/test_matrix.py finds them: 3.14 and 3.15 are Debian
# sid's, from scripts/ensure-interpreters.sh) and run the smoke round trip against the real
# sepp server there.
# Leaves the artefacts in dist/ (what docs/releasing.md uploads).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
bash scripts/setup-venv.sh
SEPP_BIN="$(bash scripts/ensure-sepp-server.sh | tail -n 1)"
export SEPP_BIN

echo "==> build (isolated, as a release builds)"
rm -rf dist
"$VENV/bin/python" -m build --outdir dist .
ls -l dist

echo "==> twine check"
"$VENV/bin/python" -m twine check --strict dist/*

wheel="$(ls dist/*.whl)"
work="$(mktemp -d "${TMPDIR:-/tmp}/sepp-release-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
versions="$("$VENV/bin/python" -c 'import sys; sys.path.insert(0, "scripts"); import test_matrix; print(*test_matrix.claimed_versions())')"
for version in $versions; do
  echo "==> Python $version: a fresh venv with the wheel, then the smoke round trip"
  python="$("$VENV/bin/python" -c "import sys; sys.path.insert(0, 'scripts'); import test_matrix; print(test_matrix.find_python('$version'))")"
  "$python" -m venv "$work/py$version"
  "$work/py$version/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel[otel,cron]"
  "$work/py$version/bin/python" -m pip show sepp-trio | sed -n '1,3p'
  (cd "$work" && "$work/py$version/bin/python" -I "$OLDPWD/scripts/smoke_round_trip.py")
done
echo "release-check: dist/ is ready: $(ls dist | xargs)"
