# The two commands a new user needs (each installs everything first; a second
# install is a stamp check that takes seconds):
#   make demo   - the main job on the embedded toy dataset (no downloads)
#   make test   - the test suite
# and for the everyday loop, make test-fast: the tests not marked slow (no process
# started, no training, no Triton interpreter), in parallel on every core
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?= -q

.PHONY: install demo test test-fast params

install:
	VENV=$(VENV) bash tools/setup/install.sh

demo: install
	$(PY) tools/run_demo.py

test: install
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest tests -m "not slow" -n auto $(PYTEST_ARGS)

params: install
	$(PY) tools/analysis/count_params.py
