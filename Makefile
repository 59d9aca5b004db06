# Every target bootstraps .venv on first use, so a fresh machine needs only
# Python 3.11+ and Java 17+ (PySpark 4).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.riverhouse-installed
PYTEST_ARGS ?=

.PHONY: demo test ui lint install clean java-check chromium bench

install: $(STAMP)

java-check:
	@command -v java >/dev/null 2>&1 || [ -x "$$JAVA_HOME/bin/java" ] || { \
	  echo "Java was not found. PySpark 4 needs Java 17 or newer:"; \
	  echo "  Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless"; \
	  echo "  macOS:         brew install openjdk@17"; \
	  echo "or set JAVA_HOME to an existing JDK 17+."; exit 1; }

$(STAMP): pyproject.toml | java-check
	@echo "==> creating $(VENV) and installing riverhouse (first run takes a few minutes)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | { grep -v "is ignored: it is neither" || true; }
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | { grep -v "is ignored: it is neither" || true; }
	@touch $(STAMP)

demo: $(STAMP) ## the main job on the embedded defaults
	$(BIN)/riverhouse demo

# The UI test drives Debian's chromium (Playwright's own browser download is not reachable here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "==> installing Debian's chromium for the UI test"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; }

test: $(STAMP) chromium ## every test tier: unit, spark, integration, dagster, e2e (UI in Chromium)
	$(BIN)/ruff check src tests
	$(BIN)/pytest $(PYTEST_ARGS)

ui: $(STAMP) ## Dagster UI on http://127.0.0.1:3000 with the local Kafka
	$(BIN)/riverhouse ui

bench: $(STAMP) ## every benchmark scenario; writes bench/results/ and docs/benchmarks.md
	$(BIN)/riverhouse bench

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

clean:
	rm -rf .riverhouse test-output .pytest_cache
