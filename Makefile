# The two commands of the README: `make demo` runs the main job, `make test` the test suite.
PYTHON ?= python3
PIP = $(PYTHON) -m pip
TORCH_PIN = torch==2.13.0

.PHONY: install install-dev demo test lint typecheck bench

install:
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[all]'

install-dev:
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[dev]'

demo: install
	cliptrack demo

lint:
	$(PYTHON) -m ruff check tracking adapters tests benchmarks

typecheck:
	$(PYTHON) -m mypy tracking adapters

test: install-dev lint typecheck
	$(PYTHON) -m pytest

bench: install-dev
	$(PYTHON) benchmarks/run_all.py
