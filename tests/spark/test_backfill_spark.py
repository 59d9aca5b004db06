"""Silver rebuilds in Spark on real Delta tables (no Kafka): bronze rows as the stream appends them.

The expected rows are written out by hand from the streaming rule (dedup.py's docstring):
the first arrival of a key wins, a later batch's row within a window of a kept row is a
duplicate, even when its event time is earlier.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform.ingest.rebuild import rebuild_silver, replay_dedup
from riverhouse.platform.sink.versions import is_rebuild
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.delta_spark import table_version
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import (
    SILVER_PROPERTIES,
    TableLayout,
    bronze_schema,
    ensure_delta_table,
    silver_schema,
    spark_schema,
)
from tests.conftest import orders_spec

pytestmark = pytest.mark.spark
DAY2 = datetime(2026, 1, 2, tzinfo=UTC)


def t(hours: float) -> datetime:
    return DAY2 + timedelta(hours=hours)


def silver_rows(spark: Any, spec: Any, rows: list[tuple[str, datetime, int, int]]) -> Any:
    """(order_id, event time, batch, offset) -> silver-shaped DataFrame."""
    schema = silver_schema(spec.sources["orders"])
    table = pa.Table.from_pylist(
        [
            {
                "order_id": oid,
                "user_id": "u",
                "amount": 1,
                "price": 1.0,
                "created_at": at,
                "_event_time": at,
                "_event_date": at.date(),
                "_topic": "orders",
                "_partition": 0,
                "_offset": offset,
                "_kafka_timestamp": at,
                "_batch_id": batch,
            }
            for oid, at, batch, offset in rows
        ],
        schema=schema,
    )
    return spark.createDataFrame(table.to_pylist(), spark_schema(schema))


def kept(df: Any) -> list[tuple[str, int]]:
    return sorted((r["order_id"], r["_offset"]) for r in df.select("order_id", "_offset").collect())


def test_replay_keeps_the_first_arrival_across_batches(spark: Any) -> None:
    spec = orders_spec("orders", name="replay")
    candidates = silver_rows(
        spark,
        spec,
        [
            ("A", t(10.5), 0, 1),  # arrived first
            ("A", t(10.0), 1, 2),  # earlier event time, later batch, within 1h of the kept one: dropped
            ("B", t(10.0), 3, 3),  # one batch, two events 30 min apart: the first wins
            ("B", t(10.5), 3, 4),
            ("C", t(10.0), 0, 5),  # C spans more than a window (the walk): 10:00 and 11:30 kept in batch 0
            ("C", t(11.5), 0, 6),
            ("C", t(12.0), 1, 7),  # within 1h of 11:30 kept earlier: dropped
            ("C", t(13.0), 1, 8),  # within 1h of 12:00 taken first in its own batch: dropped, as the stream did
            ("D", t(10.2), 2, 9),  # within 1h of a silver row outside the window: dropped
            ("E", t(10.0), 1, 10),  # 2h after the silver row outside the window: kept
        ],
    )
    context = silver_rows(spark, spec, [("D", t(9.5), 0, 20), ("E", t(8.0), 5, 21)])
    got = replay_dedup(candidates, context, ["order_id"], timedelta(hours=1))
    assert kept(got) == [("A", 1), ("B", 3), ("C", 5), ("C", 6), ("E", 10)]


def record(oid: str, at: datetime, batch: int, offset: int) -> dict[str, Any]:
    payload = {"order_id": oid, "user_id": "u", "amount": 1, "price": 1.0, "created_at": at.isoformat()}
    return {
        "_topic": "orders",
        "_partition": 0,
        "_offset": offset,
        "_kafka_timestamp": at,
        "_key": oid.encode(),
        "_value": json.dumps(payload).encode(),
        "_headers": None,
        "_status": "ok",
        "_reason": None,
        "_event_time": at,
        "_event_date": at.date(),
        "_batch_id": batch,
    }


def test_rebuild_replaces_only_its_window_and_a_second_run_commits_nothing(spark: Any, tmp_path: Path) -> None:
    spec = orders_spec("orders", name="rebuilt")
    settings = Settings.from_env(tmp_path / "home")
    layout = TableLayout(settings.warehouse, spec.name)
    src = spec.sources["orders"]
    bronze = [
        record("a", t(-0.5), 0, 0),  # day 1, outside the window
        record("b", t(1.0), 0, 1),
        record("b", t(0.9), 1, 2),  # a later batch's duplicate with an earlier time: not in silver
        record("c", t(2.0), 1, 3),
        record("c", t(2.0), 1, 3),  # the same Kafka record appended twice (a replayed stream)
        record("d", t(23.9), 2, 4),
        record("e", t(24.1), 2, 5),  # day 3, outside the window
    ]
    bronze_df = spark.createDataFrame(bronze, spark_schema(bronze_schema(src)))
    bronze_df.write.format("delta").partitionBy("_event_date").save(layout.bronze("orders"))
    # Silver lost `c` and `d`, and holds a wrong row in the window and one (kept) outside it.
    silver = silver_rows(
        spark, spec, [("a", t(-0.5), 0, 0), ("b", t(1.0), 0, 1), ("x", t(5.0), 0, 99), ("y", t(24.5), 2, 98)]
    )
    ensure_delta_table(spark, layout.silver("orders"), silver_schema(src), ["_event_date"], SILVER_PROPERTIES)
    silver.write.format("delta").mode("append").save(layout.silver("orders"))
    before = table_version(layout.silver("orders"))

    result = rebuild_silver(spark, spec, settings, "orders", DAY2, DAY2 + timedelta(days=1), log=lambda m: None)
    assert (result.rows, result.rows_before, result.changed) == (3, 2, True)
    assert result.delta_version == before + 1  # one commit
    every = spark.read.format("delta").load(layout.silver("orders"))
    assert kept(every) == [("a", 0), ("b", 1), ("c", 3), ("d", 4), ("y", 98)]
    # The loader recognises the rebuild commit, so it will not load its rows a second time.
    log = DeltaLog(layout.silver("orders"))
    assert is_rebuild(log.commit(before + 1)) and not is_rebuild(log.commit(before))

    again = rebuild_silver(spark, spec, settings, "orders", DAY2, DAY2 + timedelta(days=1), log=lambda m: None)
    assert (again.rows, again.rows_before, again.changed) == (3, 3, False)
    assert table_version(layout.silver("orders")) == before + 1
