# The README's two commands: `make demo` runs the main job, `make test` the test suite.
# `lint`, `typecheck` and `test-fast` run in the current environment and install nothing
# (no torch reinstall): the everyday loop once `make test` or `pip install -e '.[dev]'` has run.
PYTHON ?= python3
INSTALL = $(PYTHON) -m pip install torch==2.13.0
PATHS = tracking adapters tests benchmarks research
# mypy reads the installed namespace through a tree of links: tracking/ is `cliptrack`,
# adapters/ is `cliptrack.adapters` (the layout pyproject.toml's package-dir installs)
TYPECHECK_TREE = build/typecheck
# three pytest workers (pytest-xdist) on two cores: a third of the suite's wall time is tests waiting
# (servers restarting, replies held by a proxy, a throttled disk, a browser drawing), which a third
# worker fills (measured side by side: 440-452 s with three workers, 486-489 s with two, 469 s with
# four); tests that share a session fixture run on one worker (xdist_group)
PARALLEL = -n 3 --dist loadgroup
# the tests not marked slow hardly wait: one worker per core (86 s with two workers, 96 s with three)
PARALLEL_FAST = -n 2 --dist loadgroup

.PHONY: demo test bench lint typecheck check test-fast docs-picture stack-envs test-stacks

# installs into the python3 first on PATH: make and activate a virtual environment first to keep it apart
demo:
	@$(PYTHON) -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' || echo "make demo: no virtual environment is active: installing into $$($(PYTHON) -c 'import sys; print(sys.prefix)') (python3 -m venv .venv && . .venv/bin/activate first to keep it apart)"
	$(INSTALL) '.[demo]' && cliptrack demo

# the project's bytecode compiled once before the suite, for every subprocess a test starts to read
# instead of compiling the modules it imports; bytecode is written during the suite even where the
# environment sets PYTHONDONTWRITEBYTECODE, so that the next run's workers find pytest's rewritten
# test modules instead of rewriting them (a third of a worker's collection)
PYTEST = PYTHONDONTWRITEBYTECODE= $(PYTHON) -m pytest
COMPILE = $(PYTHON) -m compileall -q tracking adapters tests benchmarks research

test:
	$(INSTALL) -e '.[dev]' && $(COMPILE) && $(PYTEST) $(PARALLEL)
	$(MAKE) test-stacks PYTHON=$(PYTHON)

# verl 0.9.1 and TRL 1.16 cannot share one environment (nor the dev one): each stack's tests run in an
# environment of its own, built once under .venvs/ (torch from the local wheel, then the stack's extra
# and the test runner); where they are skipped in the main run, here a skip fails (tests/conftest.py)
STACK_ENVS = .venvs
STACKS = verl trl

$(STACK_ENVS)/%/installed: pyproject.toml
	rm -rf $(STACK_ENVS)/$* && $(PYTHON) -m venv $(STACK_ENVS)/$*
	$(STACK_ENVS)/$*/bin/python -m pip install -q torch==2.13.0
	$(STACK_ENVS)/$*/bin/python -m pip install -q -e '.[$*,stack-tests]'
	touch $@

stack-envs: $(foreach s,$(STACKS),$(STACK_ENVS)/$(s)/installed)

test-stacks: stack-envs
	$(foreach s,$(STACKS),CLIPTRACK_REQUIRE_STACK=$(s) PYTHONDONTWRITEBYTECODE= $(STACK_ENVS)/$(s)/bin/python -m pytest -p no:cacheprovider $(wildcard tests/test_$(s)*.py) &&) true

bench:
	$(INSTALL) -e '.[dev]' && $(PYTHON) benchmarks/run_all.py

lint:
	$(PYTHON) -m ruff check $(PATHS)
	$(PYTHON) -m ruff format --check $(PATHS)

typecheck:
	rm -rf $(TYPECHECK_TREE) && mkdir -p $(TYPECHECK_TREE)/cliptrack
	ln -s $(CURDIR)/tracking/* $(TYPECHECK_TREE)/cliptrack/
	ln -s $(CURDIR)/adapters $(TYPECHECK_TREE)/cliptrack/adapters
	MYPYPATH=$(TYPECHECK_TREE) $(PYTHON) -m mypy -p cliptrack

check: lint typecheck

test-fast:
	$(COMPILE) && $(PYTEST) -m "not slow" $(PARALLEL_FAST) --hypothesis-profile fast

# docs/dashboard.png from the demo as it now runs (headless Chromium; tests/test_demo.py checks it)
docs-picture:
	$(PYTHON) -m benchmarks.dashboard_picture
