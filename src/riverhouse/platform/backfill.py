"""Backfill a time window: rebuild silver and gold from bronze, then swap it into ClickHouse.

Silver: bronze holds every record as received, with the Spark batch it came in.
Rebuilding the window parses those records again (the same JVM expressions) and
replays the streaming dedup rule in arrival order: within a batch the first
event per key and window wins; across batches a row already in silver wins.
Silver rows just outside the window are taken as they are (they were decided
with this window's rows present), so the result is exactly what the stream wrote
for an intact window. The window is replaced in one Delta commit, and only when
its rows differ: re-running a backfill writes nothing.

Gold: the window's driving events are joined again with every window closed.

ClickHouse: tables are partitioned by `_event_date`. The streaming loader first
catches up (so nothing the snapshot holds is loaded again later), the window's
days are read from that Delta version, written to a staging table and swapped
in with `ALTER TABLE ... REPLACE PARTITION`: readers see the old day or the new
day, never half of it or both. Rebuild commits carry `riverhouse.rebuild`, and
the streaming loader records them in its ledger without inserting their rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake

from riverhouse.platform.ingest.parse import parse_records
from riverhouse.platform.ingest.stream import checkpoint_dir, pipeline_lock, sink_lock
from riverhouse.platform.sink.clickhouse import (
    REBUILD_KEY,
    ClickHouseLoadError,
    load_new_versions,
    open_client,
    qualified_table,
    quote,
    sink_table_path,
    staging_table_name,
    with_retries,
)
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import (
    KAFKA_IDENTITY,
    TableLayout,
    bronze_schema,
    ensure_table,
    open_table,
    plain_strings,
    silver_schema,
)

LOCK_WAIT_S = 600


@dataclass
class RebuildResult:
    table: str
    window: str
    rows: int = 0
    rows_before: int = 0
    changed: bool = False
    delta_version: int | None = None
    seconds: float = 0.0
    # The window's rows as the table now holds them (what the checks validate).
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


def _time_filter(time_col: str, date_col: str, lo: datetime, hi: datetime) -> Any:
    """lo <= time < hi, with literal date bounds so delta-rs prunes partitions."""
    lo_date = pa.scalar(lo.astimezone(UTC).date(), pa.date32())
    hi_date = pa.scalar(hi.astimezone(UTC).date(), pa.date32())
    return (
        (pc.field(date_col) >= lo_date)
        & (pc.field(date_col) <= hi_date)
        & (pc.field(time_col) >= lo)
        & (pc.field(time_col) < hi)
    )


def _sql_window(time_col: str, date_col: str, start: datetime, end: datetime) -> str:
    """The same window as a delta-rs SQL predicate (replaceWhere)."""
    lo, hi = start.astimezone(UTC), end.astimezone(UTC)
    last = (hi - timedelta(microseconds=1)).date()
    return (
        f"\"{date_col}\" >= '{lo.date().isoformat()}' AND \"{date_col}\" <= '{last.isoformat()}' "
        f"AND \"{time_col}\" >= '{lo.strftime('%Y-%m-%d %H:%M:%S.%f')}' "
        f"AND \"{time_col}\" < '{hi.strftime('%Y-%m-%d %H:%M:%S.%f')}'"
    )


def _read(path: str, flt: Any, columns: list[str] | None = None) -> pa.Table:
    table = open_table(path)
    if table is None:
        raise RuntimeError(f"Delta table {path} does not exist: run the pipeline before backfilling it")
    return plain_strings(table.to_pyarrow_dataset().to_table(columns=columns, filter=flt))


def _same_rows(a: pa.Table, b: pa.Table, order: list[str]) -> bool:
    if a.num_rows != b.num_rows or a.schema.names != b.schema.names:
        return False
    if a.num_rows == 0:
        return True
    sort = [(c, "ascending") for c in order]
    return a.sort_by(sort).equals(b.sort_by(sort))


def _replace(table: DeltaTable, rows: pa.Table, predicate: str, label: str, extra: dict[str, str] | None = None) -> int:
    """Replace the rows matching `predicate` with `rows`: one commit (delete + add)."""
    write_deltalake(
        table,
        rows,
        mode="overwrite",
        predicate=predicate,
        commit_properties=CommitProperties(custom_metadata={REBUILD_KEY: label, **(extra or {})}),
    )
    table.update_incremental()
    return table.version()


# ------------------------------------------------------------------------ silver
def replay_dedup(candidates: pa.Table, context: pa.Table, key: list[str], window: timedelta) -> pa.Table:
    """The candidates the streaming dedup would have kept, given the silver rows around them.

    `context` rows are silver rows outside the rebuilt window: they were kept, so they
    take part as kept rows of their batch. Order: batch, then (as inside a batch) event
    time, topic, partition, offset.
    """
    if candidates.num_rows == 0:
        return candidates
    cols = [*key, "_batch_id", "_event_time", "_topic", "_partition", "_offset"]
    both = pa.concat_tables(
        [
            candidates.select(cols).append_column("_ctx", pa.array([False] * candidates.num_rows)),
            context.select(cols)
            .cast(candidates.select(cols).schema)
            .append_column("_ctx", pa.array([True] * context.num_rows)),
        ]
    ).append_column("_row", pa.array(np.arange(candidates.num_rows + context.num_rows), pa.int64()))
    both = both.sort_by(
        [(c, "ascending") for c in [*key, "_batch_id", "_event_time", "_topic", "_partition", "_offset"]]
    )
    n = both.num_rows
    new_key = np.zeros(n, dtype=bool)
    new_key[0] = True
    for k in key:
        col = both.column(k).combine_chunks()
        new_key[1:] |= pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True).to_numpy(
            zero_copy_only=False
        )
    times = pc.cast(both.column("_event_time"), pa.int64()).to_numpy(zero_copy_only=False)
    batches = both.column("_batch_id").to_numpy(zero_copy_only=False)
    ctx = both.column("_ctx").to_numpy(zero_copy_only=False)
    rows = both.column("_row").to_numpy(zero_copy_only=False)
    window_us = int(window / timedelta(microseconds=1))
    keep = np.zeros(n, dtype=bool)
    starts = [*np.flatnonzero(new_key).tolist(), n]
    for g in range(len(starts) - 1):
        lo, hi = starts[g], starts[g + 1]
        if hi - lo == 1:
            keep[lo] = not ctx[lo]
            continue
        kept: list[int] = []  # event times kept by earlier batches
        i = lo
        while i < hi:
            j = i
            while j < hi and batches[j] == batches[i]:
                j += 1
            last = None
            in_batch = []
            for r in range(i, j):
                if ctx[r] or last is None or times[r] - last > window_us:
                    in_batch.append(r)
                    last = times[r]
            finals = [r for r in in_batch if ctx[r] or not any(abs(times[r] - t) <= window_us for t in kept)]
            for r in finals:
                keep[r] = not ctx[r]
            kept.extend(int(times[r]) for r in finals)
            i = j
    chosen = np.sort(rows[keep])
    return candidates.take(pa.array(chosen, pa.int64()))


def _parse_bronze(spark: Any, spec: PipelineSpec, source: str, bronze: pa.Table) -> pa.Table:
    """Bronze records -> silver rows (same JVM parsing as the stream), keeping each row's batch."""
    src = spec.sources[source]
    schema = silver_schema(src)
    if bronze.num_rows == 0:
        return schema.empty_table()
    kafka_rows = pa.table(
        {
            "key": bronze.column("_key"),
            "value": bronze.column("_value"),
            "topic": bronze.column("_topic"),
            "partition": bronze.column("_partition"),
            "offset": bronze.column("_offset"),
            "timestamp": bronze.column("_kafka_timestamp"),
            "timestampType": pa.array([0] * bronze.num_rows, pa.int32()),
            "headers": bronze.column("_headers"),
        }
    )
    parsed = parse_records(spark.createDataFrame(kafka_rows), src).filter("_status = 'ok'").toArrow()
    parsed = plain_strings(parsed.select([c for c in schema.names if c != "_batch_id"]))
    batch_of = bronze.select([*KAFKA_IDENTITY, "_batch_id"])
    parsed = parsed.join(batch_of, keys=KAFKA_IDENTITY, join_type="inner")
    return parsed.select(schema.names).cast(schema)


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
    schema = silver_schema(src)
    ensure_table(layout.bronze(source), bronze_schema(src), ["_event_date"])
    silver = ensure_table(layout.silver(source), schema, ["_event_date"], cdf=True)
    # The stream must not write silver while its window is replaced.
    with pipeline_lock(checkpoint_dir(settings, spec.name, source), spec.name, wait_s=LOCK_WAIT_S, log=log):
        bronze = _read(
            layout.bronze(source),
            _time_filter("_event_time", "_event_date", start, end) & (pc.field("_status") == "ok"),
        )
        rows = _parse_bronze(spark, spec, source, bronze)
        if src.dedup is not None and rows.num_rows:
            window = src.dedup.window
            near = _read(
                layout.silver(source),
                _time_filter("_event_time", "_event_date", start - window, end + window)
                & ~((pc.field("_event_time") >= start) & (pc.field("_event_time") < end)),
                schema.names,
            )
            rows = replay_dedup(rows, near.cast(schema), src.dedup_key, window)
        current = _read(
            layout.silver(source), _time_filter("_event_time", "_event_date", start, end), schema.names
        ).cast(schema)
        result.rows, result.rows_before = rows.num_rows, current.num_rows
        if _same_rows(rows, current, KAFKA_IDENTITY):
            log(f"silver {source} {label}: {rows.num_rows:,} rows, unchanged")
        else:
            result.delta_version = _replace(silver, rows, _sql_window("_event_time", "_event_date", start, end), label)
            result.changed = True
            log(
                f"silver {source} {label}: replaced {current.num_rows:,} rows with {rows.num_rows:,} "
                f"(Delta version {result.delta_version})"
            )
        result.delta_version = silver.version()
        result.published = rows
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
    from riverhouse.platform.gold.joins import (
        STATE_VERSION,
        STATE_WATERMARK,
        _state,
        gold_lock,
        gold_path,
        gold_quarantine_path,
        gold_schema,
        join_rows,
        lookup_rows,
    )

    started = time.monotonic()
    plan = spec.plan
    layout = TableLayout(settings.warehouse, spec.name)
    label = window_label(start, end)
    path = gold_path(layout, spec)
    result = RebuildResult(table=path, window=label)
    schema = gold_schema(spark, spec)
    gold = ensure_table(path, schema, ["_left_event_date"], cdf=True)
    quarantine = ensure_table(gold_quarantine_path(layout, spec), schema, ["_left_event_date"])
    driving_schema = silver_schema(spec.sources[plan.driving_source])
    with gold_lock(settings, spec.name, log):
        driving = _read(
            layout.silver(plan.driving_source),
            _time_filter("_event_time", "_event_date", start, end),
            driving_schema.names,
        )
        driving = driving.cast(driving_schema)
        if driving.num_rows:
            lookups = lookup_rows(spec, layout, start, end - timedelta(microseconds=1))
            rows, _ = join_rows(spark, spec, plan, driving, lookups)
            rows = plain_strings(rows).select(schema.names).cast(schema)
        else:
            rows = schema.empty_table()
        order = ["_left_topic", "_left_partition", "_left_offset"]
        predicate = _sql_window("_left_event_time", "_left_event_date", start, end)
        current = _read(path, _time_filter("_left_event_time", "_left_event_date", start, end), schema.names).cast(
            schema
        )
        result.rows, result.rows_before = rows.num_rows, current.num_rows
        if _same_rows(rows, current, order):
            log(f"gold {spec.sink.table} {label}: {rows.num_rows:,} driving events, unchanged")
        else:
            version, watermark = _state(gold)
            state = {STATE_VERSION: str(version)}
            if watermark is not None:
                state[STATE_WATERMARK] = watermark.astimezone(UTC).isoformat()
            rejected = rows.filter(pc.equal(rows.column("_status"), "rejected"))
            _replace(quarantine, rejected, predicate, label)
            # The stream's progress is carried into the rebuild commit, so it is never lost.
            result.delta_version = _replace(gold, rows, predicate, label, state)
            result.changed = True
            log(
                f"gold {spec.sink.table} {label}: replaced {current.num_rows:,} rows with {rows.num_rows:,} "
                f"(Delta version {result.delta_version})"
            )
        result.delta_version = gold.version()
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
    spec: PipelineSpec, settings: Settings, start: datetime, end: datetime, log: Callable[[str], None] = print
) -> ReplaceResult:
    """Swap the days covering [start, end) of the ClickHouse table for the Delta snapshot's rows."""
    started = time.monotonic()
    days = _days(start, end)
    path = sink_table_path(spec, settings.warehouse)
    result = ReplaceResult(table=qualified_table(spec), days=[d.isoformat() for d in days])
    with sink_lock(settings, spec.name, log):
        caught_up = load_new_versions(spec, settings.clickhouse_dsn, path, log=log)
        result.caught_up_rows = caught_up.rows_loaded
        snapshot = open_table(path)
        if snapshot is None:
            raise ClickHouseLoadError(f"Delta table {path} does not exist yet: run the pipeline first")
        # Exactly the version the loader reached: later versions are the stream's to load.
        snapshot.load_as_version(caught_up.delta_version)
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
        with open_client(settings.clickhouse_dsn) as client:
            for day in days:
                flt = pc.field(date_col) == pa.scalar(day, pa.date32())
                if spec.is_join:
                    flt = flt & (pc.field("_status") == "emitted")
                rows = plain_strings(
                    snapshot.to_pyarrow_dataset().to_table(columns=[*columns, date_col, *order], filter=flt)
                )
                rows = rows.sort_by([(c, "ascending") for c in order]).select([*columns, date_col])
                rows = rows.rename_columns([*columns, "_event_date"])
                with_retries(
                    lambda: client.command(f"DROP TABLE IF EXISTS {staging_table}"), "dropping staging", log=log
                )
                with_retries(
                    lambda: client.command(f"CREATE TABLE {staging_table} AS {qualified_table(spec)}"),
                    "creating staging",
                    log=log,
                )
                for offset in range(0, rows.num_rows, spec.sink.batch_size):
                    chunk = rows.slice(offset, spec.sink.batch_size)
                    with_retries(
                        lambda c=chunk: client.insert_arrow(staging_table, c),
                        f"staging {day} for {qualified_table(spec)}",
                        log=log,
                    )
                with_retries(
                    lambda d=day: client.command(
                        f"ALTER TABLE {qualified_table(spec)} REPLACE PARTITION '{d.isoformat()}' FROM {staging_table}"
                    ),
                    f"replacing partition {day}",
                    log=log,
                )
                client.command(f"DROP TABLE IF EXISTS {staging_table}")
                result.rows += rows.num_rows
                log(
                    f"ClickHouse {qualified_table(spec)} partition {day}: replaced with {rows.num_rows:,} rows "
                    f"(Delta version {caught_up.delta_version})"
                )
    result.seconds = time.monotonic() - started
    return result
