# Every target bootstraps .venv and the JVM jars on first use, so a fresh machine needs
# Python 3.11+, Java 17+ (PySpark 4, the Kafka broker) and Maven (the jars in jvm/pom.xml).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.riverhouse-installed
JARS := jvm/lib
JARS_STAMP := $(JARS)/.installed
# Riverhouse's own JVM classes (Hadoop's local file system without child processes, a strict
# JSON check: runtime/jvm_build.py), compiled into jvm/lib/spark/ with the fetched jars.
JAVA_SRC := $(wildcard jvm/src/riverhouse/*/*.java)
MVN ?= mvn
PYTEST_ARGS ?=
# Two test processes (pytest-xdist): a test mostly waits on a JVM, a subprocess or the broker,
# so two overlap well on two cores. TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2

.PHONY: demo test ui lint install clean java-check mvn-check jars chromium bench class-archive

install: $(STAMP) $(JARS_STAMP)

java-check:
	@command -v java >/dev/null 2>&1 || [ -x "$$JAVA_HOME/bin/java" ] || { \
	  echo "Java was not found. PySpark 4 needs Java 17 or newer:"; \
	  echo "  Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless"; \
	  echo "  macOS:         brew install openjdk@17"; \
	  echo "or set JAVA_HOME to an existing JDK 17+."; exit 1; }

mvn-check:
	@command -v $(MVN) >/dev/null 2>&1 || { \
	  echo "Maven was not found. Riverhouse fetches its JVM jars (Kafka broker, Spark's Kafka"; \
	  echo "connector, delta-spark; pinned in jvm/pom.xml) from Maven Central with it:"; \
	  echo "  Debian/Ubuntu: sudo apt-get install maven"; \
	  echo "  macOS:         brew install maven"; \
	  echo "or put the jars in a folder yourself and set RIVERHOUSE_JARS (see jvm/README.md)."; exit 1; }

# The jars of each jvm/pom.xml profile in a folder of its own (the broker's kafka-clients 4.x
# must not meet the connector's 3.9.x); Spark's folder then loses what pyspark/jars ships.
# Fetched into a new folder and swapped in whole: a running session never sees half of them.
# jvm/pom.xml (it moves with pyspark's pin in pyproject.toml) or a Java source triggers a new fetch.
$(JARS_STAMP): jvm/pom.xml $(JAVA_SRC) | $(STAMP) mvn-check
	@echo "==> fetching the pinned JVM jars from Maven Central into $(JARS)/ (first run takes a minute)"
	@rm -rf $(JARS).new
	@for profile in spark broker; do \
	  $(MVN) -B -q -Dstyle.color=never -f jvm/pom.xml -P $$profile dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory=$(CURDIR)/$(JARS).new/$$profile || { echo "Maven could not fetch the $$profile jars (see above)"; exit 1; }; \
	done
	@$(BIN)/python -m riverhouse.platform.runtime.jars prune $(JARS).new/spark
	@$(BIN)/python -m riverhouse.platform.runtime.jvm_build build $(JARS).new/spark
	@$(MVN) -B -q -Dstyle.color=never -f jvm/pom.xml -P registry dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory=$(CURDIR)/$(JARS).new/registry-dist || { echo "Maven could not fetch the schema registry (see above)"; exit 1; }
	@mkdir -p $(JARS).new/registry && tar -xzf $(JARS).new/registry-dist/apicurio-registry-app-*-all.tar.gz -C $(JARS).new/registry && rm -rf $(JARS).new/registry-dist
	@touch $(JARS).new/.installed
	@rm -rf $(JARS).old && { [ ! -e $(JARS) ] || mv $(JARS) $(JARS).old; } && mv $(JARS).new $(JARS) && rm -rf $(JARS).old
	@$(MAKE) --no-print-directory class-archive

# The engine's JVM maps the classes its start and a first batch load from an archive (class-data
# sharing): it answers in ~6 s instead of ~9 (runtime/class_archive.py); the local broker's JVM has
# one too. Made once after the jars (an engine started, trained and stopped, then a broker started
# and stopped); again with `make class-archive` after changing the JDK. Best effort: without them
# JVMs start as before.
class-archive: | $(STAMP)
	@echo "==> class-data archives for the engine's and the local broker's JVMs (~60 s)"
	@$(BIN)/riverhouse engine archive || echo "no class-data archive: engines start without one"
	@$(BIN)/riverhouse kafka archive || echo "no class-data archive: local brokers start without one"

jars: $(JARS_STAMP) ## the JVM jars only

# uv (from PyPI, into the venv) installs the same versions as pip in ~65 s instead of ~160 s
# (parallel downloads and unpacking; bytecode compiled as pip does). pip when uv cannot be had.
$(STAMP): pyproject.toml | java-check
	@echo "==> creating $(VENV) and installing riverhouse (first run takes a few minutes)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -m pip install -q --disable-pip-version-check uv >/dev/null 2>&1 && \
	  $(BIN)/uv pip install -q --native-tls --compile-bytecode --python $(BIN)/python -e '.[dev]'; then :; \
	else \
	  echo "(uv could not install them: pip installs the same packages, more slowly)"; \
	  $(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | { grep -v "is ignored: it is neither" || true; }; \
	  $(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | { grep -v "is ignored: it is neither" || true; }; \
	fi
	@touch $(STAMP)

demo: $(STAMP) $(JARS_STAMP) ## the main job on the embedded defaults
	$(BIN)/riverhouse demo

# The UI test drives Debian's chromium (Playwright's own browser download is not reachable here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "==> installing Debian's chromium for the UI test"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; }

test: $(STAMP) $(JARS_STAMP) chromium ## every test tier: unit, spark, integration, dagster, e2e (UI in Chromium)
	$(BIN)/ruff check src tests
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

ui: $(STAMP) $(JARS_STAMP) ## Dagster UI on http://127.0.0.1:3000 with the local Kafka
	$(BIN)/riverhouse ui

# The benchmarks are a package of their own in bench/ (not in the installed product's import path).
# Options: make bench BENCH_ARGS="--events 200000 --scenarios riverhouse_dedup,dedup_state"
BENCH_ARGS ?=
bench: $(STAMP) $(JARS_STAMP) ## every benchmark scenario; writes bench/results/ and docs/benchmarks.md
	PYTHONPATH=$(CURDIR)/bench$${PYTHONPATH:+:$$PYTHONPATH} $(BIN)/python -m riverhouse_bench $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

clean:
	rm -rf .riverhouse test-output .pytest_cache $(JARS) $(JARS).new $(JARS).old
