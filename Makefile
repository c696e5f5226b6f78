# Each target installs what it needs: `make test` and `make demo` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

# The release's version is gpulens/__init__.py's __version__ (pyproject.toml reads it).
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' gpulens/__init__.py)

.PHONY: dist podresources-stubs demo test test-fast lint typecheck unit unit-fast bench install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[server,dev]'
	touch $(STAMP)

install: $(STAMP)

# The whole stack on a simulated 4-node cluster: exporters, collector with alerts, dashboard (Ctrl-C stops it).
demo: $(STAMP)
	$(VENV)/bin/gpulens demo $(DEMO_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The whole suite in two processes (pytest-xdist): most tests wait on servers, sockets and subprocesses, so two
# workers on two cores finish in little more than half the time. The slowest tests are listed in the log.
unit: $(STAMP)
	$(VENV)/bin/pytest -n 2 --durations=25

# The edit loop: lint, types and every test that needs no external server (PostgreSQL, Prometheus, Chromium, ...).
unit-fast: $(STAMP)
	$(VENV)/bin/pytest -n 2 -m "not external" --durations=10

test: lint typecheck unit

test-fast: lint typecheck unit-fast

# The release files in dist/: the sdist and the wheel, built without a package index (setuptools' own hooks); the
# wheel must say the version it was built for (tests/e2e/test_wheel.py installs both and runs `gpulens --version`).
dist: $(STAMP)
	rm -rf dist && mkdir dist
	$(PY) -c "from setuptools import build_meta; build_meta.build_sdist('dist')"
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w dist .
	test -f dist/gpulens-$(VERSION).tar.gz && test -f dist/gpulens-$(VERSION)-py3-none-any.whl
	@ls -1 dist

# The benchmarks also need the peers they compare with (the `bench` extra: nvitop-exporter).
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench

# The kubelet pod-resources stubs (exporter/podresources/api_pb2*.py), committed; run after editing api.proto.
podresources-stubs: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. gpulens/exporter/podresources/api.proto

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
