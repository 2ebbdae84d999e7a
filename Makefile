# forkserve: `make run` serves the demo model, `make test` runs the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test unit e2e install system-deps lint clean

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

install: $(BIN)/.installed

system-deps:
	scripts/install-system-deps.sh

run: install
	$(BIN)/gunicorn -c gunicorn.conf.py

test: install system-deps
	$(BIN)/python -m pytest

unit: install
	$(BIN)/python -m pytest tests/unit

e2e: install system-deps
	$(BIN)/python -m pytest tests/e2e

lint: install
	$(BIN)/ruff check --select F,E9 server tests bench scripts gunicorn.conf.py

clean:
	rm -rf $(VENV) .pytest_cache
