"""Shared fixtures: one SparkSession per test session, one real local Kafka broker (Apache Kafka, KRaft).

Each test gets its own topic and its own state folder (warehouse, checkpoints,
chDB path), so tests share the expensive parts without sharing data.

One engine (`riverhouse engine start`, a Spark Connect server under a temporary home) serves
the whole test run, both xdist workers included: the `spark` fixture, Settings made in the test
processes and the subprocesses of `subprocess_env` attach to it (RIVERHOUSE_SPARK_REMOTE), so no
test process pays a JVM start and the JIT warms up once. RIVERHOUSE_TEST_ENGINE=local runs Spark in-process in each process instead
(the product's fallback when no engine is configured).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.runtime.interpreter_exit import skip_final_collection
from riverhouse.platform.spec import PipelineSpec, parse_spec
from riverhouse.platform.state.settings import Settings

REPO = Path(__file__).resolve().parent.parent
skip_final_collection()  # the test processes exit without their last full collection, as the CLI does
# A suite started in the background by a non-interactive shell (`make test &` in a script) ignores
# SIGINT, and every process a test starts inherits that. Some then stop slowly: Dagster's cleanup of
# a step's compute-log `tail` waited out its 30 s timeout (tests/dagster_assets/test_demo_steps.py:
# 62 s instead of 2), and other teardowns took 30 s more. Tests run as they do from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


TEST_ENGINE = os.environ.get("RIVERHOUSE_TEST_ENGINE", "connect").strip().lower() != "local"
# What makes a process a Spark Connect client (pyspark sets the first once it made a session):
# a subprocess chooses for itself, from RIVERHOUSE_SPARK_REMOTE.
CONNECT_CLIENT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
ENGINE_DIR: list[Path] = []  # the shared engine's state folder (settings file, logs), once started


# The shared engine's heap: it serves both test processes of `make test` at once.
SHARED_ENGINE_MEMORY = "3g"


# The JVMs a single test starts (its own engine, broker, registry, Spark cluster, in-process
# Spark, the CLI's subprocesses) compile with HotSpot's C1 only: they live for seconds to a
# couple of minutes on kilobytes of data, and C2's optimizing compiler never earns back its
# cost there (an engine's start and four 3,000-record runs: 109 CPU seconds with C2, 80 with C1
# only; bench/analysis.md). The shared engine serves the whole run and keeps C2: with C1 only
# it used twice the CPU over a full run. Only how fast compiled code runs changes; the benchmarks
# (bench/) keep the JVM's defaults. A JAVA_TOOL_OPTIONS of the caller's is kept. The code cache
# keeps its tiered size: with C1 only HotSpot reserves 48 MB, which Spark's generated code can
# fill (runtime/engine.py, SHORT_LIVED_JAVA_OPTIONS).
TEST_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def _short_lived_jvms_use_c1() -> None:
    current = os.environ.get("JAVA_TOOL_OPTIONS", "")
    if "TieredStopAtLevel" not in current:
        os.environ["JAVA_TOOL_OPTIONS"] = f"{current} {TEST_JIT}".strip()


def _xdist_worker() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def shared_engine_dir(basetemp: Path) -> Path:
    """The engine's state folder, in the run's temporary root that every xdist worker shares."""
    return basetemp / "shared-engine"


@pytest.fixture(scope="session", autouse=True)
def test_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """The session's shared engine URL, or None with RIVERHOUSE_TEST_ENGINE=local (in-process Spark).

    Under xdist every worker attaches to one engine: the first to get the lock starts it, the
    others find it running; the controller stops it when the whole run ends
    (`pytest_sessionfinish`). One JVM warms up (JIT) once and holds one heap, instead of one per
    worker. Without xdist the fixture stops it itself.
    """
    if not TEST_ENGINE:
        yield None
        return
    from riverhouse.platform.runtime import engine
    from riverhouse.platform.runtime.spark import REMOTE_ENV

    base = tmp_path_factory.getbasetemp()
    state_dir = shared_engine_dir(base.parent if _xdist_worker() else base)
    state_dir.mkdir(parents=True, exist_ok=True)
    with _locked(state_dir.parent / "shared-engine.lock"):
        url = engine.start(state_dir, memory=SHARED_ENGINE_MEMORY).url
    _short_lived_jvms_use_c1()  # every JVM started from here on (not the shared engine above)
    ENGINE_DIR.append(state_dir)
    previous = os.environ.get(REMOTE_ENV)
    os.environ[REMOTE_ENV] = url
    try:
        yield url
    finally:
        if previous is None:
            os.environ.pop(REMOTE_ENV, None)
        else:
            os.environ[REMOTE_ENV] = previous
        if not _xdist_worker():
            engine.stop(state_dir)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller, once every worker is done: stop the engine the workers shared."""
    if not TEST_ENGINE or hasattr(session.config, "workerinput"):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or getattr(session.config.option, "numprocesses", None) in (None, 0):
        return
    from riverhouse.platform.runtime import engine

    engine.stop(shared_engine_dir(factory.getbasetemp()))


@pytest.fixture(scope="session")
def spark(test_engine: str | None) -> Any:
    from riverhouse.platform.runtime.spark import get_spark, release_session

    if test_engine:
        session = get_spark(conf={"spark.remote": test_engine})
        yield session
        release_session(session)
        return
    session = get_spark("local[2]", app_name="riverhouse-tests")
    yield session
    session.stop()


@pytest.fixture
def own_spark(spark: Any) -> Any:
    """A session no other process uses, for a test that changes a session setting: through the
    engine, the `spark` session is shared by every process with the same settings (runtime/spark.py)."""
    from riverhouse.platform.runtime.spark import is_connect, own_session, release_session

    if not is_connect(spark):
        yield spark  # in-process: this worker's alone
        return
    session = own_session(spark)
    yield session
    release_session(session)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of the real local broker (Apache Kafka from jvm/lib/broker, one JVM for the session)."""
    state_dir = tmp_path_factory.mktemp("kafka")
    state = local_kafka.start(state_dir)
    yield state.bootstrap
    local_kafka.stop(state_dir)


@pytest.fixture
def topic() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def settings(tmp_path: Path, kafka: str) -> Settings:
    return Settings.from_env(tmp_path / "home").with_(kafka_bootstrap=kafka)


def orders_spec(
    topic: str, name: str = "orders_test", window: str = "1h", max_offsets: int = 200_000, **sink: Any
) -> PipelineSpec:
    return parse_spec(orders_spec_data(topic, name, window, max_offsets, **sink))


def orders_spec_data(
    topic: str, name: str = "orders_test", window: str = "1h", max_offsets: int = 200_000, **sink: Any
) -> dict[str, Any]:
    """The test orders pipeline as spec YAML would hold it."""
    return {
        "name": name,
        "kafka": {"bootstrap_servers": "local", "max_offsets_per_trigger": max_offsets},
        "sources": {
            "orders": {
                "topic": topic,
                "fields": {
                    "order_id": "string",
                    "user_id": "string",
                    "amount": "int",
                    "price": "double",
                    "created_at": "timestamp",
                },
                "key": ["order_id"],
                "event_time": {"field": "created_at"},
                "dedup": {"key": ["order_id"], "window": window},
            }
        },
        "sink": {"table": f"{name}_orders", "order_by": ["order_id"], "batch_size": sink.get("batch_size", 1000)},
    }


def produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, bytes | None]],
    partition: int | None = None,
    config: dict[str, str] | None = None,
) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3, **(config or {})})
    for key, value in records:
        if partition is None:
            producer.produce(topic, key=key, value=value)
        else:
            producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def order(
    order_id: str, created_at: str, amount: int = 1, user_id: str = "u1", price: float = 9.5
) -> tuple[bytes, bytes]:
    payload = {"order_id": order_id, "user_id": user_id, "amount": amount, "price": price, "created_at": created_at}
    return order_id.encode(), json.dumps(payload).encode()


def riverhouse_cmd() -> list[str]:
    return [sys.executable, "-m", "riverhouse.cli"]


def subprocess_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERHOUSE_") and k not in CONNECT_CLIENT_ENV}
    env.update({"RIVERHOUSE_HOME": str(settings.home), "RIVERHOUSE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap or ""})
    if TEST_ENGINE and os.environ.get("RIVERHOUSE_SPARK_REMOTE"):  # the shared test engine
        env["RIVERHOUSE_SPARK_REMOTE"] = os.environ["RIVERHOUSE_SPARK_REMOTE"]
    env.update(extra)
    return env
