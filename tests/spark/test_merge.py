"""Silver dedup with delta-spark: in-batch window functions, window-bounded insert-only MERGE, once per batch."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from delta.tables import DeltaTable

from riverhouse.platform.ingest.dedup import (
    MergeOutcome,
    compact_days,
    dedup_batch,
    dedup_in_batch,
    files_in_days,
    insert_new,
    lookup_days,
)
from riverhouse.platform.state.tables import (
    committed,
    ensure_delta_table,
    open_table,
    read_inserts,
    silver_schema,
    spark_schema,
)
from tests.conftest import orders_spec

pytestmark = pytest.mark.spark
T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
WINDOW = timedelta(hours=1)
SCHEMA = silver_schema(orders_spec("t").sink_source)


def batch(events: list[tuple[str, timedelta, int]]) -> pa.Table:
    times = [T0 + e[1] for e in events]
    data = {
        "order_id": [e[0] for e in events],
        "user_id": ["u"] * len(events),
        "amount": [1] * len(events),
        "price": [1.0] * len(events),
        "created_at": times,
        "_event_time": times,
        "_event_date": [t.date() for t in times],
        "_topic": ["t"] * len(events),
        "_partition": [0] * len(events),
        "_offset": [e[2] for e in events],
        "_kafka_timestamp": times,
        "_batch_id": [0] * len(events),
    }
    return pa.table(data, schema=SCHEMA)


def write(spark: Any, path: str, events: list[tuple[str, timedelta, int]], batch_id: int, app: str = "app") -> Any:
    rows = batch(events)
    df = spark.createDataFrame(rows.to_pylist(), spark_schema(SCHEMA))
    dates = rows.column("_event_date").to_pylist()
    days = lookup_days(min(dates), max(dates), WINDOW)
    return insert_new(spark, path, df, ["order_id"], WINDOW, days, app, batch_id)


def silver_ids(spark: Any, path: str) -> list[tuple[str, int]]:
    return sorted((r[0], r[1]) for r in spark.read.format("delta").load(path).select("order_id", "_offset").collect())


@pytest.fixture
def silver(spark: Any, tmp_path: Path) -> str:
    path = str(tmp_path / "silver")
    ensure_delta_table(spark, path, SCHEMA, ["_event_date"], cdf=True)
    return path


def test_merge_is_window_bounded_and_committed_once(spark: Any, silver: str) -> None:
    assert write(spark, silver, [("a", timedelta(0), 0), ("b", timedelta(0), 1)], 0) == MergeOutcome(2, False)
    # a: 30 minutes later is a duplicate; b: 2 hours later is outside the window -> new; c: new
    out = write(
        spark, silver, [("a", timedelta(minutes=30), 2), ("b", timedelta(hours=2), 3), ("c", timedelta(0), 4)], 1
    )
    assert out == MergeOutcome(2, False)
    assert silver_ids(spark, silver) == [("a", 0), ("b", 1), ("b", 3), ("c", 4)]
    # An event *earlier* than the stored one but inside the window is a duplicate too.
    assert write(spark, silver, [("c", timedelta(minutes=-20), 5)], 2) == MergeOutcome(0, False)
    table = open_table(silver)  # delta-rs reads the app transactions delta-spark wrote
    assert committed(table, "app", 2) and not committed(table, "app", 3)
    assert not committed(table, "other-app", 0)


def test_replaying_a_batch_id_is_skipped_for_merge_and_append(spark: Any, silver: str, tmp_path: Path) -> None:
    """The session's txnAppId/txnVersion make a replayed MERGE a no-op; the writer options do so for appends."""
    events = [("a", timedelta(0), 0), ("b", timedelta(days=3), 1)]
    assert write(spark, silver, events, 0) == MergeOutcome(2, False)
    version = open_table(silver).version()
    # Even rows the table lacks are not inserted: the batch id, not the rows, decides.
    assert write(spark, silver, [("new", timedelta(0), 7)], 0) == MergeOutcome(0, True)
    assert open_table(silver).version() == version
    assert silver_ids(spark, silver) == [("a", 0), ("b", 1)]
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None  # not left behind

    bronze = str(tmp_path / "bronze")
    df = spark.createDataFrame(batch(events).to_pylist(), spark_schema(SCHEMA))
    for _ in range(2):
        df.write.format("delta").mode("append").option("txnAppId", "app").option("txnVersion", 0).save(bronze)
    assert spark.read.format("delta").load(bronze).count() == 2
    df.write.format("delta").mode("append").option("txnAppId", "app").option("txnVersion", 1).save(bronze)
    assert spark.read.format("delta").load(bronze).count() == 4


def test_merge_condition_prunes_partitions_outside_the_window(spark: Any, silver: str) -> None:
    for day in range(6):
        write(spark, silver, [(f"d{day}", timedelta(days=day), day)], day)
    days = lookup_days(date(2026, 1, 6), date(2026, 1, 6), WINDOW)
    # The MERGE's days are day 5 +/- (window + 1 day): 2 of the 6 files, and the stored d5 is found there.
    assert files_in_days(spark, silver, days) == 2
    out = write(spark, silver, [("x", timedelta(days=5), 99), ("d5", timedelta(days=5), 98)], 6)
    assert out == MergeOutcome(1, False)
    assert ("d5", 98) not in silver_ids(spark, silver) and ("x", 99) in silver_ids(spark, silver)
    history = DeltaTable.forPath(spark, silver).history(1).collect()[0]
    # Delta's own metrics: the MERGE rewrote nothing (insert-only) and read only the pruned files.
    assert history["operation"] == "MERGE" and history["operationMetrics"]["numTargetFilesRemoved"] == "0"


def test_in_batch_dedup_in_spark_keeps_what_the_walk_keeps(spark: Any) -> None:
    """Window functions (and the walk for keys spanning more than a window) give the reference's rows."""
    rng = random.Random(7)
    events = [(f"k{rng.randrange(30)}", timedelta(minutes=rng.randrange(0, 300)), i) for i in range(600)]
    events += [("edge", timedelta(0), 1000), ("edge", WINDOW, 1001), ("edge", WINDOW + timedelta(microseconds=1), 1002)]
    events += [("tie", timedelta(0), 1004), ("tie", timedelta(0), 1003)]
    rows = batch(events)
    df = spark.createDataFrame(rows.to_pylist(), spark_schema(SCHEMA))
    got = sorted((r[0], r[1]) for r in dedup_batch(df, ["order_id"], WINDOW).select("order_id", "_offset").collect())
    reference = dedup_in_batch(rows, ["order_id"], WINDOW)
    expected = sorted(
        zip(reference.column("order_id").to_pylist(), reference.column("_offset").to_pylist(), strict=True)
    )
    assert got == expected
    # The window's edge belongs to the window; one microsecond past it is a new event; ties go to the lower offset.
    assert ("edge", 1000) in got and ("edge", 1001) not in got and ("edge", 1002) in got
    assert ("tie", 1003) in got and ("tie", 1004) not in got


def test_compaction_keeps_rows_dedup_and_the_change_feed(spark: Any, silver: str) -> None:
    """OPTIMIZE of the MERGE's days: fewer files, same rows, no change-feed rows, replays still skipped."""
    for i in range(6):  # six batches -> six small files in the day
        write(spark, silver, [(f"k{i}", timedelta(minutes=i), i)], i)
    days = lookup_days(T0.date(), T0.date(), WINDOW)
    assert files_in_days(spark, silver, days) == 6
    rows_before, version_before = silver_ids(spark, silver), open_table(silver).version()

    done = compact_days(spark, silver, days)

    after = open_table(silver)
    assert done == {"files_removed": 6, "files_added": 1} and files_in_days(spark, silver, days) == 1
    assert after.version() == version_before + 1
    assert silver_ids(spark, silver) == rows_before
    # The loader reads the change feed: the OPTIMIZE commit must add no rows to it.
    assert read_inserts(silver, after.version(), after.version(), ["order_id"]).num_rows == 0
    assert committed(after, "app", 5)  # a replayed batch is still skipped ...
    assert write(spark, silver, [("k0", timedelta(0), 50)], 5) == MergeOutcome(0, True)
    # ... and the MERGE still finds stored keys in the compacted file.
    out = write(spark, silver, [("k3", timedelta(minutes=20), 30), ("new", timedelta(0), 31)], 6)
    assert out == MergeOutcome(1, False)


def test_delta_rs_reads_what_delta_spark_writes(spark: Any, silver: str) -> None:
    """Readers that need no JVM (checks, CLI status, issue 18's gold code) keep working on these tables:
    table features, a checkpoint (every 10 commits), the change feed, app transactions."""
    for i in range(12):
        write(spark, silver, [(f"k{i}", timedelta(minutes=i), i)], i)
    assert (Path(silver) / "_delta_log" / "00000000000000000010.checkpoint.parquet").exists()
    table = open_table(silver)
    assert table.version() == 12 and table.transaction_version("app") == 11
    assert sorted(table.to_pyarrow_table(columns=["order_id"]).column("order_id").to_pylist()) == sorted(
        f"k{i}" for i in range(12)
    )
    inserts = read_inserts(silver, 1, 12, ["order_id"])
    assert inserts.num_rows == 12 and sorted(set(inserts.column("_commit_version").to_pylist())) == list(range(1, 13))
    assert "changeDataFeed" in (table.protocol().writer_features or [])
