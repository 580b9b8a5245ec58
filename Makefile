# Set-up and checks. `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint install mutate

$(BIN)/qbroker-installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $@

install: $(BIN)/qbroker-installed

# The demo needs the package and, where redis-server is missing, fakeredis: not the test and benchmark tools.
$(BIN)/qbroker-demo-installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[embedded]'
	touch $@

# Shows you the page and waits for your answers; DEMO_AUTO=1 answers by itself (CI).
demo: $(BIN)/qbroker-demo-installed
	DEMO_AUTO=$(DEMO_AUTO) $(BIN)/python -m workers.demo

# axe-core for the page's accessibility check (skipped, with a reason, where npm is missing).
tests/web/node_modules/axe-core/axe.min.js: tests/web/package.json
	@if command -v npm >/dev/null; then cd tests/web && npm ci --silent --no-audit --no-fund; fi

# The official MCP TypeScript SDK's client, for test_mcp_ts.py (skipped, with a reason, where npm is missing).
tests/mcp_ts/node_modules/@modelcontextprotocol/sdk/package.json: tests/mcp_ts/package.json
	@if command -v npm >/dev/null; then cd tests/mcp_ts && npm ci --silent --no-audit --no-fund && touch node_modules/@modelcontextprotocol/sdk/package.json; fi

# Three processes, a test file to each: the suite mostly waits on servers and processes of its own.
test: install tests/web/node_modules/axe-core/axe.min.js tests/mcp_ts/node_modules/@modelcontextprotocol/sdk/package.json
	@command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install -y redis-server tmux chromium"; exit 1; }
	$(BIN)/pytest -n 3 --dist loadfile

lint: install
	$(BIN)/ruff check broker broker_adapters workers tests benchmarks examples
	$(BIN)/ruff format --check broker broker_adapters workers tests benchmarks examples
	$(BIN)/mypy

# Every mutation in tests/mutants.toml must be caught by the tests it names.
mutate: install
	@command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install -y redis-server"; exit 1; }
	$(BIN)/python -m tests.mutate
