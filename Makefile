# `make test` and `make demo` do all set-up themselves on a fresh machine.
PYTHON ?= python3
PYTHON313 ?= $(shell pyenv prefix 3.13.0 2>/dev/null)/bin/python3.13
VENV ?= .venv
VENV313 ?= .venv-3.13
BIN := $(VENV)/bin
BIN313 := $(VENV313)/bin
PYTEST_ARGS ?=

.PHONY: all setup test lint typecheck pytest pytest-portable pytest-3.13 demo bench test-exo dist clean

all: test

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test,dev]'
	scripts/ensure-test-packages
	touch $@

$(BIN313)/.installed: pyproject.toml
	$(PYTHON313) -m venv $(VENV313)
	$(BIN313)/python -m pip install -q --disable-pip-version-check -e '.[test]'
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
	$(CONFINED) $(BIN)/pytest $(PYTEST_ARGS)

# The whole suite again on the backend macOS runs (psutil and the standard library
# only: no /proc, pidfd or PR_SET_PDEATHSIG), so that CI runs the Mac's code paths.
pytest-portable: $(BIN)/.installed
	EXO_ORPHAN_GUARD_BACKEND=portable $(CONFINED) $(BIN)/pytest $(PYTEST_ARGS)

# exo runs on Python 3.13 only: the whole suite runs there too, where it exists.
pytest-3.13:
	@if [ -x "$(PYTHON313)" ]; then \
		$(MAKE) --no-print-directory $(BIN313)/.installed && $(CONFINED) $(BIN313)/pytest $(PYTEST_ARGS); \
	else \
		echo "pytest-3.13: no Python 3.13 at '$(PYTHON313)' (set PYTHON313=...): skipped"; \
	fi

test: lint typecheck pytest pytest-portable pytest-3.13

demo: $(BIN)/.installed
	$(BIN)/python -m exo_orphan_guard.demo

$(BIN)/.bench-installed: $(BIN)/.installed
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[bench]'
	touch $@

bench: $(BIN)/.bench-installed
	$(BIN)/python -m bench.run_all

# Against real exo: EXO_SRC=<git clone of exo-explore/exo> MLX_LM_SRC=<rltakashige/mlx-lm>.
# Builds Python 3.13 venvs with exo's dependencies under .cache/exo-venv (kept).
test-exo: $(BIN)/.installed
	EXO_SRC="$(EXO_SRC)" MLX_LM_SRC="$(MLX_LM_SRC)" $(CONFINED) $(BIN)/pytest tests/test_exo_integration.py tests/test_exo_uv_real.py tests/test_exo_checks.py -v -rs

# Wheel and sdist into dist/, then their metadata checked (twine check --strict).
dist: $(BIN)/.installed
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

clean:
	rm -rf $(VENV) $(VENV313) .pytest_cache .ruff_cache dist build
