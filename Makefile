# fpx: `make demo` runs fpx's main job on built-in data, `make test` runs the test suite.
# Both create the virtual environment (.venv) and install what they need on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fpx-installed

.PHONY: demo test bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fpx demo

test: $(STAMP)
	$(PY) -m pytest -q -n auto

bench-quick: $(STAMP)
	for b in benchmarks/[!_]*.py; do $(PY) $$b --quick || exit 1; done

bench: $(STAMP)
	for b in benchmarks/[!_]*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
