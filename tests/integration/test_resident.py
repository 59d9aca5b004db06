"""A resident query (orchestration.resident_query) on the shared engine: triggered runs attach to
one query kept running there, each batch is reported by one run, the lag sensor still sees what no
run has published, and crashes of the client or of the batch body lose and double nothing.

Expected rows are the order ids the test produced, not the pipeline's own figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.ingest.resident import RESIDENT_FILE
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import PipelineSpec, parse_spec
from riverhouse.platform.state.checkpoints import checkpoint_dir, read_json
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import orders_spec_data, produce, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT_S = 300


@pytest.fixture(autouse=True)
def _needs_engine(test_engine: str | None) -> None:
    if test_engine is None:
        pytest.skip("a resident query lives on an engine; in-process Spark has none")


def resident_spec(topic: str, **orchestration: Any) -> PipelineSpec:
    data = orders_spec_data(topic, name="resident", max_offsets=400)
    data["orchestration"] = {"resident_query": True, "trigger_interval": "1s", **orchestration}
    return parse_spec(data)


def orders(prefix: str, count: int, copies: int = 1) -> list[tuple[bytes, bytes]]:
    """`count` orders, each sent `copies` times, and one malformed record."""
    out = []
    for i in range(count):
        order = {
            "order_id": f"{prefix}-{i}",
            "user_id": f"u-{i % 7}",
            "amount": i,
            "price": 1.5,
            "created_at": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z",
        }
        out += [(order["order_id"].encode(), json.dumps(order).encode())] * copies
    return [*out, (b"bad", b"{not json")]


def silver_ids(settings: Settings, spec: PipelineSpec) -> list[str]:
    table = open_table(TableLayout(settings.warehouse, spec.name).silver("orders"))
    return sorted(table.to_pyarrow_dataset().to_table(columns=["order_id"]).column("order_id").to_pylist())


def clickhouse_ids(settings: Settings, spec: PipelineSpec) -> list[str]:
    with open_client(settings.clickhouse_dsn) as client:
        return sorted(r[0] for r in client.query(f"SELECT order_id FROM {qualified_table(spec)}").result_rows)


def marker(settings: Settings, spec: PipelineSpec) -> dict[str, Any] | None:
    return read_json(checkpoint_dir(settings, spec.name, "orders") / RESIDENT_FILE)


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def expected(*prefixed: tuple[str, int]) -> list[str]:
    return sorted(f"{prefix}-{i}" for prefix, count in prefixed for i in range(count))


@dataclass
class Resident:
    spec: PipelineSpec
    pipeline: Pipeline
    messages: list[str]


@pytest.fixture
def resident(topic: str, settings: Settings, spark: Any) -> Iterator[Resident]:
    """A resident-query pipeline on the test's topic, reset (its query stopped) at the end."""
    spec, messages = resident_spec(topic), []
    pipeline = Pipeline(spec, settings, spark=spark, log=messages.append)
    yield Resident(spec, pipeline, messages)
    pipeline.reset()


def test_triggered_runs_attach_to_one_resident_query_and_report_each_batch_once(
    kafka: str, topic: str, settings: Settings, spark: Any, resident: Resident
) -> None:
    spec, pipeline, messages = resident.spec, resident.pipeline, resident.messages
    produce(kafka, topic, orders("a", 300, copies=2))
    first = pipeline.publish_ingest("orders").metadata
    started = marker(settings, spec)
    assert started is not None and any("started its resident query" in m for m in messages), messages
    assert (first["records_in"], first["inserted"], first["duplicates_dropped"]) == (601, 300, 300)
    assert first["quarantined"] == 1
    assert silver_ids(settings, spec) == expected(("a", 300))

    # Records that land between runs are read by the query at once, and still count as lag:
    # no run has checked and loaded them yet.
    produce(kafka, topic, orders("b", 100))
    silver = DeltaLog(TableLayout(settings.warehouse, spec.name).silver("orders"))
    wait_for(lambda: len(silver_ids(settings, spec)) == 400, "the resident query to read batch b")
    assert pipeline.lag().total == 101
    second = pipeline.publish_ingest("orders").metadata
    assert marker(settings, spec)["run_id"] == started["run_id"]  # attached, not started again
    assert sum("started its resident query" in m for m in messages) == 1, messages
    assert (second["records_in"], second["inserted"]) == (101, 100)
    assert second["silver_version_before"] == first["silver_version_after"]
    assert second["silver_version_after"] == silver.latest_version()
    assert pipeline.lag().total == 0

    # A run with nothing new reports no batch, and still leaves silver covering Kafka.
    idle = pipeline.publish_ingest("orders").metadata
    assert (idle["records_in"], idle["batches"]) == (0, 0)

    pipeline.publish_clickhouse(None)
    assert clickhouse_ids(settings, spec) == expected(("a", 300), ("b", 100))

    # A changed spec restarts the query: its body was built from the old one.
    changed = Pipeline(spec.model_copy(update={"description": "changed"}), settings, spark=spark, log=messages.append)
    produce(kafka, topic, orders("c", 50))
    third = changed.publish_ingest("orders").metadata
    assert any("restarting its resident query (the spec or release changed)" in m for m in messages), messages
    restarted = marker(settings, spec)
    assert restarted["run_id"] != started["run_id"]
    assert str(spark.streams.get(restarted["query_id"]).runId) == restarted["run_id"]  # the old one stopped
    assert third["inserted"] == 50
    assert silver_ids(settings, spec) == expected(("a", 300), ("b", 100), ("c", 50))
    pipeline.reset()
    assert any("stopped the resident query" in m for m in messages), messages
    # Other tests' resident queries may run in the same engine session: this one's is gone.
    assert not [q for q in spark.streams.active if str(q.runId) == restarted["run_id"]]


def test_a_backfill_and_a_run_of_its_own_stop_the_resident_query_and_the_next_trigger_restarts_it(
    kafka: str, topic: str, settings: Settings, spark: Any, resident: Resident
) -> None:
    from datetime import UTC, datetime, timedelta

    from riverhouse.platform.state.windows import Window

    spec, pipeline, messages = resident.spec, resident.pipeline, resident.messages
    produce(kafka, topic, orders("a", 200))
    pipeline.publish_ingest("orders")
    first = marker(settings, spec)
    day = datetime(2026, 1, 1, tzinfo=UTC)
    pipeline.rebuild_silver("orders", Window(day, day + timedelta(days=1)))
    assert marker(settings, spec) is None
    assert (query := spark.streams.get(first["query_id"])) is None or not query.isActive
    produce(kafka, topic, orders("b", 50))
    assert pipeline.publish_ingest("orders").metadata["inserted"] == 50
    second = marker(settings, spec)["run_id"]
    assert second != first["run_id"]

    # `riverhouse run` (a query of its own) takes the checkpoint over; its batches are published.
    produce(kafka, topic, orders("c", 30))
    summary = pipeline.run()
    assert summary["inserted"] == 30
    assert pipeline.lag().total == 0
    produce(kafka, topic, orders("d", 20))
    fourth = pipeline.publish_ingest("orders").metadata
    assert (fourth["records_in"], fourth["inserted"]) == (21, 20)
    assert any("restarting its resident query (another run took over)" in m for m in messages) or (
        marker(settings, spec)["run_id"] != second
    ), messages
    assert silver_ids(settings, spec) == expected(("a", 200), ("b", 50), ("c", 30), ("d", 20))
    assert clickhouse_ids(settings, spec) == expected(("a", 200), ("b", 50), ("c", 30))  # run loaded c
    pipeline.publish_clickhouse(None)
    assert clickhouse_ids(settings, spec) == expected(("a", 200), ("b", 50), ("c", 30), ("d", 20))


CLIENT = """
import sys
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.spec import load_spec
from riverhouse.platform.state.settings import Settings
Pipeline(load_spec(sys.argv[1]), Settings.from_env(), log=print).publish_ingest("orders")
"""


def test_a_client_killed_while_it_waits_leaves_the_query_running_and_the_next_trigger_attaches(
    tmp_path: Path, kafka: str, topic: str, settings: Settings, spark: Any, test_engine: str
) -> None:
    spec = resident_spec(topic)
    path = tmp_path / "resident.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    produce(kafka, topic, orders("a", 800, copies=2))
    env = subprocess_env(
        settings, RIVERHOUSE_SPARK_REMOTE=test_engine, RIVERHOUSE_STALL_AT="after_bronze_commit", RIVERHOUSE_STALL_S="6"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pipeline = Pipeline(spec, settings, spark=spark, log=lambda m: None)
    try:
        checkpoint = checkpoint_dir(settings, spec.name, "orders")
        try:
            # Its query runs and its first batch is in flight (stalled after bronze): kill the client.
            wait_for(lambda: marker(settings, spec) and list((checkpoint / "writing").glob("*.json")), "batch 0")
            assert proc.poll() is None
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kept = marker(settings, spec)
        assert spark.streams.get(kept["query_id"]).isActive  # the engine kept it
        ingested = pipeline.publish_ingest("orders").metadata
        assert marker(settings, spec)["run_id"] == kept["run_id"]
        assert ingested["inserted"] == 800 and ingested["records_in"] == 1601  # every batch, reported once
        assert silver_ids(settings, spec) == expected(("a", 800))
        pipeline.publish_clickhouse(None)
        assert clickhouse_ids(settings, spec) == expected(("a", 800))
    finally:
        pipeline.reset()


def test_the_batch_body_killed_mid_batch_fails_the_query_and_the_next_trigger_restarts_it_exactly(
    tmp_path: Path, kafka: str, topic: str, settings: Settings, spark: Any
) -> None:
    spec = resident_spec(topic)
    produce(kafka, topic, orders("a", 300))
    crashing = Pipeline(spec, settings, spark=spark, log=lambda m: None)
    os.environ.update(RIVERHOUSE_CRASH_AT="after_silver_commit", RIVERHOUSE_CRASH_ON="1")
    try:
        with pytest.raises(Exception, match=r"failed|engine|worker|Python"):
            crashing.publish_ingest("orders")  # the body's process is killed after silver's commit
    finally:
        for name in ("RIVERHOUSE_CRASH_AT", "RIVERHOUSE_CRASH_ON"):
            os.environ.pop(name, None)
    pipeline = Pipeline(spec, settings, spark=spark, log=lambda m: None)
    try:
        produce(kafka, topic, orders("b", 100))
        ingested = pipeline.publish_ingest("orders").metadata
        assert ingested["replayed"] > 0  # the killed batch had reached silver: recognised, not doubled
        assert silver_ids(settings, spec) == expected(("a", 300), ("b", 100))
        pipeline.publish_clickhouse(None)
        assert clickhouse_ids(settings, spec) == expected(("a", 300), ("b", 100))
    finally:
        pipeline.reset()
