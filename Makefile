# The two commands a user needs are `make demo` and `make test`; both build .venv when missing.
# torch comes in through constraints.txt (exactly the release CI uses), never through pyproject.toml.

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt
DEMO_DIR ?= runs/demo

.PHONY: demo test test-slow bench lint clean

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), f"optiscope needs Python >= 3.11, found {sys.version.split()[0]}"'
	$(PYTHON) -m venv $(VENV)

# One stamp per install flavour, so `make demo` does not pull the test tools and `make test` adds them later.
$(VENV)/.installed-base: pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP) -e '.[tensorboard,report]'
	@touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP) -e '.[dev]'
	@touch $@ $(VENV)/.installed-base

demo: $(VENV)/.installed-base
	$(PY) -m optiscope demo --out $(DEMO_DIR)

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q

test-slow: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m slow

bench: $(VENV)/.installed-base
	@for b in $(filter-out benchmarks/common.py,$(wildcard benchmarks/*.py)); do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(VENV)/.installed-dev
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .hypothesis
