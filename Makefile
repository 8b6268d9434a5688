# Two commands matter: `make run` (local units + gateway) and `make test` (lint + every test).
# Both create .venv on first use. constraints.txt pins install-time versions (torch's CPU build).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test lint format bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml constraints.txt | $(PY)
	$(PIP) install -q -e '.[engine]' -c constraints.txt
	touch $@

$(TEST_STAMP): pyproject.toml constraints.txt | $(PY)
	$(PIP) install -q -e '.[test,engine,loadtest]' -c constraints.txt
	touch $@ $(RUN_STAMP)

run: $(RUN_STAMP)
	$(VENV)/bin/unitgate up --config config.toml

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -q

format: $(TEST_STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(TEST_STAMP)
	$(PY) -m loadtest.bench_overhead --out bench-out

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache bench-out
