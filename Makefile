# Set-up and checks. `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint install

$(BIN)/qbroker-installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $@

install: $(BIN)/qbroker-installed

demo: install
	$(BIN)/python -m workers.demo

test: install
	@command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install -y redis-server tmux chromium"; exit 1; }
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check broker broker_adapters workers tests benchmarks examples
	$(BIN)/ruff format --check broker broker_adapters workers tests benchmarks examples
	$(BIN)/mypy
