# The two commands a fresh machine needs: `make run` (main job, embedded default) and `make test`.
# Both create .venv/ at the repo root when it is missing and install the pinned dependencies.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test lint bench

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev,k8s,bench]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/sc-app run $(ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff check sc_app tests bench
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check sc_app tests bench

bench: $(STAMP)
	bench/run $(ARGS)
