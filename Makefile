# Every dependency is installed by these targets; nothing by hand.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export PYTHONUNBUFFERED := 1

.PHONY: venv test filetimes lint typecheck unit fuzz demo demo-sim bench compiled clean browser promtool sandbox

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	# torch pinned: the CPU build on disk. An unpinned torch pulls a multi-GB CUDA build.
	# uv installs the versions pip would, from pip's own indexes, links and constraints
	# (tools/uv_flags.py), in a fifth of the time (20 s against 101 s here, cold caches);
	# pip does it (torch first) if uv cannot.
	$(VENV)/bin/uv pip install -q --python $(PY) $$($(PY) tools/uv_flags.py) \
		torch==2.13.0 -e '.[dev]' || \
		{ $(PY) -m pip install -q torch==2.13.0 && $(PY) -m pip install -q -e '.[dev]'; }
	touch $(STAMP)

lint: venv
	$(VENV)/bin/ruff check src tests bench examples tools setup.py
	$(VENV)/bin/ruff format --check src tests bench examples tools setup.py
	# the layer rule: [tool.importlinter] in pyproject.toml (docs/architecture.md)
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy

# Two workers (pytest-xdist), a test file each at a time: a file's module fixtures (servers,
# tenants) stay in one process. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
# Files run slowest first (tests/filetimes.py), so xdist's own order by test count is off.
PYTEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile \
	--no-loadscope-reorder)

test: lint typecheck browser promtool sandbox
	$(VENV)/bin/pytest $(PYTEST_PARALLEL)

# Records every file's time into tests/filetimes.json, the order the next runs take.
filetimes: venv
	AICLUSTER_RECORD_FILETIMES=$(CURDIR)/tests/filetimes.json $(VENV)/bin/pytest $(PYTEST_PARALLEL)

unit: venv
	$(VENV)/bin/pytest tests/unit tests/property

# The fuzz tests with FUZZ_SCALE times the suite's examples (tests/fuzzing.py).
FUZZ_SCALE ?= 4
fuzz: venv
	AICLUSTER_FUZZ_SCALE=$(FUZZ_SCALE) $(VENV)/bin/pytest tests/unit/test_joboutput.py \
		tests/property/test_jobspec_fuzz.py tests/integration/test_api_fuzz.py

demo: venv sandbox
	$(PY) examples/demo.py

demo-sim: venv
	$(VENV)/bin/aicluster sim --trace philly --cluster examples/clusters/philly-512.yaml \
		--compare fifo,sjf,tiresias,fair --out reports/philly-demo

# The compiled build's replay needs a C compiler (as tests/integration/test_compiled_build.py).
bench: venv
	$(PY) bench/scheduler_throughput.py
	$(PY) bench/sim_replay.py
	@if command -v cc >/dev/null; then $(MAKE) -s compiled && \
		PYTHONPATH=$(COMPILED) $(PY) bench/sim_replay.py; \
	else echo "no C compiler (cc): the compiled build's replay is skipped"; fi
	$(PY) bench/twin_scale.py --gpus 100000 --policy fifo

# The simulator's hot path compiled with mypyc (setup.py), installed apart from the editable
# install: `PYTHONPATH=.build/compiled` runs it, without it the pure sources run (and the tests
# patch those). Rebuilt when a compiled source changes.
COMPILED := .build/compiled
COMPILED_SOURCES := $(wildcard src/aicluster/core/*.py src/aicluster/scheduler/*.py \
	src/aicluster/scheduler/*/*.py src/aicluster/sim/*.py) setup.py
compiled: $(COMPILED)/.stamp

$(COMPILED)/.stamp: $(STAMP) $(COMPILED_SOURCES)
	rm -rf $(COMPILED) build
	AICLUSTER_MYPYC=1 $(PY) -m pip install -q --no-deps --no-build-isolation --target $(COMPILED) .
	touch $@

# Debian's bubblewrap: each tenant's jobs run in its sandbox
# (src/aicluster/runtime/sandbox/bwrap.py). bwrap and libseccomp for the sandbox; mkfs.ext4
# (e2fsprogs) and mount (util-linux) for the per-job disks
# (src/aicluster/runtime/sandbox/jobdisk.py); nftables (its library libnftables, and nft) for a
# job network's firewall (src/aicluster/runtime/jobnet/).
sandbox:
	@{ command -v bwrap && ldconfig -p | grep -q libseccomp.so.2 && command -v mkfs.ext4 \
		&& command -v mount && command -v nft && ldconfig -p | grep -q libnftables.so.1; \
		} >/dev/null || { \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends bubblewrap libseccomp2 e2fsprogs mount \
		nftables; }

# Debian's chromium for the dashboard's browser tests (Playwright drives it; no browser download).
browser:
	@test -x /usr/bin/chromium || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends chromium fonts-liberation; }

# promtool from Debian's prometheus package, unpacked into .tools (installing the package would
# also start a Prometheus server); the metrics test runs `promtool check metrics` with it.
PROMTOOL := .tools/prometheus/usr/bin/promtool
promtool: $(PROMTOOL)

$(PROMTOOL):
	mkdir -p .tools
	cd .tools && { apt-get download prometheus 2>/dev/null || \
		{ apt-get update -q && apt-get download prometheus; }; }
	dpkg-deb -x .tools/prometheus_*.deb .tools/prometheus
	rm -f .tools/prometheus_*.deb .tools/prometheus/usr/bin/prometheus
	test -x $(PROMTOOL)

clean:
	rm -rf $(VENV) reports .demo .pytest_cache .mypy_cache .ruff_cache .tools test-artifacts .build build
