"""Window-bounded deduplication in Spark: inside a micro-batch, then against what silver holds.

Semantics (`keep: first`): for each key, the first event (by event time, then
Kafka partition and offset) is kept; a later event with the same key whose
event time is within `window` of a kept event is a duplicate. An event that
arrives in a later batch is compared with what silver already holds, which
has already been published downstream, so the stored event wins.

Everything here runs on the executors: the batch is deduplicated with window functions
(and, for the rare key whose events span more than a window inside one batch, the walk of
`dedup_in_batch` per key group), then anti-joined with silver's rows within a window of the
batch's event times (`not_in_silver`), and the rest is appended (ingest/writer.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.state.delta_spark import Appended, ProgressHint, append_once

ORDER_COLUMNS = ["_event_time", "_topic", "_partition", "_offset"]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)


def dedup_in_batch(rows: pa.Table, key: list[str], window: timedelta) -> pa.Table:
    """Keep the first event per key and window; rows come back sorted by key then time.

    The reference walk of the rule, on Arrow: Spark runs it (`dedup_batch`) on the groups of
    keys that span more than a window inside one batch.
    """
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


def _micros_literal(window: timedelta) -> int:
    return int(window / timedelta(microseconds=1))


def dedup_batch(valid: Any, key: list[str], window: timedelta) -> Any:
    """The batch's valid rows minus in-batch duplicates, as a Spark plan (no rows reach the driver).

    Per key, ordered by event time then Kafka coordinates: when every event of the key lies
    within a window of its first, only the first survives (`row_number() = 1`); a key that
    spans more than a window (rare: a batch covers seconds to minutes) is walked in order by
    `dedup_in_batch` on its own group, on an executor.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    by_key = Window.partitionBy(*key)
    ordered = by_key.orderBy(*ORDER_COLUMNS)
    span = F.unix_micros(F.max("_event_time").over(by_key)) - F.unix_micros(F.min("_event_time").over(by_key))
    ranked = valid.withColumn("_rank", F.row_number().over(ordered)).withColumn(
        "_long", span > F.lit(_micros_literal(window))
    )
    short = ranked.filter(~F.col("_long") & (F.col("_rank") == 1)).drop("_rank", "_long")
    columns = valid.columns
    schema = valid.schema

    def walk(group: pa.Table) -> pa.Table:
        return dedup_in_batch(group.select(columns), key, window)

    long = ranked.filter(F.col("_long")).drop("_rank", "_long").groupBy(*key).applyInArrow(walk, schema)
    return short.unionByName(long)


def time_bounds(lo_micros: int, hi_micros: int, window: timedelta) -> tuple[datetime, datetime]:
    """The event times a batch's silver lookup covers: its own, a window either side (UTC)."""
    lo = EPOCH + timedelta(microseconds=lo_micros) - window
    hi = EPOCH + timedelta(microseconds=hi_micros) + window
    return lo, hi


def not_in_silver(
    spark: Any, silver_path: str, unique: Any, key: list[str], window: timedelta, bounds: tuple[datetime, datetime]
) -> Any:
    """The batch's rows that no silver row duplicates: same key, event times within `window`.

    Silver is read only where a duplicate can be: the days and event times in `bounds` (literal
    bounds, so Delta prunes partitions, then files by their `_event_time` statistics). The batch
    is the build side of both joins, so memory follows the batch, not the window: first the
    silver rows that match a batch row (a broadcast of the batch's keys), then the batch rows
    that match none of those (a broadcast of the matches, at most a batch's worth of keys).
    """
    from pyspark.sql import functions as F

    lo, hi = bounds
    micros = _micros_literal(window)
    stored = (
        spark.read.format("delta")
        .load(silver_path)
        .where(
            (F.col("_event_date") >= F.lit(lo.date()))
            & (F.col("_event_date") <= F.lit(hi.date()))
            & (F.col("_event_time") >= F.lit(lo))
            & (F.col("_event_time") <= F.lit(hi))
        )
        .select(*[F.col(k).alias(f"_s_{k}") for k in key], F.unix_micros("_event_time").alias("_s_t"))
    )
    probe = unique.select(*[F.col(k).alias(f"_b_{k}") for k in key], F.unix_micros("_event_time").alias("_b_t"))

    def within(left: str, right: str) -> Any:
        same = [F.col(f"{left}{k}") == F.col(f"{right}{k}") for k in key]
        cond = F.abs(F.col(f"{left}t") - F.col(f"{right}t")) <= F.lit(micros)
        for term in same:
            cond = term & cond
        return cond

    matched = stored.join(F.broadcast(probe), within("_s_", "_b_"), "left_semi")
    batch = unique.withColumn("_b_t", F.unix_micros("_event_time"))
    for k in key:
        batch = batch.withColumn(f"_b_{k}", F.col(k))
    kept = batch.join(F.broadcast(matched), within("_b_", "_s_"), "left_anti")
    return kept.select(*unique.columns)


def insert_new(
    silver_path: str,
    valid: Any,
    key: list[str],
    window: timedelta,
    bounds: tuple[datetime, datetime],
    app_id: str,
    batch_id: int,
    metadata: dict[str, Any] | None = None,
    hint: ProgressHint | None = None,
) -> Appended:
    """Dedup the batch in Spark, leave out what silver already holds, append the rest once per batch id."""
    unique = dedup_batch(valid, key, window)
    fresh = not_in_silver(valid.sparkSession, silver_path, unique, key, window, bounds)
    return append_once(fresh, silver_path, app_id, batch_id, metadata=metadata, hint=hint, table="silver")
