# raftstream's Makefile owns set-up: every target depends on `install`, so on a fresh clone
# `make test` alone creates .venv, installs everything and runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTOS := $(wildcard proto/*.proto)
SEEDS ?= 200
# pytest workers for `make test` (pytest-xdist). Two on this 2-core machine: most tests wait
# on node processes, elections and timeouts, so two at once take ~0.6 of the time of one.
TEST_WORKERS ?= 2

.PHONY: install test test-spark-connect test-fast lint typecheck bench bench-engine bench-raft bench-cluster bench-audit proto sim vopr chaos soak audit run certs fuzz clean

$(STAMP): pyproject.toml
	@command -v java >/dev/null || { echo "installing a Java runtime for Spark (apt)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,audit]'
	@touch $(STAMP)

install: $(STAMP)

# Regenerate the gRPC/protobuf stubs (committed, so a plain `pip install .` works).
proto: install
	PATH=$(VENV)/bin:$$PATH $(PY) -m raftstream.proto.gen

# The import contract (pyproject.toml, [tool.importlinter]; docs/architecture.md) is checked
# on the same link view of the namespace as mypy's, since the editable install's import hook
# hides the mapped folders from import-linter too.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@$(PY) tools/typeview.py build/typeview
	cd build/typeview && PYTHONPATH=. ../../$(VENV)/bin/lint-imports --no-cache ../../pyproject.toml

# mypy cannot follow setuptools' editable import hook, so it checks a link view of the
# namespace that mirrors the package-dir mapping in pyproject.toml.
typecheck: install
	@$(PY) tools/typeview.py build/typeview
	cd build/typeview && ../../$(VENV)/bin/mypy -p raftstream

test: lint typecheck
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal tests

test-fast: install
	$(PY) -m pytest -q -x tests

sim: install
	RAFTSTREAM_SIM_SEEDS=$(SEEDS) $(PY) -m pytest -q tests/sim -k seeds

# The whole-node simulator (tests/vopr, docs/architecture.md "Tests"): SEEDS seeds from FIRST
# (default 0); prints the simulated hours, the faults injected by kind and the checks run, and
# stops at the first failing seed with the command that replays it (VOPR_FLAGS=--keep-going: runs
# every seed and lists the failing ones). `make test` runs 100.
FIRST ?= 0
vopr: install
	$(PY) -m tests.vopr --seeds $(SEEDS) --first $(FIRST) $(VOPR_FLAGS)

# A longer fuzz campaign against a real node (docs/limits.md): FUZZ_EXAMPLES random and
# malformed requests within FUZZ_SECONDS seconds of calls; prints requests tried and codes seen.
FUZZ_EXAMPLES ?= 5000
FUZZ_SECONDS ?= 300
fuzz: install
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_SECONDS=$(FUZZ_SECONDS) \
		$(PY) -m pytest -q -s -p no:cacheprovider --timeout 0 tests/security/test_fuzz.py

# Benchmarks print figures; they assert nothing (the machines are shared and noisy).
bench: bench-engine bench-raft bench-cluster

bench-engine: install
	$(PY) -m raftstream.bench.engine

bench-raft: install
	$(PY) -m raftstream.bench.raft

bench-cluster: install
	$(PY) -m raftstream.bench.cluster

bench-audit: install
	$(PY) -m raftstream.bench.audit

# A chaos campaign of every nemesis: CHAOS_TIME seconds each (default 300), CHAOS_SEED to replay,
# CHAOS_NEMESES to pick some, NODES=5 for a 5-node cluster (default 3), RUNS=10 for ten runs of
# each nemesis (default 1); runs (node data, history, reports) land under ./chaos-runs.
NODES ?= $(or $(CHAOS_SIZE),3)
RUNS ?= $(or $(CHAOS_RUNS),1)
chaos: install
	CHAOS_SIZE=$(NODES) CHAOS_RUNS=$(RUNS) $(PY) -m raftstream.chaos

# A soak: a local cluster under a steady mixed load for SOAK_TIME seconds (default 3600),
# every process sampled; reports what grew (memory, fds, threads, CPU, data, backlogs) and
# exits 1 if anything did or the client saw an error. Runs land in ./soak-runs (docs/chaos.md).
soak: install
	$(PY) -m raftstream.chaos.soak

# The audit through a Spark Connect server (--remote sc://): a third Spark JVM, so not in `make test`.
test-spark-connect: install
	RAFTSTREAM_TEST_SPARK_CONNECT=1 $(PY) -m pytest -q -p no:cacheprovider tests/audit/test_standalone.py -k connect

# Audit the local cluster's data (stop it first, or the audit reads a consistent copy).
audit: install
	$(VENV)/bin/raftstream audit run --data ./data --json ./audit-report.json --html ./audit-report.html

# A local 3-node cluster on 127.0.0.1:7101-7103 with data under ./data; Ctrl-C stops it.
# TLS=1: mutual TLS, with new throw-away certificates under ./data/certs (docs/tls.md).
run: install
	$(VENV)/bin/raftstream server --local-cluster 3 --data ./data $(if $(filter 1 yes true,$(TLS)),--tls)

# A throw-away CA and certificates for n1, n2, n3 and a client in ./certs (docs/tls.md).
certs: install
	$(VENV)/bin/raftstream certs --dir ./certs --nodes n1,n2,n3 --force

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
