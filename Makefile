# The README's two commands: `make demo` runs the main job, `make test` the test suite.
PYTHON ?= python3
INSTALL = $(PYTHON) -m pip install torch==2.13.0

.PHONY: demo test bench

demo:
	$(INSTALL) -e '.[all]' && cliptrack demo

test:
	$(INSTALL) -e '.[dev]' && $(PYTHON) -m pytest

bench:
	$(INSTALL) -e '.[dev]' && $(PYTHON) benchmarks/run_all.py
