"""Silver dedup with delta-spark: in-batch window functions, an anti-join with silver's window, once per batch.

The expected rows are written out by hand from the rule (first event per key within the window
wins; a row silver already holds wins over a later one), or come from the reference walk
(`dedup_in_batch`, plain Arrow) for the randomized batch.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform.ingest.dedup import _ranked_with_span, dedup_batch, dedup_in_batch, insert_new
from riverhouse.platform.state.delta_log import MARK_APP, MARK_BATCH, DeltaLog, overlapping
from riverhouse.platform.state.delta_spark import Appended
from riverhouse.platform.state.tables import (
    SILVER_PROPERTIES,
    ensure_delta_table,
    open_table,
    read_inserts,
    silver_properties,
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


def write(
    spark: Any, path: str, events: list[tuple[str, timedelta, int]], batch_id: int, app: str = "app"
) -> int | None:
    """The batch through the ingest's silver step, with its key range as the writer observes it;
    returns the rows appended (None: the batch was replayed)."""
    rows = batch(events)
    df = spark.createDataFrame(rows.to_pylist(), spark_schema(SCHEMA))
    times = rows.column("_event_time").to_pylist()
    bounds = (min(times) - WINDOW, max(times) + WINDOW)
    keys = [e[0] for e in events]
    out: Appended = insert_new(
        path, df, ["order_id"], WINDOW, bounds, app, batch_id, key_range=("order_id", min(keys), max(keys))
    )
    return out.rows


def silver_ids(spark: Any, path: str) -> list[tuple[str, int]]:
    return sorted((r[0], r[1]) for r in spark.read.format("delta").load(path).select("order_id", "_offset").collect())


@pytest.fixture
def silver(spark: Any, tmp_path: Path) -> str:
    path = str(tmp_path / "silver")
    ensure_delta_table(spark, path, SCHEMA, ["_event_date"], silver_properties(orders_spec("t").sink_source))
    return path


def test_batches_keep_the_first_event_per_key_and_window(spark: Any, silver: str) -> None:
    assert (
        write(spark, silver, [("a", timedelta(0), 0), ("b", timedelta(0), 1), ("a", timedelta(minutes=5), 2)], 0) == 2
    )
    # A later batch: 'a' within the window of the stored one is a duplicate; 'a' two hours later is new.
    out = write(
        spark, silver, [("a", timedelta(minutes=50), 3), ("a", timedelta(hours=2), 4), ("c", timedelta(0), 5)], 1
    )
    assert out == 2
    # An event older than the stored one but within its window is a duplicate too (late arrival).
    assert write(spark, silver, [("b", timedelta(minutes=-20), 6)], 2) == 0
    assert silver_ids(spark, silver) == [("a", 0), ("a", 4), ("b", 1), ("c", 5)]


def test_a_two_column_key_matches_silver_only_on_both_columns(spark: Any, silver: str) -> None:
    """Key (order_id, user_id): a stored row suppresses a later one only when both columns are equal
    and the event times are within the window."""

    def write_users(events: list[tuple[str, str, timedelta, int]], batch_id: int) -> int | None:
        rows = batch([(order, at, offset) for order, _, at, offset in events])
        rows = rows.set_column(1, "user_id", pa.array([user for _, user, _, _ in events]))
        df = spark.createDataFrame(rows.to_pylist(), spark_schema(SCHEMA))
        times = rows.column("_event_time").to_pylist()
        bounds = (min(times) - WINDOW, max(times) + WINDOW)
        return insert_new(silver, df, ["order_id", "user_id"], WINDOW, bounds, "app", batch_id).rows

    assert write_users([("a", "u1", timedelta(0), 0), ("a", "u2", timedelta(0), 1)], 0) == 2
    later = [
        ("a", "u1", timedelta(minutes=30), 2),  # both columns stored, within the window: a duplicate
        ("a", "u3", timedelta(minutes=30), 3),  # order_id stored, user_id not: new
        ("b", "u1", timedelta(minutes=30), 4),  # user_id stored, order_id not: new
        ("a", "u2", timedelta(hours=2), 5),  # both stored, beyond the window: new
    ]
    assert write_users(later, 1) == 3
    stored = spark.read.format("delta").load(silver).select("order_id", "user_id", "_offset").collect()
    assert sorted(tuple(r) for r in stored) == [
        ("a", "u1", 0),
        ("a", "u2", 1),
        ("a", "u2", 5),
        ("a", "u3", 3),
        ("b", "u1", 4),
    ]


def test_a_replayed_batch_is_skipped_by_its_mark_in_the_log(spark: Any, silver: str) -> None:
    events = [("a", timedelta(0), 0), ("b", timedelta(0), 1)]
    assert write(spark, silver, events, 0) == 2
    version = DeltaLog(silver).latest_version()
    # The same batch id again (a crash after silver's commit, before Spark's): nothing is written,
    # even with rows that would otherwise be new.
    assert write(spark, silver, [("new", timedelta(0), 7)], 0) is None
    assert DeltaLog(silver).latest_version() == version
    assert silver_ids(spark, silver) == [("a", 0), ("b", 1)]
    # Another stream (another app id) is not mistaken for this one.
    assert write(spark, silver, [("new", timedelta(0), 7)], 0, app="other-app") == 1
    commit = DeltaLog(silver).commit(DeltaLog(silver).latest_version())
    assert (commit.user_metadata[MARK_APP], commit.user_metadata[MARK_BATCH]) == ("other-app", 0)
    # Neither Delta app transactions nor session settings are used: nothing for another pipeline to see.
    assert not commit.txns
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None


def test_only_silver_rows_within_the_batchs_window_are_read(spark: Any, silver: str) -> None:
    for day in range(6):
        write(spark, silver, [(f"d{day}", timedelta(days=day), day)], day)
    # A batch on day 5: the stored d5 is found (a duplicate), and a d0 far outside the window is new.
    out = write(
        spark, silver, [("x", timedelta(days=5), 99), ("d5", timedelta(days=5), 98), ("d0", timedelta(days=5), 97)], 6
    )
    assert out == 2
    assert ("d5", 98) not in silver_ids(spark, silver) and {("x", 99), ("d0", 97)} <= set(silver_ids(spark, silver))
    # Only the files whose day and event-time statistics overlap the batch's window are read.
    day5 = T0 + timedelta(days=5)
    files = overlapping(silver, "_event_time", day5 - WINDOW, day5 + WINDOW, "_event_date").paths
    assert files and all("_event_date=2026-01-06" in f for f in files), files
    assert overlapping(silver, "_event_time", T0 + timedelta(days=9), T0 + timedelta(days=9), "_event_date").paths == []


def test_only_silver_files_within_the_batchs_key_range_are_read(spark: Any, silver: str) -> None:
    """Keys that grow with time: a batch reads only the files whose key statistics overlap its own
    keys. Delta keeps string statistics to 32 characters: a file of longer keys is still found."""
    long, wide = "p" * 40, "\u20ac\U0001f600" * 20  # 40 characters; the second, 40 of 2 to 4 bytes each
    for batch_id, keys in enumerate([["a1", "a2"], ["m1", "m2"], [long + "a", long + "z"], [wide + "a", wide + "z"]]):
        write(spark, silver, [(k, timedelta(minutes=i), 10 * batch_id + i) for i, k in enumerate(keys)], batch_id)

    def chosen(lowest: str, highest: str) -> list[str]:
        files = overlapping(
            silver, "_event_time", T0 - WINDOW, T0 + WINDOW, "_event_date", key_range=("order_id", lowest, highest)
        ).paths
        return sorted(r[0] for r in spark.read.parquet(*files).select("order_id").collect()) if files else []

    assert chosen("a0", "z") == ["a1", "a2", "m1", "m2", long + "a", long + "z"]
    assert chosen("\u20ac", "\U0010ffff") == [wide + "a", wide + "z"]
    assert chosen("a0", "m9") == ["a1", "a2", "m1", "m2"]
    assert chosen("m0", "m9") == ["m1", "m2"]
    assert chosen("b", "l") == []
    assert chosen("m2", long + "b") == ["m1", "m2", long + "a", long + "z"]
    # Within the long keys' 32-character prefix, beyond their truncated statistics' exact values.
    assert chosen(long + "m", long + "m") == [long + "a", long + "z"]
    # Beyond the 32 characters the statistics keep, a key cannot be told apart: its file is read.
    assert chosen(long + "zz", long + "zz") == [long + "a", long + "z"]
    assert chosen("q", "r") == []
    assert chosen(wide + "m", wide + "m") == [wide + "a", wide + "z"]  # truncated statistics, non-ASCII
    assert chosen(wide + "\U0010ffff", wide + "\U0010ffff") == [wide + "a", wide + "z"]
    # A batch of a stored key and a new one: the stored one is found in the only file read.
    assert write(spark, silver, [("m2", timedelta(minutes=3), 90), ("n1", timedelta(minutes=3), 91)], 4) == 1
    assert write(spark, silver, [(long + "z", timedelta(minutes=3), 92)], 5) == 0
    assert ("n1", 91) in silver_ids(spark, silver) and ("m2", 90) not in silver_ids(spark, silver)


def test_an_integer_keys_range_narrows_the_files_too(spark: Any, tmp_path: Path) -> None:
    """Integer statistics (an `int` key's are int32 in the log) against the batch's Python ints."""
    from pyspark.sql import functions as F

    path = str(tmp_path / "ints")
    for lo in (0, 100, 200):
        (
            spark.range(lo, lo + 10)
            .select(
                F.col("id").cast("int").alias("k"),
                F.lit(T0).alias("_event_time"),
                F.lit(T0.date()).alias("_event_date"),
            )
            .coalesce(1)
            .write.format("delta")
            .partitionBy("_event_date")
            .option("delta.dataSkippingStatsColumns", "_event_time,k")
            .mode("append")
            .save(path)
        )

    def chosen(lowest: int, highest: int) -> list[int]:
        files = overlapping(
            path, "_event_time", T0 - WINDOW, T0 + WINDOW, "_event_date", key_range=("k", lowest, highest)
        ).paths
        return sorted({r[0] // 100 for r in spark.read.parquet(*files).select("k").collect()}) if files else []

    assert chosen(5, 105) == [0, 1]
    assert chosen(109, 109) == [1] and chosen(110, 199) == [] and chosen(-5, 2**40) == [0, 1, 2]


@pytest.mark.parametrize("read_twice", [True, False], ids=["one-window-pass", "count-first"])
def test_in_batch_dedup_in_spark_keeps_what_the_walk_keeps(spark: Any, read_twice: bool) -> None:
    """Window functions (and the walk for keys spanning more than a window) give the reference's
    rows, whether the long keys are found by the window pass (a result read twice) or by a count
    before it (read once)."""
    rng = random.Random(7)
    events = [(f"k{rng.randrange(30)}", timedelta(minutes=rng.randrange(0, 300)), i) for i in range(600)]
    events += [("edge", timedelta(0), 1000), ("edge", WINDOW, 1001), ("edge", WINDOW + timedelta(microseconds=1), 1002)]
    events += [("tie", timedelta(0), 1004), ("tie", timedelta(0), 1003)]
    # Keys within one window beside them: their first event only, from the same window pass.
    events += [(f"s{i}", timedelta(minutes=i, seconds=s), 2000 + 2 * i + s // 30) for i in range(50) for s in (30, 0)]
    rows = batch(events)
    df = spark.createDataFrame(rows.to_pylist(), spark_schema(SCHEMA))
    in_batch = dedup_batch(df, ["order_id"], WINDOW, read_twice=read_twice)
    got = sorted((r[0], r[1]) for r in in_batch.unique.select("order_id", "_offset").collect())
    assert in_batch.long_keys == 31  # the 30 random keys and "edge" span more than the window: walked
    in_batch.release()
    reference = dedup_in_batch(rows, ["order_id"], WINDOW)
    expected = sorted(
        zip(reference.column("order_id").to_pylist(), reference.column("_offset").to_pylist(), strict=True)
    )
    assert got == expected
    # The window's edge belongs to the window; one microsecond past it is a new event; ties go to the lower offset.
    assert ("edge", 1000) in got and ("edge", 1001) not in got and ("edge", 1002) in got
    assert ("tie", 1003) in got and ("tie", 1004) not in got


def test_a_batch_within_one_window_skips_the_long_key_count_and_keeps_the_same_rows(spark: Any) -> None:
    """A batch whose event times span at most the window has no key spanning more: the count that
    looks for such keys is skipped. One microsecond more, and the count (and the walk) run again."""
    window_us = int(WINDOW / timedelta(microseconds=1))

    def kept(events: list[tuple[str, timedelta, int]], span_us: int) -> tuple[int, list[tuple[str, int]]]:
        df = spark.createDataFrame(batch(events).to_pylist(), spark_schema(SCHEMA))
        in_batch = dedup_batch(df, ["order_id"], WINDOW, span_micros=span_us)
        try:
            return in_batch.long_keys, sorted(
                (r[0], r[1]) for r in in_batch.unique.select("order_id", "_offset").collect()
            )
        finally:
            in_batch.release()

    within = [("a", timedelta(0), 1), ("a", WINDOW, 2), ("b", timedelta(minutes=1), 4), ("b", timedelta(minutes=1), 3)]
    assert kept(within, window_us) == (0, [("a", 1), ("b", 3)])
    beyond = [("a", timedelta(0), 1), ("a", WINDOW + timedelta(microseconds=1), 2)]
    assert kept(beyond, window_us + 1) == (1, [("a", 1), ("a", 2)])


def test_a_batch_within_one_window_keeps_the_first_event_by_time_topic_partition_offset(spark: Any) -> None:
    """The common path (`first_per_key`, no count): a randomized batch within one window, with copies
    at the same event time on other topics and partitions, keeps what the reference walk keeps."""
    rng = random.Random(11)
    rows = []
    for i in range(900):
        key = f"k{rng.randrange(200)}"
        at = timedelta(seconds=rng.choice([0, 0, 5, 30, 59]))  # many ties on the event time
        rows.append((key, at, rng.choice(["orders", "orders_b"]), rng.randrange(3), 10_000 - i))
    table = batch([(k, at, offset) for k, at, _, _, offset in rows])
    table = table.set_column(table.schema.get_field_index("_topic"), "_topic", pa.array([r[2] for r in rows]))
    table = table.set_column(
        table.schema.get_field_index("_partition"), "_partition", pa.array([r[3] for r in rows], pa.int32())
    )
    df = spark.createDataFrame(table.to_pylist(), spark_schema(SCHEMA)).repartition(3)
    reference = dedup_in_batch(table, ["order_id"], WINDOW)
    expected = sorted(
        zip(*(reference.column(c).to_pylist() for c in ("order_id", "_topic", "_partition", "_offset")), strict=True)
    )
    assert len(expected) == len({r[0] for r in rows})
    # The batch's span known to be within the window (no count), and unknown (a count finds no long key).
    for span_us in (59_000_000, None):
        in_batch = dedup_batch(df, ["order_id"], WINDOW, span_micros=span_us, read_twice=False)
        assert in_batch.long_keys == 0 and not in_batch.cached
        got = sorted(
            (r[0], r[1], r[2], r[3])
            for r in in_batch.unique.select("order_id", "_topic", "_partition", "_offset").collect()
        )
        in_batch.release()
        assert got == expected, span_us


def test_many_small_batches_are_compacted_and_replays_still_skipped(own_spark: Any, silver: str) -> None:
    """Auto compaction rewrites a day's small files (dataChange=false): same rows, nothing new in the
    change feed or for the loader, and a replayed batch is still recognised by its mark."""
    spark = own_spark  # the setting below must not reach other processes' sessions
    spark.conf.set("spark.databricks.delta.autoCompact.minNumFiles", "4")
    try:
        for i in range(6):
            write(spark, silver, [(f"k{i}", timedelta(minutes=i), i)], i)
    finally:
        spark.conf.unset("spark.databricks.delta.autoCompact.minNumFiles")
    log = DeltaLog(silver)
    operations = [log.commit(v).info.get("operation") for v in range(1, log.latest_version() + 1)]
    assert "OPTIMIZE" in operations
    compaction = next(
        v for v in range(1, log.latest_version() + 1) if log.commit(v).info.get("operation") == "OPTIMIZE"
    )
    assert log.added_files(log.commit(compaction)) == []  # the loader inserts nothing for it
    assert read_inserts(silver, compaction, compaction, ["order_id"]).num_rows == 0
    assert silver_ids(spark, silver) == [(f"k{i}", i) for i in range(6)]
    assert write(spark, silver, [("k0", timedelta(0), 50)], 5) is None
    # ... and stored keys are still found in the compacted file.
    assert write(spark, silver, [("k3", timedelta(minutes=20), 30), ("new", timedelta(0), 31)], 6) == 1


def test_a_day_written_by_another_process_is_not_compacted_after_every_batch(spark: Any, silver: str) -> None:
    """Delta counts a partition's small files per JVM. Its default (modified partitions only)
    took a partition this JVM had not compacted yet, and a compaction that removed more files
    than the JVM had counted made it forget the partition: in every process that did not write
    the day from its start (a new run, a restarted engine) each batch rewrote the whole day."""
    from deltalake import write_deltalake

    for i in range(3):  # batches of an earlier process: files this JVM never counted
        write_deltalake(silver, batch([(f"x{i}", timedelta(minutes=i), 100 + i)]), mode="append")
    for i in range(4):
        assert write(spark, silver, [(f"k{i}", timedelta(minutes=10 + i), i)], i) == 1
    log = DeltaLog(silver)
    operations = [log.commit(v).info.get("operation") for v in range(1, log.latest_version() + 1)]
    assert operations == ["WRITE"] * 7, operations  # with Delta's default: OPTIMIZE after each of the 4


def test_delta_rs_reads_what_delta_spark_writes(spark: Any, tmp_path: Path) -> None:
    """Readers that need no JVM (checks, CLI status, the window swap) keep working on these tables:
    table features, a checkpoint (here every 10 commits), the change feed; Riverhouse's marks are in the log."""
    silver = str(tmp_path / "checkpointed")
    ensure_delta_table(spark, silver, SCHEMA, ["_event_date"], {**SILVER_PROPERTIES, "delta.checkpointInterval": "10"})
    for i in range(12):
        write(spark, silver, [(f"k{i}", timedelta(minutes=i), i)], i)
    assert (Path(silver) / "_delta_log" / "00000000000000000010.checkpoint.parquet").exists()
    table = open_table(silver)
    assert table.version() == DeltaLog(silver).latest_version()
    assert json.loads(table.history(1)[0]["userMetadata"])[MARK_BATCH] == 11
    assert sorted(table.to_pyarrow_table(columns=["order_id"]).column("order_id").to_pylist()) == sorted(
        f"k{i}" for i in range(12)
    )
    inserts = read_inserts(silver, 1, table.version(), ["order_id"])
    assert inserts.num_rows == 12
    assert "changeDataFeed" in (table.protocol().writer_features or [])
    # The log reader finds a batch across the checkpoint (its hint-less scan reads commits back).
    assert DeltaLog(silver).find_batch("app", 3) is not None and DeltaLog(silver).find_batch("app", 12) is None


def test_a_batch_spanning_more_than_the_window_is_ranked_and_measured_in_one_shuffle(spark: Any) -> None:
    """The rank of each row in its key and the key's span come from one window operator over one
    shuffle of the batch by its key (the count of long keys then reads the cache, bench/analysis.md)."""
    events = [("a", timedelta(0), 1), ("a", 2 * WINDOW, 2), ("b", timedelta(minutes=5), 3)]
    df = spark.createDataFrame(batch(events).to_pylist(), spark_schema(SCHEMA))
    ranked = _ranked_with_span(df, ["order_id"])
    if hasattr(ranked, "_jdf"):  # an in-process session (RIVERHOUSE_TEST_ENGINE=local)
        plan = ranked._jdf.queryExecution().executedPlan().toString()
    else:
        plan = ranked._explain_string(mode="simple")
    assert plan.count("Exchange hashpartitioning") == 1, plan
    [window] = [line for line in plan.splitlines() if line.lstrip(" +-:").startswith("Window [")]
    assert "row_number()" in window and "max(" in window and "min(" in window, window
    spans = {(r["order_id"], r["_rank_in_group"]): r["_span"] for r in ranked.collect()}
    assert spans == {("a", 1): 2 * 3_600_000_000, ("a", 2): 2 * 3_600_000_000, ("b", 1): 0}
