# sepp-trio developer commands. `make test` sets up everything on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test demo docs gen check-gen lint typecheck bench venv chaos soak matrix test-arch release-check

test:            ## set up (venv, deps, sepp server) and run lint, types and every test
	bash scripts/test.sh

matrix: venv     ## only the tests on every claimed Python and the dependency floors (ARGS: pytest's)
	SEPP_BIN="$$(bash scripts/ensure-sepp-server.sh | tail -n 1)" \
		SEPPY_PYTHON="$$(bash scripts/ensure-seppy-venv.sh | tail -n 1)" \
		$(PY) scripts/test_matrix.py -- $(ARGS)

test-arch: venv  ## the whole tree on one emulated machine, full counts (ARCH: riscv64, s390x, ppc64le)
	@case "$(ARCH)" in riscv64|s390x|ppc64le) ;; *) echo "ARCH=riscv64, s390x or ppc64le"; exit 2 ;; esac
	SEPP_BIN="$$(bash scripts/ensure-sepp-server.sh | tail -n 1)" \
		SEPPY_PYTHON="$$(bash scripts/ensure-seppy-venv.sh | tail -n 1)" \
		$(PY) scripts/test_matrix.py --full --only py3.13-$(ARCH) -- $(ARGS)

release-check:   ## build sdist + wheel, twine check, install the wheel per Python, smoke round trip
	bash scripts/release-check.sh

demo:            ## run examples/main.py end to end ($$SEPP_ADDR, or a server started here)
	bash scripts/demo.sh

docs: venv       ## build the docs site into docs/_build/html (warnings are errors)
	bash scripts/build-docs.sh

venv:
	bash scripts/setup-venv.sh

gen: venv        ## regenerate src/sepp/_pb from ../shared/proto (comments stripped)
	$(PY) scripts/gen_proto.py

check-gen: venv  ## fail if the committed generated code differs from a fresh generation
	bash scripts/check-gen.sh

lint: venv
	$(VENV)/bin/ruff check src tests examples benchmarks scripts docs/conf.py docs/_ext hatch_build.py
	$(VENV)/bin/ruff format --check src tests examples benchmarks scripts docs/conf.py docs/_ext hatch_build.py

typecheck: venv
	$(VENV)/bin/mypy src/sepp

bench: venv      ## side-by-side benchmark against sepp-py (BENCH_ARGS="--quick", "--rs", ...)
	SEPP_BIN="$$(bash scripts/ensure-sepp-server.sh | tail -n 1)" $(PY) -m benchmarks $(BENCH_ARGS)

chaos: venv      ## long chaos run (20,000 jobs, 5 server crashes); figures to tests/chaos/RESULTS.md
	SEPP_BIN="$$(bash scripts/ensure-sepp-server.sh | tail -n 1)" PYTHONPATH=src:tests \
		$(PY) tests/chaos/run_long.py --results tests/chaos/RESULTS.md $(CHAOS_ARGS)

soak: venv       ## 30 min through nginx with restarts/reloads; figures to tests/soak/RESULTS.md
	bash scripts/ensure-proxies.sh
	SEPP_BIN="$$(bash scripts/ensure-sepp-server.sh | tail -n 1)" PYTHONPATH=src:tests \
		$(PY) tests/soak/run_soak.py --results tests/soak/RESULTS.md $(SOAK_ARGS)
