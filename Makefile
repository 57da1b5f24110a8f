# pycollective: `make demo` runs the main job, `make test` the whole suite.
# Both work on a fresh machine: `setup` builds ./.venv and installs everything they need.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
# Debian packages the tests use: OpenMPI and MPICH, to check that ranks start under a real
# mpirun and a real mpiexec.hydra.
APT_PACKAGES := openmpi-bin libopenmpi-dev mpich
# Slurm's daemons and client and munge, for the srun and sbatch jobs of tests/api/test_slurm.py
# (each test starts and stops a cluster of its own), and etcd (3.4), the replicated store of
# the elastic jobs that survive the loss of any host (tests start their own members:
# tests/_etcd.py), clang with its runtimes (`make lint` builds the compiled core with it as
# well as gcc; libFuzzer and AddressSanitizer for `make fuzz`), and stress-ng
# (compare_peers.py --stress: CPU load beside the jobs); without their recommends.
APT_SMALL := slurmctld slurmd slurm-client munge etcd-server clang libclang-rt-dev stress-ng

.PHONY: setup system-deps bytecode test faults fuzz demo bench compare multihost torch-suite lint clean \
	setup-ray test-ray bench-ray sanitize

setup: $(STAMP)

# The C sources too: `make setup` rebuilds pycollective._native after they change.
$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.[ch])
	@$(MAKE) --no-print-directory system-deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch pinned here to the CPU build (2.13.0): the extra's range could pull a CUDA build
	# of several GB.
	$(PY) -m pip install --quiet -e '.[dev,test,torch,tls]' 'torch==$(TORCH_VERSION)'
	touch $(STAMP)

# Installs the Debian packages when missing and running as root; otherwise says how.
system-deps:
	@missing=""; small=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	for p in $(APT_SMALL); do dpkg -s $$p >/dev/null 2>&1 || small="$$small $$p"; done; \
	if [ -z "$$missing$$small" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing$$missing$$small"; \
		apt-get update -qq && \
		{ [ -z "$$missing" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; } && \
		{ [ -z "$$small" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$small >/dev/null; }; \
	else \
		echo "note: optional packages missing:$$missing$$small (sudo apt-get install$$missing$$small); their tests will skip"; \
	fi

# Bytecode for our own sources, written once: where PYTHONDONTWRITEBYTECODE is set (as on CI
# machines) Python never caches it, and every rank of every job compiled all of pycollective
# again on import (0.62 against 0.34-0.39 s a process, measured; the suite starts thousands).
# compileall skips what is up to date; imports read the caches whatever that variable says.
bytecode: setup
	@$(PY) -m compileall -q -j 0 src tests examples benchmarks tools fuzz >/dev/null

# --durations: every log (CI's too) names the 30 slowest tests, where the suite's time goes.
# -n 2 --dist loadfile: two pytest-xdist workers, a test file's tests in order in one of
# them (its module fixtures made once). The suite used 1.3 of the 2 cores (its ranks wait on
# each other, on timeouts, on process start-up), so two workers take it from 15-16 to
# 11 minutes on this 2-core machine (README.md, "Tests"); its time bounds were already
# set for a machine loaded by other jobs.
TEST_WORKERS ?= 2
test: setup bytecode
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=30

# Ray (not part of `test`: Ray and Ray Train are large): its own venv, .venv-ray, with
# ray[train] 2.60.0 and the same CPU torch, then tests/ray: pycollective as a
# ray.util.collective backend and as Ray Train's torch backend, on a one-node cluster and
# across two network-namespace hosts (root; skipped otherwise, saying why).
RAY_VENV := .venv-ray
RAY_PY := $(RAY_VENV)/bin/python
RAY_VERSION := 2.60.0
RAY_STAMP := $(RAY_VENV)/.installed

setup-ray: $(RAY_STAMP)

$(RAY_STAMP): pyproject.toml setup.py $(wildcard csrc/*.[ch])
	@$(MAKE) --no-print-directory system-deps
	test -x $(RAY_PY) || $(PYTHON) -m venv $(RAY_VENV)
	$(RAY_PY) -m pip install --quiet --upgrade pip
	# torch pinned to the CPU build, as in setup: ray[train] alone could pull a CUDA build.
	$(RAY_PY) -m pip install --quiet -e '.[torch,ray]' 'torch==$(TORCH_VERSION)' 'ray[train]==$(RAY_VERSION)' pytest pytest-timeout
	touch $(RAY_STAMP)

test-ray: setup-ray
	$(RAY_PY) -m pytest -q tests/ray

# pycollective against Ray's gloo backend across two namespace hosts (root): Ray Train DDP
# steps, ray.util.collective allreduce 4 B and 16 MiB, reducescatter 16 MiB (docs/ray.md).
BENCH_RAY_ARGS ?=
bench-ray: setup-ray
	$(RAY_PY) benchmarks/ray_bench.py $(BENCH_RAY_ARGS) --json benchmarks/results/ray.json

# Fault injection (not part of `test`; several minutes): 50 kill -9 runs, every kind of
# mismatched call, every fuzz target for 2 minutes (the compiled core's under ASan) and
# their corpora against a live job's store, a 100,000-call soak, SIGINT runs,
# 20 launcher runs with a rank killed, 20 kill -9 in a row in one elastic job, the attack
# suite (tests/security) three times over with floods of 2,000 connections, and (root) an
# elastic job across 4 namespace hosts on a 3-member etcd: 3 etcd members lost alone, 20
# hosts killed whole and 10 cut off then killed, each replaced, then the quorum lost.
faults: setup bytecode
	$(PY) tools/faults.py

# Fuzzing (docs/security.md): every target of fuzz/ (a parser that reads a peer's bytes)
# under atheris for FUZZ_SECONDS each, seeded with fuzz/corpus/; arena_words against the
# compiled core built by clang for coverage and AddressSanitizer (out/fuzz/native). What
# a fuzzer finds is written to out/fuzz/<target>/ and fails the run. `make test` runs each
# target for a few seconds, `make faults` for minutes.
FUZZ_SECONDS ?= 60
fuzz: setup bytecode
	$(PY) -m fuzz.run --seconds $(FUZZ_SECONDS) --native

# The main job: when does ring all-reduce replace the parameter server? The 30 MB
# Fashion-MNIST model: accuracy (1 process vs 2 workers, DDP on pycollective, and gradient
# accumulation), the step's communication at 2-4 workers on namespace hosts with 1 Gbit/s
# links (root; loopback otherwise) for ring vs 1 vs W parameter servers, the simulator to
# 256 workers at 1-100 Gbit/s and the crossover rule; a table and two plots in
# out/fashion_mnist (docs/data_parallel.md). DEMO_ARGS="--quick" trains the small CNN.
# Installs Debian's dataset when missing and run as root; FASHION_MNIST_DIR=<dir> also works.
DEMO_ARGS ?=
demo: setup bytecode
	@if [ -z "$$FASHION_MNIST_DIR" ] && ! dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing dataset-fashion-mnist"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
		else \
			echo "demo needs Fashion-MNIST: sudo apt-get install dataset-fashion-mnist" \
				"(or FASHION_MNIST_DIR=<dir with the four IDX files>)"; exit 2; \
		fi; \
	fi
	$(PY) examples/fashion_mnist/demo.py $(DEMO_ARGS)

# Elastic training in one command: 4 workers, one SIGKILLed a third of the way in, the
# survivors go on without a restart, a replacement joins (out/fashion_mnist/elastic_loss.png).
demo-elastic:
	@$(MAKE) --no-print-directory demo DEMO_ARGS="--modes elastic"

# nccl-tests style tables (shared memory, TCP, and torch's gloo side by side) and a plot.
BENCH_ARGS ?= -n 2 -t shm,tcp,gloo
bench: setup bytecode
	$(PY) -m pycollective bench $(BENCH_ARGS) --json benchmarks/results/bench.json \
		--plot benchmarks/results/bench.png

# pycollective beside torch's gloo and OpenMPI (mpi4py) in the same ranks, one run: all_reduce
# 4 B..64 MiB, broadcast/all_gather/reduce_scatter 64 MiB, TCP only, 4 ranks on 2 cores,
# and across two network-namespace hosts (root; 2 hosts x 1 and x 2 ranks, one TCP stream's
# goodput as the reference; COMPARE_ARGS="--xhost-runs 10" for the spread the issue asks).
# Prints markdown tables (the README's), writes benchmarks/results/compare_peers.{json,md};
# then TLS against plain TCP in the same ranks, on loopback and across two namespace hosts
# (benchmarks/results/tls_cost.json, docs/security.md).
# Installs OpenMPI (apt-get) and mpi4py (pip) when missing and run as root.
COMPARE_ARGS ?=
compare: setup bytecode
	$(PY) benchmarks/compare_peers.py $(COMPARE_ARGS) --json benchmarks/results/compare_peers.json \
		--markdown benchmarks/results/compare_peers.md
	$(PY) benchmarks/tls_cost.py --json benchmarks/results/tls_cost.json

# All-reduce and a parameter server across 2, 3 and 4 network-namespace hosts with 1 Gbit/s
# links (tbf both ways), against the cost model: benchmarks/results/multihost.json and
# docs/multihost_scaling.png. Builds namespaces, so it needs root (and iproute2).
MULTIHOST_ARGS ?=
multihost: setup bytecode
	@if [ "$$(id -u)" != 0 ]; then \
		echo "make multihost builds network namespaces (ip netns, tc): run it as root"; exit 2; \
	fi
	$(PY) benchmarks/multihost.py $(MULTIHOST_ARGS)

# torch's own backend test suite (distributed_test.py, shipped in the torch wheel) against the
# "pycollective" backend at world sizes 2 and 3: as pycollective, in gloo's place, and torch's
# gloo for comparison (about 15 minutes here). Reports: benchmarks/results/torch_suite_ws{2,3}.json;
# the numbers are in docs/torch_conformance.md. `make test` runs a subset of it.
TORCH_SUITE_ARGS ?= --mode as-pycollective,in-gloo-place,gloo
torch-suite: setup bytecode
	@status=0; for n in 2 3; do \
		$(PY) tests/torch/torch_suite.py $(TORCH_SUITE_ARGS) --world-size $$n \
			--json benchmarks/results/torch_suite_ws$$n.json || status=1; \
	done; exit $$status

# The compiled core under sanitizers (not part of `test`): pycollective._native built with
# AddressSanitizer + UndefinedBehaviorSanitizer (clang) and with ThreadSanitizer (gcc), each
# into build/sanitize/ (the install in .venv is left alone), and the tests that drive the C
# run under each: the arena's battery, the compiled per-call path, ranks killed mid-call,
# the torch backend's async works (tools/sanitize/run.py lists them and says why). Fails on
# any report. Installs clang, llvm-symbolizer and the runtimes when missing and run as root.
APT_SANITIZE := clang llvm libclang-rt-dev libtsan2
SANITIZE_ARGS ?=
sanitize: setup bytecode
	@$(MAKE) --no-print-directory system-deps APT_SMALL="$(APT_SMALL) $(APT_SANITIZE)"
	$(PY) tools/sanitize/run.py $(SANITIZE_ARGS)

lint: setup lint-c typecheck
	$(VENV)/bin/ruff check .
	# the code's layout too (not the docs' snippets, aligned by hand)
	$(VENV)/bin/ruff format --check src tests benchmarks tools fuzz examples setup.py

# The compiled core built with -Werror (setup.py's -Wall -Wextra -Wconversion) by gcc and
# by clang, each into a temporary directory: the installed extension is not touched, and
# user installs never use -Werror. setup.py's extension is optional (an install without a
# compiler still works), so a failed build shows as a missing library here.
.PHONY: lint-c
lint-c: setup
	@for cc in gcc clang; do \
		command -v $$cc >/dev/null || { echo "lint-c: $$cc is not installed (apt-get install $$cc)"; exit 1; }; \
		tmp=$$(mktemp -d); \
		echo "build pycollective._native: CC=$$cc CFLAGS=-Werror"; \
		CC=$$cc CFLAGS=-Werror $(PY) setup.py -q build_ext --build-temp $$tmp/temp \
			--build-lib $$tmp/lib >$$tmp/log 2>&1; \
		if ls $$tmp/lib/pycollective/_native.*.so >/dev/null 2>&1; then rm -rf $$tmp; else \
			cat $$tmp/log; rm -rf $$tmp; echo "lint-c: $$cc -Werror failed"; exit 1; fi; \
	done

# mypy over src/ (pyproject.toml's [tool.mypy]: strict on the leaves, schedule/, transport/
# but tcp/, and api/; every other module at mypy's defaults).
.PHONY: typecheck
typecheck: setup
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(RAY_VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache .mypy_cache
	rm -f src/pycollective/_native.*.so
	find src tests examples benchmarks tools fuzz -name __pycache__ -type d -prune -exec rm -rf {} +
