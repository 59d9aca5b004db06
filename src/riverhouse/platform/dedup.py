"""Window-bounded deduplication: inside a micro-batch (Arrow), then against silver (insert-if-absent).

Semantics (`keep: first`): for each key, the first event (by event time, then
Kafka partition and offset) is kept; a later event with the same key whose
event time is within `window` of a kept event is a duplicate. An event that
arrives in a later batch is compared with what silver already holds, which
has already been published downstream, so the stored event wins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import date, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from riverhouse.platform.tables import commit_properties, plain_strings

ORDER_COLUMNS = ["_event_time", "_topic", "_partition", "_offset"]
# Each batch adds a file to every day it touches, and each dedup lookup opens every file
# within a window of the batch's days: past this many, those days are compacted.
COMPACT_AT_FILES_DEFAULT = 16


def compact_at_files() -> int:
    """Files a dedup lookup may open before their days are compacted ($RIVERHOUSE_COMPACT_AT_FILES)."""
    raw = os.environ.get("RIVERHOUSE_COMPACT_AT_FILES", "")
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else COMPACT_AT_FILES_DEFAULT


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
class InsertOutcome:
    inserted: int
    # Silver files read to find the stored events of the batch's keys: only the
    # partitions within a window of the batch's dates.
    files_scanned: int


def _lookup_days(rows: pa.Table, window: timedelta) -> tuple[date, date]:
    """First and last `_event_date` a batch's lookup reads: its own days, a window either side."""
    days = timedelta(days=window.days + 1)
    return (pc.min(rows.column("_event_date")).as_py() - days, pc.max(rows.column("_event_date")).as_py() + days)


def compact_lookup_days(silver: DeltaTable, rows: pa.Table, window: timedelta) -> dict[str, int]:
    """Rewrite the small files of the days a lookup for `rows` reads into few large ones.

    An OPTIMIZE commit changes no data (`dataChange` false): the change feed the
    loader and the Dagster assets read has no rows for it, and each app's last batch
    id stays in the log, so replays are still skipped.
    """
    lo, hi = _lookup_days(rows, window)
    done = silver.optimize.compact(
        partition_filters=[("_event_date", ">=", lo.isoformat()), ("_event_date", "<=", hi.isoformat())]
    )
    return {"files_removed": int(done.get("numFilesRemoved", 0)), "files_added": int(done.get("numFilesAdded", 0))}


def _stored_matches(silver: DeltaTable, rows: pa.Table, key: list[str], window: timedelta) -> tuple[pa.Table, int]:
    """Stored (key..., _event_time) of silver rows sharing a key with `rows`, and the files read.

    Only partitions within a window of the batch's dates are read. Memory follows the
    batch, not the window: the scan streams those files and keeps only the rows whose
    first key column holds one of the batch's values.
    """
    lo_date, hi_date = _lookup_days(rows, window)
    near = (pc.field("_event_date") >= pa.scalar(lo_date, pa.date32())) & (
        pc.field("_event_date") <= pa.scalar(hi_date, pa.date32())
    )
    dataset = silver.to_pyarrow_dataset()
    fragments = list(dataset.get_fragments(filter=near))
    if not fragments:
        return rows.select([*key, "_event_time"]).slice(0, 0), 0
    first = key[0]
    values = pc.unique(rows.column(first)).cast(dataset.schema.field(first).type)
    stored = dataset.scanner(
        columns=[*key, "_event_time"],
        filter=near & pc.field(first).isin(values),
        batch_readahead=2,
        fragment_readahead=1,
    ).to_table()
    return plain_strings(stored).cast(rows.select([*key, "_event_time"]).schema), len(fragments)


def insert_if_absent(
    silver: DeltaTable,
    rows: pa.Table,
    key: list[str],
    window: timedelta,
    app_id: str,
    batch_id: int,
) -> InsertOutcome:
    """Append each row unless silver holds the same key within `window` of its event time.

    The lookup reads only the partitions within a window of the batch's event dates, so
    the cost follows the window, not the table's history. The append and the batch's
    app transaction are one Delta commit. Silver has one writer at a time (the source's
    run lock, which backfills take too), so what the lookup saw is still what the
    append commits against. A plain append, unlike a MERGE, needs no change-data files:
    readers of the change feed see its rows as inserts.
    """
    if rows.num_rows == 0:
        return InsertOutcome(0, 0)
    stored, files_scanned = _stored_matches(silver, rows, key, window)
    keep = rows
    if stored.num_rows:
        delta = pa.scalar(window, pa.duration("us"))
        probe = rows.select([*key, "_event_time"]).append_column(
            "_row", pa.array(np.arange(rows.num_rows, dtype=np.int64))
        )
        pairs = probe.join(stored.rename_columns([*key, "_stored_time"]), keys=key, join_type="inner")
        lo = pc.subtract(pairs.column("_event_time"), delta)
        hi = pc.add(pairs.column("_event_time"), delta)
        stored_time = pairs.column("_stored_time")
        within = pc.and_(pc.greater_equal(stored_time, lo), pc.less_equal(stored_time, hi))
        duplicate_rows = pc.unique(pairs.filter(within).column("_row"))
        if len(duplicate_rows):
            mask = np.ones(rows.num_rows, dtype=bool)
            mask[duplicate_rows.to_numpy()] = False
            keep = rows.filter(pa.array(mask))
    write_deltalake(silver, keep, mode="append", commit_properties=commit_properties(app_id, batch_id))
    return InsertOutcome(keep.num_rows, files_scanned)
