"""Data-quality predicates over Delta and ClickHouse (used by the Dagster asset checks)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import open_table, plain_strings


def duplicate_keys_within_window(
    path: str,
    key: list[str],
    window: timedelta,
    limit: int = 20,
    time_column: str = "_event_time",
    emitted_only: bool = False,
) -> tuple[int, list[dict[str, Any]]]:
    """Rows whose key equals the previous row's within `window` (by `time_column`).

    Returns (number of offending rows, a sample of them). Only the key and time
    columns are read. `emitted_only`: gold tables, rows that reach ClickHouse.
    """
    table = open_table(path)
    if table is None:
        return 0, []
    dataset = table.to_pyarrow_dataset()
    flt = pc.field("_status") == "emitted" if emitted_only else None
    rows = plain_strings(dataset.to_table(columns=list(dict.fromkeys([*key, time_column])), filter=flt))
    if rows.num_rows < 2:
        return 0, []
    rows = rows.sort_by([(k, "ascending") for k in key] + [(time_column, "ascending")])
    n = rows.num_rows
    same = np.ones(n - 1, dtype=bool)
    for k in key:
        col = rows.column(k).combine_chunks()
        same &= pc.fill_null(pc.equal(col.slice(1), col.slice(0, n - 1)), False).to_numpy(zero_copy_only=False)
    times = pc.cast(rows.column(time_column), pa.int64()).to_numpy(zero_copy_only=False)
    close = (times[1:] - times[:-1]) <= int(window / timedelta(microseconds=1))
    offending = np.flatnonzero(same & close) + 1
    sample = rows.take(pa.array(offending[:limit])).to_pylist() if offending.size else []
    for row in sample:
        row[time_column] = str(row[time_column])
    return int(offending.size), sample


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
