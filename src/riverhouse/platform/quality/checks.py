"""Data-quality predicates over Delta and ClickHouse (used by the Dagster asset checks)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.delta_log import DeltaLog, overlapping
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import open_table


def checked_ranges(spans: list[tuple[datetime, datetime]], window: timedelta) -> list[tuple[datetime, datetime]]:
    """The event-time ranges a duplicate of a row in `spans` can be in: each span widened by
    `window` on both sides, overlapping ranges merged, in time order."""
    merged: list[tuple[datetime, datetime]] = []
    for lo, hi in sorted((lo - window, hi + window) for lo, hi in spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def duplicate_keys_within_window(
    spark: Any,
    path: str,
    key: list[str],
    window: timedelta,
    spans: list[tuple[datetime, datetime]],
    limit: int = 20,
    time_column: str = "_event_time",
    date_column: str = "_event_date",
    emitted_only: bool = False,
) -> tuple[int, list[dict[str, Any]]]:
    """Rows whose key equals the previous row's (by `time_column`) within `window`, as a Spark job.

    Only rows that a duplicate of the checked `spans` (what the step wrote: a stream run's
    files, a rebuild's window) can be are read: the spans widened by `window`. The files are
    chosen from the Delta log (`delta_log.overlapping`: date partitions, then the time
    column's statistics) and read by Spark as Parquet, as the ingest's silver lookup does: a
    Delta read rebuilds the table's snapshot first ("Filtering files for query", a Spark job of
    0.4-1.3 s per check). Returns (number of offending rows, a sample of at most `limit`); only
    the count and the sample reach the driver. `emitted_only`: gold tables, rows that reach
    ClickHouse.
    """
    from pyspark.sql import Window as SparkWindow
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    ranges = checked_ranges(spans, window)
    log = DeltaLog(path)
    if not ranges or not log.exists():
        return 0, []
    files = sorted({f for lo, hi in ranges for f in overlapping(path, time_column, lo, hi, date_column).paths})
    if not files:
        return 0, []
    t = F.col(time_column)
    bound = None
    for lo, hi in ranges:
        one = t.between(F.lit(lo), F.lit(hi))  # the files were chosen by day; the partition column is not in them
        bound = one if bound is None else bound | one
    wanted = [*key, time_column, *(["_status"] if emitted_only else [])]
    schema = log.schema()
    rows = spark.read.schema(StructType([schema[c] for c in wanted])).parquet(*files).where(bound)
    if emitted_only:
        rows = rows.where(F.col("_status") == F.lit("emitted"))
    previous = F.lag(t).over(SparkWindow.partitionBy(*[F.col(k) for k in key]).orderBy(t))
    gap = F.unix_micros(t) - F.unix_micros(F.col("_previous"))
    offending = (
        rows.select(*[F.col(k) for k in key], t, previous.alias("_previous"))
        .where(F.col("_previous").isNotNull() & (gap <= F.lit(int(window / timedelta(microseconds=1)))))
        .drop("_previous")
    )
    count = offending.count()
    sample = [row.asDict() for row in offending.limit(limit).collect()] if count else []
    for row in sample:
        row[time_column] = str(row[time_column])
    return int(count), sample


def delta_row_count(path: str) -> int:
    table = open_table(path)
    return 0 if table is None else table.to_pyarrow_dataset().count_rows()


def reconcile_per_day(spec: PipelineSpec, settings: Settings) -> tuple[Any, dict[str, int]]:
    """Rows per day in ClickHouse vs the sink Delta table at the ledger's last loaded version.

    Returns the Great Expectations outcome (failing days as its sample) and totals.
    """
    from riverhouse.platform.quality.expectations import validate_reconciliation
    from riverhouse.platform.sink.clickhouse import (
        PARTITION_COLUMN,
        delta_date_column,
        duplicate_key_count,
        last_loaded_version,
        open_client,
        qualified_table,
        sink_table_path,
    )

    path = sink_table_path(spec, settings.warehouse)
    table = open_table(path)
    delta_counts: dict[str, int] = {}
    ch_counts: dict[str, int] = {}
    with open_client(settings.clickhouse_dsn) as client:
        version = last_loaded_version(client, spec, table.metadata().id) if table is not None else None
        rows = client.query(
            f"SELECT toString({PARTITION_COLUMN}), count() FROM {qualified_table(spec)} GROUP BY {PARTITION_COLUMN}"
        ).result_rows
        ch_counts = {day: int(n) for day, n in rows}
        duplicates = duplicate_key_count(client, spec)
    if table is not None and version is not None:
        table.load_as_version(version)
        date_col = delta_date_column(spec)
        flt = pc.field("_status") == "emitted" if spec.is_join else None
        dates = table.to_pyarrow_dataset().to_table(columns=[date_col], filter=flt)
        if dates.num_rows:
            grouped = dates.group_by(date_col).aggregate([(date_col, "count")])
            delta_counts = {
                str(d): int(n)
                for d, n in zip(
                    grouped.column(date_col).to_pylist(), grouped.column(f"{date_col}_count").to_pylist(), strict=True
                )
            }
    days = sorted(set(delta_counts) | set(ch_counts))
    per_day = pa.table(
        {
            "day": pa.array(days, pa.string()),
            "delta_rows": pa.array([delta_counts.get(d, 0) for d in days], pa.int64()),
            "clickhouse_rows": pa.array([ch_counts.get(d, 0) for d in days], pa.int64()),
        }
    )
    outcome = validate_reconciliation(spec, per_day)
    return outcome, {
        "rows": sum(ch_counts.values()),
        "delta_rows": sum(delta_counts.values()),
        "duplicate_keys": duplicates,
        "days": len(days),
        "days_mismatched": sum(1 for d in days if delta_counts.get(d, 0) != ch_counts.get(d, 0)),
        "loaded_version": -1 if version is None else version,
    }
