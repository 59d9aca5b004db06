"""Data-quality predicates over Delta and ClickHouse (used by the Dagster asset checks)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.tables import open_table, plain_strings


def duplicate_keys_within_window(path: str, key: list[str], window: timedelta, limit: int = 20,
                                 time_column: str = "_event_time", emitted_only: bool = False,
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
