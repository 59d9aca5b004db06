"""Window-bounded deduplication: inside a micro-batch (Arrow), then against silver (MERGE).

Semantics (`keep: first`): for each key, the first event (by event time, then
Kafka partition and offset) is kept; a later event with the same key whose
event time is within `window` of a kept event is a duplicate. An event that
arrives in a later batch is compared with what silver already holds, which
has already been published downstream, so the stored event wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from riverhouse.platform.tables import commit_properties

ORDER_COLUMNS = ["_event_time", "_topic", "_partition", "_offset"]


def _micros(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)


def dedup_in_batch(rows: pa.Table, key: list[str], window: timedelta) -> pa.Table:
    """Keep the first event per key and window; rows come back sorted by key then time."""
    if rows.num_rows <= 1:
        return rows
    order = pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in [*key, *ORDER_COLUMNS]])
    rows = rows.take(order)
    n = rows.num_rows
    new_key = np.zeros(n, dtype=bool)
    new_key[0] = True
    for k in key:
        col = rows.column(k).combine_chunks()
        differs = pc.not_equal(col.slice(1), col.slice(0, n - 1))
        # Keys are required fields, so nulls never reach here; treat them as different anyway.
        new_key[1:] |= pc.fill_null(differs, True).to_numpy(zero_copy_only=False)
    times = _micros(rows.column("_event_time"))
    window_us = int(window / timedelta(microseconds=1))
    group = np.cumsum(new_key) - 1
    first_time = times[np.flatnonzero(new_key)][group]
    keep = new_key.copy()
    beyond = (~new_key) & (times - first_time > window_us)
    if beyond.any():
        # Rare: one key spans more than a window inside one batch. Walk those keys in order,
        # keeping each event that is more than a window after the last kept one.
        for g in np.unique(group[beyond]):
            idx = np.flatnonzero(group == g)
            last_kept = times[idx[0]]
            for i in idx[1:]:
                if times[i] - last_kept > window_us:
                    keep[i] = True
                    last_kept = times[i]
    return rows.filter(pa.array(keep))


@dataclass(frozen=True)
class MergeOutcome:
    inserted: int
    committed: bool


def _quote(name: str) -> str:
    return f'"{name}"'


def merge_insert_if_absent(
    silver: DeltaTable,
    rows: pa.Table,
    key: list[str],
    window: timedelta,
    app_id: str,
    batch_id: int,
) -> MergeOutcome:
    """Insert each row unless silver holds the same key within `window` of its event time.

    The predicate carries literal bounds on the partition column, so delta-rs prunes
    every file outside [min date - window, max date + window]: the cost follows the
    window, not the table's history.
    """
    if rows.num_rows == 0:
        return MergeOutcome(0, False)
    delta = pa.scalar(window, pa.duration("us"))
    source = rows.append_column("_window_lo", pc.subtract(rows.column("_event_time"), delta))
    source = source.append_column("_window_hi", pc.add(rows.column("_event_time"), delta))
    days = window.days + 1
    lo_date = pc.min(rows.column("_event_date")).as_py() - timedelta(days=days)
    hi_date = pc.max(rows.column("_event_date")).as_py() + timedelta(days=days)
    predicate = " AND ".join(
        [
            *(f"t.{_quote(k)} = s.{_quote(k)}" for k in key),
            f"t.\"_event_date\" >= '{lo_date.isoformat()}'",
            f"t.\"_event_date\" <= '{hi_date.isoformat()}'",
            't."_event_time" >= s."_window_lo"',
            't."_event_time" <= s."_window_hi"',
        ]
    )
    metrics = (
        silver.merge(
            source=source,
            predicate=predicate,
            source_alias="s",
            target_alias="t",
            commit_properties=commit_properties(app_id, batch_id),
        )
        .when_not_matched_insert(updates={c: f"s.{_quote(c)}" for c in rows.column_names})
        .execute()
    )
    return MergeOutcome(int(metrics.get("num_target_rows_inserted", 0)), True)
