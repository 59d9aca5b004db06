"""Data-quality predicates over Delta and ClickHouse (used by the Dagster asset checks)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.tables import open_table


def duplicate_keys_within_window(path: str, key: list[str], window: timedelta, limit: int = 20) -> tuple[int, list[dict[str, Any]]]:
    """Pairs of silver rows with the same key whose event times are within `window`.

    Returns (number of offending rows, a sample of them). Only the key and time
    columns are read.
    """
    table = open_table(path)
    if table is None:
        return 0, []
    rows = table.to_pyarrow_dataset().to_table(columns=[*key, "_event_time", "_topic", "_partition", "_offset"])
    if rows.num_rows < 2:
        return 0, []
    rows = rows.sort_by([(k, "ascending") for k in key] + [("_event_time", "ascending")])
    n = rows.num_rows
    same = np.ones(n - 1, dtype=bool)
    for k in key:
        col = pc.cast(rows.column(k), pa.string()) if pa.types.is_string_view(rows.column(k).type) else rows.column(k)
        col = col.combine_chunks()
        same &= pc.fill_null(pc.equal(col.slice(1), col.slice(0, n - 1)), False).to_numpy(zero_copy_only=False)
    times = pc.cast(rows.column("_event_time"), pa.int64()).to_numpy(zero_copy_only=False)
    close = (times[1:] - times[:-1]) <= int(window / timedelta(microseconds=1))
    offending = np.flatnonzero(same & close) + 1
    sample = rows.take(pa.array(offending[:limit])).to_pylist() if offending.size else []
    for row in sample:
        row["_event_time"] = str(row["_event_time"])
    return int(offending.size), sample


def delta_row_count(path: str) -> int:
    table = open_table(path)
    return 0 if table is None else table.to_pyarrow_dataset().count_rows()
