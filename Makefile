# `make test` and `make demo` do all set-up themselves on a fresh machine.
PYTHON ?= python3
PYTHON313 ?= $(shell pyenv prefix 3.13.0 2>/dev/null)/bin/python3.13
# The frozen stand-in of EXO.app is built with it, from either pass (tests/helpers/frozen.py).
export EOG_PYTHON313 := $(PYTHON313)
VENV ?= .venv
VENV313 ?= .venv-3.13
BIN := $(VENV)/bin
BIN313 := $(VENV313)/bin
PYTEST_ARGS ?=
# `make test` runs each test on each interpreter and each backend where it can find
# something (`-m backend`, `-m py313`: the rule is tests/passes.py), not on every
# pairing: one marked for both runs on the portable backend (3.11) and on 3.13 (the
# Linux backend), not a third time on 3.11 and Linux (COMMON_SELECT: unless there is
# no Python 3.13, whose pass then skips); and test_chaos at CHAOS_ROUNDS: 100, which
# cost 34 s of CPU where 200 cost 81 (its sweeps run for as long as its rounds, and
# more rounds overlap more), and every run of `make test` adds its own rounds. `make
# test-full` runs every pass whole, chaos at 200 rounds.
CHAOS_ROUNDS ?= 100
PORTABLE_SELECT ?= -m backend
PY313_SELECT ?= -m py313
ALL_COMMON := -m "backend or py313"
COMMON_SELECT ?= $(if $(wildcard $(PYTHON313)),-m "(backend or py313) and not (backend and py313)",$(ALL_COMMON))
MAIN_SELECT ?=
# How many of lint, typecheck and the passes run side by side (each pass in its own
# confined pid namespace; docs/testing.md has the timings and why four); TEST_JOBS=1
# runs them one after another.
TEST_JOBS ?= 4
# `make coverage` sets this: the same passes under coverage.py.
COVERAGE_RUN ?=
PYTEST_MODULE = $(if $(COVERAGE_RUN),coverage run -m pytest,pytest)
# Bytecode written: the suite starts thousands of Python processes (guardians, stand-in
# workers and runners, CLIs), and with PYTHONDONTWRITEBYTECODE set each one compiled
# this package again, and each pass re-rewrote every test module's asserts: together
# about a fifth of the suite's CPU (docs/testing.md). The bytecode goes beside the
# sources, in `__pycache__/`, which git ignores.
unexport PYTHONDONTWRITEBYTECODE
# pip brings uv into the 3.11 venv, and uv installs everything else into both: from
# its cache, pip took 81 s of CPU for the two venvs and uv takes about 20, most of it
# the 3.11 venv's own pip (docs/testing.md). uv compiles nothing at install either: of
# the 5,000 modules it installs, each is compiled when first imported.
PIP_INSTALL := -q --disable-pip-version-check --no-compile
UV := $(BIN)/uv
# This checkout on sys.path by a plain .pth line, not setuptools' import hook: the hook
# imports pathlib and importlib.util into every Python process at start (24 ms of CPU
# each here, 45 against 21 for `python -c pass`), and the suite starts thousands.
# uv leaves a lock file in its TMPDIR for each checkout it builds: it goes in the venv.
UV_TMP := $(abspath $(VENV))/tmp
UV_INSTALL = mkdir -p $(UV_TMP) && TMPDIR=$(UV_TMP) $(UV) pip install -q --python $(1) --config-settings editable_mode=compat -e

.PHONY: all setup venvs venv-3.13 test test-full coverage coverage-full lint typecheck pytest pytest-single pytest-common pytest-portable pytest-3.13 demo bench soak reach test-exo dist clean

all: test

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_INSTALL) uv

$(BIN)/.installed: pyproject.toml | $(UV)
	$(call UV_INSTALL,$(BIN)/python) '.[test,dev]'
	scripts/ensure-test-packages
	touch $@

# --seed: with pip, which tests run as `sys.executable -m pip`.
$(BIN313)/.installed: pyproject.toml | $(UV)
	$(UV) venv -q --allow-existing --seed --python $(PYTHON313) $(VENV313)
	$(call UV_INSTALL,$(BIN313)/python) '.[test]'
	scripts/ensure-test-packages
	touch $@

setup: $(BIN)/.installed

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# The bench extra (matplotlib) too: bench/ is type-checked, and `make demo` stays light.
typecheck: $(BIN)/.bench-installed
	$(BIN)/basedpyright

# Every pytest run goes through scripts/confined: a private pid namespace where the
# sweeps the tests run see only the processes the suite started (elsewhere the tests
# that run machine-wide sweeps skip, and say why).
CONFINED := scripts/confined

pytest: $(BIN)/.installed
	EOG_CHAOS_ROUNDS=$(CHAOS_ROUNDS) $(CONFINED) $(BIN)/python -m $(PYTEST_MODULE) $(MAIN_SELECT) $(PYTEST_ARGS)

# `make pytest` in two halves that can run side by side: the tests this pass alone
# runs (the integration tests, the pure ones), and those the other passes run again.
pytest-single:
	@$(MAKE) --no-print-directory pytest MAIN_SELECT='-m "not backend and not py313"'

pytest-common:
	@$(MAKE) --no-print-directory pytest MAIN_SELECT='$(COMMON_SELECT)'

# Each pass in thirds (tests/conftest.py's EOG_SHARD: test modules in turn), each in
# its own pid namespace: `make test` runs the twelve parts four at a time, and parts
# this small end about together (docs/testing.md has the timings).
SHARDS := 1 2 3
shard_of = EOG_SHARD=$(lastword $(subst -, ,$(1)))/$(words $(SHARDS))
COMMON_PARTS := $(addprefix pytest-common-,$(SHARDS))
PORTABLE_PARTS := $(addprefix pytest-portable-,$(SHARDS))
PY313_PARTS := $(addprefix pytest-3.13-,$(SHARDS))
SINGLE_PARTS := $(addprefix pytest-single-,$(SHARDS))

$(COMMON_PARTS):
	@$(call shard_of,$@) $(MAKE) --no-print-directory pytest-common

$(PORTABLE_PARTS):
	@$(call shard_of,$@) $(MAKE) --no-print-directory pytest-portable

$(PY313_PARTS): venv-3.13
	@$(call shard_of,$@) $(MAKE) --no-print-directory pytest-3.13

$(SINGLE_PARTS):
	@$(call shard_of,$@) $(MAKE) --no-print-directory pytest-single

# Again on the backend macOS runs (psutil and the standard library only: no /proc,
# pidfd or PR_SET_PDEATHSIG), so that CI runs the Mac's code paths.
pytest-portable: $(BIN)/.installed
	EOG_CHAOS_ROUNDS=$(CHAOS_ROUNDS) EXO_ORPHAN_GUARD_BACKEND=portable \
		$(CONFINED) $(BIN)/python -m $(PYTEST_MODULE) $(PORTABLE_SELECT) $(PYTEST_ARGS)

# exo runs on Python 3.13 only: the code that runs inside exo is tested there too.
venv-3.13: | $(UV)
	@if [ -x "$(PYTHON313)" ]; then $(MAKE) --no-print-directory $(BIN313)/.installed; else \
		echo "pytest-3.13: no Python 3.13 at '$(PYTHON313)' (set PYTHON313=...): skipped"; fi

# (Two recipes: `make -n` runs a line that calls $(MAKE), and the pass is not on it.)
pytest-3.13: venv-3.13
	@if [ -x "$(PYTHON313)" ]; then \
		EOG_CHAOS_ROUNDS=$(CHAOS_ROUNDS) $(CONFINED) $(BIN313)/python -m $(PYTEST_MODULE) $(PY313_SELECT) $(PYTEST_ARGS); fi

# The parts that mostly wait (on the processes they start) first, so that the last
# ones still keep both cores busy: the portable thirds (psutil's waits are slower),
# the common and 3.13 ones, then the single pass's, whose test_chaos loads both.
PARTS := frozen-app $(PORTABLE_PARTS) $(COMMON_PARTS) $(PY313_PARTS) $(SINGLE_PARTS)
.PHONY: $(PARTS)

# The frozen stand-in app (tests/helpers/frozen.py, cached under .cache/), built as a
# job of its own beside the first parts: a minute of CPU that otherwise falls in
# whichever part first needs it, late in the run.
frozen-app: $(BIN)/.installed
	$(BIN)/python -c "from tests.helpers.frozen import frozen_app; frozen_app()"

# Each target's output is shown whole once it ends.
SIDE_BY_SIDE = --no-print-directory -j$(TEST_JOBS) $(if $(filter 1,$(TEST_JOBS)),,--output-sync=target)

# Both venvs are set up, side by side, before anything else runs (an install
# rewrites what a running pass imports): one uv run each, once uv is there.
SET_UP := $(BIN)/.bench-installed venv-3.13

venvs:
	$(MAKE) --no-print-directory -j2 $(SET_UP)

test: venvs
	$(MAKE) $(SIDE_BY_SIDE) venv-3.13 $(PARTS) typecheck lint

FULL := CHAOS_ROUNDS=200 PORTABLE_SELECT= PY313_SELECT= COMMON_SELECT='$(ALL_COMMON)'

test-full: venvs
	$(MAKE) $(SIDE_BY_SIDE) lint typecheck $(PARTS) $(FULL)

# Line and branch coverage of exo_orphan_guard over every process the tests start
# (pyproject.toml's [tool.coverage.run]: subprocess, fork and _exit patched), the
# passes combined. `coverage-full`: the same for `make test-full`'s passes. A test
# that fails under coverage's slower exits still counts what it ran (`make test` is
# what checks the tests): the report comes either way.
coverage: venvs
	rm -f .coverage .coverage.*
	-$(MAKE) -k $(SIDE_BY_SIDE) $(PARTS) COVERAGE_RUN=1 COVERAGE_FILE=$(CURDIR)/.coverage
	$(BIN)/coverage combine -q --data-file=$(CURDIR)/.coverage
	$(BIN)/coverage report --data-file=$(CURDIR)/.coverage

coverage-full: $(SET_UP)
	$(MAKE) --no-print-directory coverage $(FULL)

demo: $(BIN)/.installed
	$(BIN)/python -m exo_orphan_guard.demo

# The whole 3.11 environment in one uv run (the bench extra with the others: one
# resolution, not two), which also makes `$(BIN)/.installed` current.
$(BIN)/.bench-installed: pyproject.toml | $(UV)
	$(call UV_INSTALL,$(BIN)/python) '.[test,dev,bench]'
	scripts/ensure-test-packages
	touch $(BIN)/.installed $@

# Confined too: the hand-over section's exo runners sweep the machine at their start.
bench: $(BIN)/.bench-installed
	$(CONFINED) $(BIN)/python -m bench.run_all

# The guardian left running for an hour (SOAK_SECONDS) under exo churn, confined and
# niced: fails if its memory, fds or threads grow past their slack (bench/soak.py); the
# table goes into docs/benchmarks.md. Not part of `make test`.
SOAK_SECONDS ?= 3600
soak: $(BIN)/.bench-installed
	$(CONFINED) nice $(BIN)/python -m bench.run_all --only soak --soak-seconds $(SOAK_SECONDS)

# Against real exo: EXO_SRC=<git clone of exo-explore/exo> MLX_LM_SRC=<rltakashige/mlx-lm>.
# Builds Python 3.13 venvs with exo's dependencies under .cache/exo-venv (kept).
test-exo: $(BIN)/.installed
	EXO_SRC="$(EXO_SRC)" MLX_LM_SRC="$(MLX_LM_SRC)" $(CONFINED) $(BIN)/pytest tests/test_exo_integration.py tests/test_exo_sweeps.py tests/test_exo_main_thread.py tests/test_exo_steps.py tests/test_exo_guardian.py tests/test_exo_app_quit.py tests/test_exo_ring_orphan.py tests/test_exo_unchanged.py tests/test_exo_bugfix.py tests/test_exo_uv_real.py tests/test_exo_checks.py tests/test_exo_pr.py -v -rs

# Which of exo's trees `patch apply` reaches (bench/reach.py): every STEP-th first-parent
# commit from v1.0.61 to main and every release; results cached by commit in
# bench/results/reach.jsonl, the table in bench/results/reach.md, the picture in
# docs/img/reach.png.
STEP ?= 10
reach: $(BIN)/.bench-installed
	@test -n "$(EXO_SRC)" || { echo "make reach EXO_SRC=<git clone of exo-explore/exo> [STEP=10]"; exit 2; }
	$(BIN)/python -m bench.reach --exo-src "$(EXO_SRC)" --step $(STEP) --python313 "$(PYTHON313)"

# Wheel and sdist into DIST_DIR, then their metadata checked (twine check --strict),
# from a venv of their own holding build and twine only: none of the test or dev
# environment (mlx, pyinstaller, basedpyright) and no system package.
DIST_VENV ?= .venv-dist
DIST_DIR ?= dist

$(DIST_VENV)/bin/.installed:
	$(PYTHON) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/python -m pip install -q --disable-pip-version-check build twine
	touch $@

dist: $(DIST_VENV)/bin/.installed
	rm -rf $(DIST_DIR)
	$(DIST_VENV)/bin/python -m build --outdir $(DIST_DIR) .
	$(DIST_VENV)/bin/twine check --strict $(DIST_DIR)/*

clean:
	rm -rf $(VENV) $(VENV313) $(DIST_VENV) .pytest_cache .ruff_cache dist build .coverage .coverage.*
