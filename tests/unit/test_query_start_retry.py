"""A query whose foreachBatch worker did not connect back in time is started again (stream._start_query).

Spark gives the worker 10 s to connect back to its JVM and otherwise fails the start before the
query exists (seen once in CI on a loaded machine). The writer here is a stand-in whose start
fails as Spark's does: the rule under test is the run's, not Spark's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.ingest import stream as stream_module
from riverhouse.platform.ingest.stream import _start_query, prepare_stream
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.state.settings import Settings
from tests.conftest import orders_spec_data

# What the Spark Connect client raises (pyspark.errors.exceptions.connect.SparkException's text).
NOT_CONNECTED = "Python worker failed to connect back."


class Conf:
    def __init__(self) -> None:
        self.values: list[tuple[str, str]] = []

    def set(self, key: str, value: str) -> None:
        self.values.append((key, value))


class Session:
    def __init__(self) -> None:
        self.conf = Conf()


class Writer:
    """Each start fails with the next of `failures` (None: it starts and returns a query)."""

    def __init__(self, failures: list[str | None]) -> None:
        self.failures = failures
        self.made = 0
        self.started = 0

    def __call__(self) -> Writer:
        self.made += 1
        return self

    def start(self) -> str:
        self.started += 1
        failure = self.failures.pop(0)
        if failure is not None:
            raise RuntimeError(failure)
        return f"query {self.started}"


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_module, "WORKER_RETRY_WAIT_S", 0.0)


def test_a_worker_that_did_not_connect_back_is_started_again_and_said() -> None:
    spark, writer, said = Session(), Writer([NOT_CONNECTED, None]), []
    query = _start_query(spark, writer, replace_active=False, log=said.append)
    assert query == "query 2"
    assert writer.made == 2  # a new writer for each start
    assert spark.conf.values == [("spark.sql.streaming.stopActiveRunOnRestart", "false")] * 2
    assert len(said) == 1 and "did not connect back" in said[0] and "start 1 of 3" in said[0]


def test_other_failures_are_not_retried() -> None:
    writer = Writer(["[STREAM_FAILED] another query with same id is already active", None])
    with pytest.raises(RuntimeError, match="already active"):
        _start_query(Session(), writer, replace_active=False, log=lambda m: None)
    assert writer.started == 1


def test_the_starts_are_bounded_and_the_last_failure_is_raised() -> None:
    writer = Writer([NOT_CONNECTED] * 5)
    with pytest.raises(RuntimeError, match="failed to connect back"):
        _start_query(Session(), writer, replace_active=True, log=lambda m: None)
    assert writer.started == stream_module.WORKER_START_ATTEMPTS == 3


def test_the_run_fails_with_what_to_do(tmp_path: Path) -> None:
    spec = parse_spec(orders_spec_data("t_worker", name="worker_late"))
    stream = prepare_stream(spec, Settings.from_env(tmp_path / "home").with_(kafka_bootstrap="127.0.0.1:9"), "orders")
    error: Any = stream.failure(RuntimeError(NOT_CONNECTED))
    assert "pipeline 'worker_late', source 'orders'" in str(error)
    assert "3 starts in a row" in str(error) and "engine/logs" in str(error)
