# fusec: two commands for a newcomer.  `make demo` runs the main job, `make test` the suite.
# Each installs what it needs (system packages on Debian 12, then a virtualenv), idempotently.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fusec-installed

.PHONY: demo test test-fast lint setup system clean

system:
	bash scripts/setup-system.sh

$(STAMP): pyproject.toml setup.py codegen/shaderc_build.py
	bash scripts/setup-system.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@# bytecode ahead of time, as a wheel install does: where PYTHONDONTWRITEBYTECODE is set,
	@# every fusec command would otherwise compile its modules again (0.2 s a command)
	$(PY) -m compileall -q fusec dsl codegen runtime > /dev/null
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fusec demo kernels.fuse

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# test processes for `make test` (pytest-xdist; each file's tests stay in one process)
JOBS   ?= 2

test: $(STAMP)
	$(MAKE) --no-print-directory lint
	$(VENV)/bin/python -m pytest -n $(JOBS) --dist loadfile --durations=25

# for developers between commits: the suite without the tests marked slow, no lint (under a
# minute on two cores); `make test` stays the whole check
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -m "not slow"

clean:
	rm -rf $(VENV) build .setup-build *.egg-info _fusec_shaderc* fusec/_shaderc*
