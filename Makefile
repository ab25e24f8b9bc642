# The README's two commands: `make demo` runs the main job, `make test` the test suite.
# `lint`, `typecheck` and `test-fast` run in the current environment and install nothing
# (no torch reinstall): the everyday loop once `make test` or `pip install -e '.[dev]'` has run.
PYTHON ?= python3
INSTALL = $(PYTHON) -m pip install torch==2.13.0
PATHS = tracking adapters tests benchmarks

.PHONY: demo test bench lint typecheck test-fast

demo:
	$(INSTALL) -e '.[all]' && cliptrack demo

test:
	$(INSTALL) -e '.[dev]' && $(PYTHON) -m pytest

bench:
	$(INSTALL) -e '.[dev]' && $(PYTHON) benchmarks/run_all.py

lint:
	$(PYTHON) -m ruff check $(PATHS)
	$(PYTHON) -m ruff format --check $(PATHS)

typecheck:
	$(PYTHON) -m mypy tracking adapters

test-fast:
	$(PYTHON) -m pytest -m "not slow"
