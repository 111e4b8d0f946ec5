SHELL := /bin/bash
# The two commands a user needs are `make demo` and `make test`; both build .venv when missing.
# torch comes in through constraints.txt (exactly the release CI uses), never through pyproject.toml.

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt
DEMO_DIR ?= runs/demo

.PHONY: demo test test-slow bench lint docs docs-serve clean

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), f"optiscope needs Python >= 3.11, found {sys.version.split()[0]}"'
	$(PYTHON) -m venv $(VENV)

# One stamp per install flavour, so `make demo` does not pull the test tools and `make test` adds them later.
$(VENV)/.installed-base: pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP) -e '.[tensorboard,report]'
	@touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP) -e '.[dev]'
	@touch $@ $(VENV)/.installed-base $(VENV)/.installed-docs

$(VENV)/.installed-docs: pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP) -e '.[docs]'
	@touch $@

demo: $(VENV)/.installed-base
	$(PY) -m optiscope demo --out $(DEMO_DIR)

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -n auto --dist loadfile --durations=15

test-slow: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m slow

bench: $(VENV)/.installed-base
	@for b in $(filter-out benchmarks/common.py,$(wildcard benchmarks/*.py)); do echo "== $$b"; $(PY) $$b || exit 1; done

# only the problems are shown, one line each naming the page and why; --strict makes any of them fail the build
docs: $(VENV)/.installed-docs
	@set -o pipefail; NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict 2>&1 | { grep -v '^INFO' || true; }
	@echo "docs: file://$(CURDIR)/site/index.html"

docs-serve: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

lint: $(VENV)/.installed-dev
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache .hypothesis
