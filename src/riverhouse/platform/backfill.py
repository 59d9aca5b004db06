"""Backfill a time window: rebuild silver and gold from bronze in Spark, then swap it into ClickHouse.

Silver: bronze holds every record as received, with the Spark batch it came in.
Rebuilding the window parses those records again with the ingest's own Spark
expressions (`ingest/parse.py`) and replays the streaming dedup rule in arrival
order (`replay_dedup`): within a batch the first event per key and window wins;
across batches a row already in silver wins. Silver rows just outside the window
are taken as they are (they were decided with this window's rows present), so the
result is exactly what the stream wrote for an intact window. The window is
replaced with delta-spark's `replaceWhere` in one commit, and only when its rows
differ (Spark compares them: counts and `exceptAll`): re-running a backfill writes
nothing.

Gold: the window's driving events are joined again (`gold/evaluate.py`) with every
window closed, and replaced the same way; the stream's progress rides along in the
rebuild commit.

Every read is a Spark plan over a pinned Delta version; the driver receives counts.

ClickHouse: tables are partitioned by `_event_date`. The streaming loader first
catches up (so nothing the snapshot holds is loaded again later), the window's
days are read from that Delta version through Spark, a chunk at a time, written to
a staging table and swapped in with `ALTER TABLE ... REPLACE PARTITION`: readers see
the old day or the new day, never half of it or both. Rebuild commits carry
`riverhouse.rebuild`, and the streaming loader records them in its ledger without
inserting their rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.ingest.parse import parse_records
from riverhouse.platform.ingest.stream import checkpoint_dir, pipeline_lock, sink_lock
from riverhouse.platform.sink.clickhouse import (
    REBUILD_KEY,
    ClickHouseLoadError,
    _numbered_chunks,
    load_new_versions,
    open_client,
    qualified_table,
    quote,
    sink_table_path,
    staging_table_name,
    with_retries,
)
from riverhouse.platform.spec import PipelineSpec
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
    KAFKA_IDENTITY,
    TableLayout,
    bronze_schema,
    ensure_delta_table,
    open_table,
    plain_strings,
    silver_schema,
    spark_schema,
)

LOCK_WAIT_S = 600
# Arrival order inside a key: the batch a row came in, then (as inside a batch) event time and coordinates.
ARRIVAL_ORDER = ["_batch_id", "_event_time", "_topic", "_partition", "_offset"]


@dataclass
class RebuildResult:
    table: str
    window: str
    rows: int = 0
    rows_before: int = 0
    changed: bool = False
    delta_version: int | None = None
    seconds: float = 0.0
    # The window's rows as the table now holds them (what the checks validate), read with
    # delta-rs after the commit; None when the caller asked for no rows (`publish=False`).
    published: pa.Table | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "published"}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in values.items()}


def window_label(start: datetime, end: datetime) -> str:
    return f"{start.astimezone(UTC).isoformat()}/{end.astimezone(UTC).isoformat()}"


def _days(start: datetime, end: datetime) -> list[date]:
    first = start.astimezone(UTC).date()
    last = (end.astimezone(UTC) - timedelta(microseconds=1)).date()
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def _published(path: str, time_col: str, date_col: str, start: datetime, end: datetime) -> pa.Table:
    """The window's rows as the table holds them, for the checks (a delta-rs read: no JVM needed)."""
    table = open_table(path)
    if table is None:
        raise RuntimeError(f"Delta table {path} does not exist: run the pipeline before backfilling it")
    lo_date = pa.scalar(start.astimezone(UTC).date(), pa.date32())
    hi_date = pa.scalar((end.astimezone(UTC) - timedelta(microseconds=1)).date(), pa.date32())
    flt = (
        (pc.field(date_col) >= lo_date)
        & (pc.field(date_col) <= hi_date)
        & (pc.field(time_col) >= start)
        & (pc.field(time_col) < end)
    )
    return plain_strings(table.to_pyarrow_dataset().to_table(filter=flt))


# ------------------------------------------------------------------------ silver
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
    parsed = parse_records(kafka_rows, src).where(F.col("_status") == "ok")
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
    publish: bool = True,
) -> RebuildResult:
    """Recompute silver rows with event time in [start, end) from bronze; one commit if they differ."""
    started = time.monotonic()
    src = spec.sources[source]
    layout = TableLayout(settings.warehouse, spec.name)
    label = window_label(start, end)
    result = RebuildResult(table=layout.silver(source), window=label)
    schema = spark_schema(silver_schema(src))
    ensure_delta_table(spark, layout.bronze(source), bronze_schema(src), ["_event_date"])
    ensure_delta_table(spark, layout.silver(source), silver_schema(src), ["_event_date"], cdf=True)
    in_window = between("_event_time", "_event_date", start, end, hi_open=True)
    # The stream must not write silver while its window is replaced.
    with pipeline_lock(checkpoint_dir(settings, spec.name, source), spec.name, wait_s=LOCK_WAIT_S, log=log):
        from pyspark.sql import functions as F

        silver = read_at(spark, layout.silver(source), table_version(spark, layout.silver(source)))
        bronze = read_at(spark, layout.bronze(source), table_version(spark, layout.bronze(source)))
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
                replace_where(rows, layout.silver(source), predicate, {REBUILD_KEY: label})
                result.changed = True
        finally:
            rows.unpersist()
        result.delta_version = table_version(spark, layout.silver(source))
        if result.changed:
            log(
                f"silver {source} {label}: replaced {result.rows_before:,} rows with {result.rows:,} "
                f"(Delta version {result.delta_version})"
            )
        if publish:
            names = silver_schema(src).names
            result.published = _published(layout.silver(source), "_event_time", "_event_date", start, end).select(names)
    result.seconds = time.monotonic() - started
    return result


# -------------------------------------------------------------------------- gold
def rebuild_gold(
    spark: Any,
    spec: PipelineSpec,
    settings: Settings,
    start: datetime,
    end: datetime,
    log: Callable[[str], None] = print,
) -> RebuildResult:
    """Join every driving event with event time in [start, end) again, windows closed; replace it."""
    from riverhouse.platform.gold.evaluate import evaluate
    from riverhouse.platform.gold.joins import (
        ensure_gold_tables,
        gold_lock,
        gold_path,
        gold_quarantine_path,
        lookup_frames,
        read_state,
    )

    started = time.monotonic()
    plan = spec.plan
    layout = TableLayout(settings.warehouse, spec.name)
    label = window_label(start, end)
    path = gold_path(layout, spec)
    result = RebuildResult(table=path, window=label)
    target = ensure_gold_tables(spark, spec, layout)
    with gold_lock(settings, spec.name, log):
        versions = {name: table_version(spark, layout.silver(name)) for name in spec.sources}
        driving = read_at(spark, layout.silver(plan.driving_source), versions[plan.driving_source]).where(
            between("_event_time", "_event_date", start, end, hi_open=True)
        )
        lookups = lookup_frames(spark, spec, layout, versions, start, end - timedelta(microseconds=1))
        rows = conform(evaluate(spark, spec, plan, driving, lookups), target)
        gold = read_at(spark, path, table_version(spark, path))
        current = conform(gold.where(between("_left_event_time", "_left_event_date", start, end, hi_open=True)), target)
        rows = rows.persist()
        try:
            result.rows, result.rows_before, same = same_rows(rows, current)
            if same:
                log(f"gold {spec.sink.table} {label}: {result.rows:,} driving events, unchanged")
            else:
                predicate = window_predicate("_left_event_time", "_left_event_date", start, end)
                replace_where(
                    rows.where("_status = 'rejected'"),
                    gold_quarantine_path(layout, spec),
                    predicate,
                    {REBUILD_KEY: label},
                )
                # The stream's progress is carried into the rebuild commit, so it is never lost.
                state = read_state(spark, path).metadata()
                replace_where(rows, path, predicate, {REBUILD_KEY: label, **state})
                result.changed = True
        finally:
            rows.unpersist()
        result.delta_version = table_version(spark, path)
        if result.changed:
            log(
                f"gold {spec.sink.table} {label}: replaced {result.rows_before:,} rows with {result.rows:,} "
                f"(Delta version {result.delta_version})"
            )
    result.seconds = time.monotonic() - started
    return result


# -------------------------------------------------------------------- ClickHouse
@dataclass
class ReplaceResult:
    table: str
    days: list[str]
    rows: int = 0
    caught_up_rows: int = 0
    delta_version: int | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def replace_clickhouse_window(
    spec: PipelineSpec,
    settings: Settings,
    start: datetime,
    end: datetime,
    log: Callable[[str], None] = print,
    spark: Any = None,
) -> ReplaceResult:
    """Swap the days covering [start, end) of the ClickHouse table for the Delta snapshot's rows.

    Each day is read through Spark from the version the loader reached, numbered in Kafka
    order and fetched one chunk (`sink.batch_size` rows) at a time: the driver never holds
    more than a chunk.
    """
    from pyspark.sql import functions as F

    started = time.monotonic()
    days = _days(start, end)
    path = sink_table_path(spec, settings.warehouse)
    result = ReplaceResult(table=qualified_table(spec), days=[d.isoformat() for d in days])
    if spark is None:
        from riverhouse.platform.runtime.spark import get_spark

        spark = get_spark()  # the process's session if there is one
    with sink_lock(settings, spec.name, log):
        caught_up = load_new_versions(spec, settings.clickhouse_dsn, path, log=log, spark=spark)
        result.caught_up_rows = caught_up.rows_loaded
        if open_table(path) is None or caught_up.delta_version is None:
            raise ClickHouseLoadError(f"Delta table {path} does not exist yet: run the pipeline first")
        # Exactly the version the loader reached: later versions are the stream's to load.
        snapshot = read_at(spark, path, caught_up.delta_version)
        result.delta_version = caught_up.delta_version
        if spec.is_join:
            columns, date_col, order = (
                spec.plan.output_names,
                "_left_event_date",
                ["_left_topic", "_left_partition", "_left_offset"],
            )
        else:
            columns, date_col, order = [f.name for f in spec.sink_source.fields], "_event_date", KAFKA_IDENTITY
        staging = quote(staging_table_name(spec.sink.table))
        database = (quote(spec.sink.database) + ".") if spec.sink.database else ""
        staging_table = f"{database}{staging}"
        size = spec.sink.batch_size
        with open_client(settings.clickhouse_dsn) as client:
            for day in days:
                rows = snapshot.where(F.col(date_col) == F.lit(day))
                if spec.is_join:
                    rows = rows.where(F.col("_status") == "emitted")
                # The loader's chunk numbering, with the day in place of the version.
                numbered = _numbered_chunks(
                    rows.select(*columns, date_col, *order).withColumn("_commit_version", F.lit(0)), order, size
                ).persist()
                try:
                    count = numbered.count()
                    with_retries(
                        lambda: client.command(f"DROP TABLE IF EXISTS {staging_table}"), "dropping staging", log=log
                    )
                    with_retries(
                        lambda: client.command(f"CREATE TABLE {staging_table} AS {qualified_table(spec)}"),
                        "creating staging",
                        log=log,
                    )
                    for index in range((count + size - 1) // size):
                        chunk = (
                            numbered.where(F.col("_chunk") == index)
                            .orderBy(*order)
                            .select(*columns, F.col(date_col).alias("_event_date"))
                            .toArrow()
                        )
                        with_retries(
                            lambda c=chunk: client.insert_arrow(staging_table, c),
                            f"staging {day} for {qualified_table(spec)}",
                            log=log,
                        )
                finally:
                    numbered.unpersist()
                with_retries(
                    lambda d=day: client.command(
                        f"ALTER TABLE {qualified_table(spec)} REPLACE PARTITION '{d.isoformat()}' FROM {staging_table}"
                    ),
                    f"replacing partition {day}",
                    log=log,
                )
                client.command(f"DROP TABLE IF EXISTS {staging_table}")
                result.rows += count
                log(
                    f"ClickHouse {qualified_table(spec)} partition {day}: replaced with {count:,} rows "
                    f"(Delta version {caught_up.delta_version})"
                )
    result.seconds = time.monotonic() - started
    return result
