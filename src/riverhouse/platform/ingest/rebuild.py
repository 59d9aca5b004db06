"""Backfill a time window of silver: re-parse bronze in Spark and replay the dedup; one commit if it changed.

Bronze holds every record as received, with the Spark batch it came in. Rebuilding the window
parses those records again with the ingest's own Spark expressions (`parse.py`) and replays
the streaming dedup rule in arrival order (`replay_dedup`): within a batch the first event per
key and window wins; across batches a row already in silver wins. Silver rows just outside
the window are taken as they are (they were decided with this window's rows present), so the
result is exactly what the stream wrote for an intact window. The window is replaced with
delta-spark's `replaceWhere` in one commit, and only when its rows differ (Spark compares them:
counts and `exceptAll`): re-running a backfill writes nothing. Every read is a Spark plan over
a pinned Delta version; the driver receives counts. The commit carries `riverhouse.rebuild`,
and the streaming loader records it in its ledger without inserting its rows (sink/replace.py
swaps the days into ClickHouse).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.ingest.parse import parse_records
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import checkpoint_dir, pipeline_lock
from riverhouse.platform.state.delta_log import MARK_REBUILD
from riverhouse.platform.state.delta_spark import (
    between,
    conform,
    read_at,
    replace_where,
    same_rows,
    table_version,
    window_predicate,
)
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import (
    BRONZE_PROPERTIES,
    KAFKA_IDENTITY,
    TableLayout,
    bronze_schema,
    ensure_delta_table,
    silver_properties,
    silver_schema,
    spark_schema,
)
from riverhouse.platform.state.windows import RebuildResult, window_label

LOCK_WAIT_S = 600
# Arrival order inside a key: the batch a row came in, then (as inside a batch) event time and coordinates.
ARRIVAL_ORDER = ["_batch_id", "_event_time", "_topic", "_partition", "_offset"]


def replay_walk(group: pa.Table, window: timedelta) -> pa.Table:
    """The reference walk of the replay for ONE key's rows (candidates and `_ctx` context rows).

    Batch by batch in arrival order: inside a batch the first row and each row more than a
    window after the last one taken are taken (context rows always are: they were kept);
    a taken candidate is then dropped when a row kept by an earlier batch is within a window
    of it. Returns the kept candidates (without `_ctx`).
    """
    rows = group.sort_by([(c, "ascending") for c in ARRIVAL_ORDER])
    times = pc.cast(rows.column("_event_time"), pa.int64()).to_pylist()
    batches = rows.column("_batch_id").to_pylist()
    ctx = rows.column("_ctx").to_pylist()
    window_us = int(window / timedelta(microseconds=1))
    keep = [False] * rows.num_rows
    kept: list[int] = []  # event times kept by earlier batches
    i = 0
    while i < rows.num_rows:
        j = i
        while j < rows.num_rows and batches[j] == batches[i]:
            j += 1
        last: int | None = None
        taken = []
        for r in range(i, j):
            if ctx[r] or last is None or times[r] - last > window_us:
                taken.append(r)
                last = times[r]
        finals = [r for r in taken if ctx[r] or not any(abs(times[r] - t) <= window_us for t in kept)]
        for r in finals:
            keep[r] = not ctx[r]
        kept.extend(times[r] for r in finals)
        i = j
    return rows.filter(pa.array(keep, pa.bool_())).drop_columns(["_ctx"])


def replay_dedup(candidates: Any, context: Any, key: list[str], window: timedelta) -> Any:
    """The candidates the streaming dedup would have kept, given the silver rows around them (Spark).

    `context` rows are silver rows outside the rebuilt window: they were kept, so they take
    part as kept rows of their batch. A key whose rows all lie within one window (nearly all)
    keeps its first row in arrival order, if that row is a candidate: a window function. A key
    spanning more than a window is walked in arrival order (`replay_walk`) on an executor.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    columns = candidates.columns
    both = candidates.withColumn("_ctx", F.lit(False)).unionByName(
        context.select(*columns).withColumn("_ctx", F.lit(True))
    )
    by_key = Window.partitionBy(*key)
    span = F.unix_micros(F.max("_event_time").over(by_key)) - F.unix_micros(F.min("_event_time").over(by_key))
    ranked = both.withColumn("_rank", F.row_number().over(by_key.orderBy(*ARRIVAL_ORDER))).withColumn(
        "_long", span > F.lit(int(window / timedelta(microseconds=1)))
    )
    short = ranked.where(~F.col("_long") & (F.col("_rank") == 1) & ~F.col("_ctx")).select(*columns)
    schema = candidates.schema

    def walk(group: pa.Table) -> pa.Table:
        return replay_walk(group, window).select(columns)

    long = ranked.where(F.col("_long")).drop("_rank", "_long").groupBy(*key).applyInArrow(walk, schema)
    return short.unionByName(long)


def parse_bronze(spec: PipelineSpec, source: str, bronze: Any) -> Any:
    """Bronze records -> silver rows, parsed by the ingest's own code, each with its first arrival's batch."""
    from pyspark.sql import functions as F

    src = spec.sources[source]
    records = bronze.dropDuplicates(KAFKA_IDENTITY)
    kafka_rows = records.select(
        F.col("_key").alias("key"),
        F.col("_value").alias("value"),
        F.col("_topic").alias("topic"),
        F.col("_partition").alias("partition"),
        F.col("_offset").alias("offset"),
        F.col("_kafka_timestamp").alias("timestamp"),
        F.lit(0).alias("timestampType"),
        F.col("_headers").alias("headers"),
    )
    writers = None
    if src.schema_registry is not None:  # every version the registry has (it must answer)
        from riverhouse.platform.ingest.avro import WriterSchemas

        writers = WriterSchemas.fetch(src, src.schema_registry.client(), must_answer=True)
    parsed = parse_records(kafka_rows, src, writers).where(F.col("_status") == "ok")
    # A record a replayed stream appended twice counts from its first arrival.
    first_batch = bronze.groupBy(*KAFKA_IDENTITY).agg(F.min("_batch_id").alias("_batch_id"))
    names = silver_schema(src).names
    return parsed.join(first_batch, KAFKA_IDENTITY).select(*names)


def rebuild_silver(
    spark: Any,
    spec: PipelineSpec,
    settings: Settings,
    source: str,
    start: datetime,
    end: datetime,
    log: Callable[[str], None] = print,
) -> RebuildResult:
    """Recompute silver rows with event time in [start, end) from bronze; one commit if they differ."""
    started = time.monotonic()
    src = spec.sources[source]
    layout = TableLayout(settings.warehouse, spec.name)
    label = window_label(start, end)
    result = RebuildResult(table=layout.silver(source), window=label)
    schema = spark_schema(silver_schema(src))
    ensure_delta_table(spark, layout.bronze(source), bronze_schema(src), ["_event_date"], BRONZE_PROPERTIES)
    ensure_delta_table(spark, layout.silver(source), silver_schema(src), ["_event_date"], silver_properties(src))
    in_window = between("_event_time", "_event_date", start, end, hi_open=True)
    # The stream must not write silver while its window is replaced.
    with pipeline_lock(checkpoint_dir(settings, spec.name, source), spec.name, wait_s=LOCK_WAIT_S, log=log):
        from pyspark.sql import functions as F

        from riverhouse.platform.ingest.resident import stop_resident

        if stop_resident(spark, spec, settings, source) and log is not None:
            log(f"stopped the resident query of source {source!r} (the next stream run starts it again)")

        silver = read_at(spark, layout.silver(source), table_version(layout.silver(source)))
        bronze = read_at(spark, layout.bronze(source), table_version(layout.bronze(source)))
        # The window by bronze's event time, and again after parsing: replaceWhere refuses rows outside it.
        rows = parse_bronze(spec, source, bronze.where(in_window & (F.col("_status") == "ok"))).where(in_window)
        rows = conform(rows, schema)
        if src.dedup is not None:
            window = src.dedup.window
            near = silver.where(between("_event_time", "_event_date", start - window, end + window) & ~in_window)
            rows = conform(replay_dedup(rows, conform(near, schema), src.dedup_key, window), schema)
        current = conform(silver.where(in_window), schema)
        rows = rows.persist()
        try:
            result.rows, result.rows_before, same = same_rows(rows, current)
            if same:
                log(f"silver {source} {label}: {result.rows:,} rows, unchanged")
            else:
                predicate = window_predicate("_event_time", "_event_date", start, end)
                replace_where(rows, layout.silver(source), predicate, {MARK_REBUILD: label})
                result.changed = True
        finally:
            rows.unpersist()
        result.delta_version = table_version(layout.silver(source))
        if result.changed:
            log(
                f"silver {source} {label}: replaced {result.rows_before:,} rows with {result.rows:,} "
                f"(Delta version {result.delta_version})"
            )
    result.seconds = time.monotonic() - started
    return result
