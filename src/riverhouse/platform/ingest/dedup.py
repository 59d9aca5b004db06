"""Window-bounded deduplication in Spark: inside a micro-batch, then against what silver holds.

Semantics (`keep: first`): for each key, the first event (by event time, then
Kafka partition and offset) is kept; a later event with the same key whose
event time is within `window` of a kept event is a duplicate. An event that
arrives in a later batch is compared with what silver already holds, which
has already been published downstream, so the stored event wins.

Everything here runs on the executors: the batch is deduplicated with a window function
(and, for the rare key whose events span more than a window inside one batch, the walk of
`dedup_in_batch` per key group), then anti-joined with silver's rows within a window of the
batch's event times (`not_in_silver`), and the rest is appended (ingest/writer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.state.delta_log import DeltaLog, Overlap, overlapping
from riverhouse.platform.state.delta_spark import (
    Appended,
    ProgressHint,
    append_once,
    observation_name,
    observe_batch,
)

ORDER_COLUMNS = ["_event_time", "_topic", "_partition", "_offset"]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Silver's rows in a batch's range, per valid row of the batch, up to which the lookup is a sort-merge
# anti join (`not_in_silver`). Measured on 484,000 batch rows (bench/analysis.md): 440,000 stored rows
# 1.35 -> 0.95 s, 1,040,000 1.39 -> 1.30 s, 2,440,000 1.97 -> 2.81 s (the merge sorts every stored row).
MERGE_JOIN_MAX_STORED_PER_ROW = 2


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


@dataclass
class InBatch:
    """`dedup_batch`'s result: the rows kept, how many keys were walked, and the caches to release."""

    unique: Any
    long_keys: int
    cached: list[Any] = field(default_factory=list)
    # `unique` is the window pass's output as it is: hash-partitioned by the key and sorted by it.
    by_key: bool = True
    # A job has computed the cache already (the count of long keys over it).
    built: bool = False

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


def dedup_batch(
    valid: Any,
    key: list[str],
    window: timedelta,
    name: str = "rh_dedup",
    span_micros: int | None = None,
    columns: list[str] | None = None,
    read_twice: bool = True,
) -> InBatch:
    """The batch's valid rows minus in-batch duplicates, as a Spark plan; and the keys walked.

    `span_micros`: the batch's own event-time span (its latest valid event time minus its
    earliest, which the bronze append observed). When it is within the window (nearly always: a
    batch covers seconds to minutes) no key can span more, and each key's first event (by event
    time, then Kafka coordinates) is the only one kept: `first_per_key`, a window's row number.

    Otherwise (a backlog of hours under a short window, a backfill of old data) some key's own
    events may span more. The rare keys that do are walked in order by `dedup_in_batch` on their
    own group, on an executor (a Python stage); the others keep their first event. Two ways to
    find them, by what the result's readers need (`read_twice`):
    - read twice: the window pass that ranks each key's rows also measures each key's span
      (`_ranked_with_span`), the rows it keeps are cached, and a job over that cache counts the
      long keys: one shuffle of the batch;
    - read once: a job counts the long keys first (a hash aggregate of each key's span over the
      key and time columns), and with none the window pass is read by the append alone, uncached.
    Each is the cheaper one for its case (bench/analysis.md).

    The result is cached when two jobs read it: the silver lookup's semi join and the append
    (`read_twice`: silver has files in the batch's range), and whenever keys were walked. A batch
    with no silver file to look up reads it once, by its append; a cache then costs a plan for the
    cache and, under Spark Connect, two round trips to the engine (`persist`, `unpersist`): small
    batches through the engine 1.23 -> 1.13 s median, unchanged in-process (bench/analysis.md). The
    caller releases what was cached (`InBatch.release`). `columns`: `valid`'s columns when the
    caller knows them (under Spark Connect, `valid.columns` asks the engine to analyse the plan).
    `name`: the counts' observation, which names their job in Spark's plans (the bench's stage
    tables read it).
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    columns = valid.columns if columns is None else columns
    micros = _micros_literal(window)
    within = span_micros is not None and span_micros <= micros  # no key can span more than the batch
    counted = None if within or read_twice else _count_long_keys(valid, key, micros, name)
    if within or counted == 0:
        # Each key's first event is all it keeps.
        unique = first_per_key(valid, key)
        if read_twice:
            unique = unique.persist(StorageLevel.MEMORY_AND_DISK)
            return InBatch(unique, 0, [unique])
        return InBatch(unique, 0)
    is_long = F.col("_span") > F.lit(micros)
    first = F.col("_rank_in_group").eqNullSafe(1)
    kept = _ranked_with_span(valid, key).where(first | is_long).persist(StorageLevel.MEMORY_AND_DISK)
    # Not counted yet (read twice): the job that counts them over the cache builds it.
    long_keys = _observed_long(kept.where(first), is_long, name) if counted is None else counted
    if not long_keys:
        return InBatch(kept.select(*columns), 0, [kept], built=True)
    schema = valid.select(*columns).schema

    def walk(group: pa.Table) -> pa.Table:
        return dedup_in_batch(group.select(columns), key, window)

    walked = kept.where(is_long).select(*columns).groupBy(*key).applyInArrow(walk, schema)
    unique = kept.where(~is_long).select(*columns).unionByName(walked).persist(StorageLevel.MEMORY_AND_DISK)
    return InBatch(unique, long_keys, [unique, kept], by_key=False, built=True)


def _count_long_keys(valid: Any, key: list[str], micros: int, name: str) -> int:
    """How many keys' own events span more than `micros`: one job, a hash aggregate of each key's
    event-time span (fixed-width buffers) that reads only the key and time columns."""
    from pyspark.sql import functions as F

    time = F.unix_micros("_event_time")
    spans = valid.groupBy(*key).agg((F.max(time) - F.min(time)).alias("_span"))
    return _observed_long(spans, F.col("_span") > F.lit(micros), name)


def _build(cached: Any, name: str) -> None:
    """Compute a cached frame in a job of its own, one task per partition, observed under `name`."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observe_batch(cached, Observation(name), [F.count(F.lit(1)).alias("rows")]).count()


def _observed_long(rows: Any, is_long: Any, name: str) -> int:
    """The rows of `rows` where `is_long` holds, counted by a job observed under `name`."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    seen = Observation(name)
    observe_batch(rows, seen, [F.sum(F.when(is_long, 1).otherwise(0)).alias("long")]).count()
    return int(seen.get["long"] or 0)


def _ranked_with_span(valid: Any, key: list[str]) -> Any:
    """`valid` with each row's rank in its key (`_rank_in_group`, by event time, then Kafka
    coordinates) and its key's event-time span in microseconds (`_span`): one window pass, one
    shuffle by the key and one sort (both window functions share the partitioning and order)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*key).orderBy(*ORDER_COLUMNS)
    whole = order.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    micros = F.unix_micros("_event_time")
    return valid.select(
        "*",
        F.row_number().over(order).alias("_rank_in_group"),
        (F.max(micros).over(whole) - F.min(micros).over(whole)).alias("_span"),
    )


def first_per_key(valid: Any, key: list[str]) -> Any:
    """Each key's first row (by event time, then Kafka coordinates): `first_rows`.

    A window's row number, not an aggregate: `min_by` over a struct of the row has no fixed-width
    buffer, so Spark plans it as a sort aggregate (a sort before the shuffle and one after, each
    row copied into a struct and compared as one), which cost 2.3 CPU s where this costs 1.3 on
    220,000 rows (bench/analysis.md).
    """
    return first_rows(valid, key, ORDER_COLUMNS)


def first_rows(rows: Any, group_by: list[str], order_by: list[str]) -> Any:
    """Each group's first row by `order_by`, with `rows`' columns: one shuffle by the group, one sort.

    `<=> 1` rather than `= 1`: Spark's optimizer turns a filter `row_number = 1` into a partial group
    limit, a sort of all the rows before the shuffle, which drops almost nothing when a group has a
    row or two; the row number is never null, so `<=>` keeps the same rows.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*group_by).orderBy(*order_by)
    ranked = rows.withColumn("_rank_in_group", F.row_number().over(order))
    return ranked.where(F.col("_rank_in_group").eqNullSafe(1)).drop("_rank_in_group")


def time_bounds(lo_micros: int, hi_micros: int, window: timedelta) -> tuple[datetime, datetime]:
    """The event times a batch's silver lookup covers: its own, a window either side (UTC)."""
    lo = EPOCH + timedelta(microseconds=lo_micros) - window
    hi = EPOCH + timedelta(microseconds=hi_micros) + window
    return lo, hi


def silver_files(
    silver_path: str, bounds: tuple[datetime, datetime], key_range: tuple[str, Any, Any] | None = None
) -> Overlap:
    """The silver files that can hold a duplicate of the batch's rows, and the rows they hold:
    those whose days and `_event_time` statistics overlap `bounds` and whose key statistics overlap
    the batch's `key_range` (the lowest and highest of its first key column,
    `state/tables.key_range_column`), chosen from the Delta log (`delta_log.overlapping`: what
    Delta's planner would choose, without rebuilding the snapshot after every commit)."""
    lo, hi = bounds
    return overlapping(silver_path, "_event_time", lo, hi, "_event_date", key_range=key_range)


def merge_join(stored_rows: int | None, batch_rows: int | None, by_key: bool) -> bool:
    """Is silver's lookup a sort-merge anti join (`not_in_silver`)? When the batch's rows are the window
    pass's output (`by_key`: already partitioned and sorted by the key, so only silver's side is
    shuffled and sorted) and silver's rows in range are known and at most
    `MERGE_JOIN_MAX_STORED_PER_ROW` per batch row. Else the broadcast joins, whose cost per stored
    row is a hash probe."""
    if not by_key or stored_rows is None or batch_rows is None:
        return False
    return stored_rows <= MERGE_JOIN_MAX_STORED_PER_ROW * batch_rows


def not_in_silver(
    spark: Any, silver_path: str, unique: Any, key: list[str], window: timedelta, files: list[str], merge: bool = False
) -> Any:
    """The batch's rows (`unique`, with its columns) that no silver row duplicates: same key, event
    times within `window`.

    Silver is read only where a duplicate can be: `files` (`silver_files`), read by Spark as
    Parquet, key and event-time columns only, with their types from the table's log (no round
    trip to the engine). Two plans, by sizes (`merge_join`); neither holds the window in memory:
    - `merge`: one sort-merge anti join. The batch's side is the window pass's cache, whose
      partitioning and order by the key Spark reuses: only silver's rows are shuffled and sorted
      (spilling when they must), no row reaches the driver, and the append's job is the only one;
    - else two broadcast joins, the batch the build side of both, so memory follows the batch: the
      silver rows that match a batch row (a broadcast of the batch's keys), then the batch rows
      that match none of those (a broadcast of the matches, at most a batch's worth of keys). A
      stored row costs a hash probe there, against a shuffle and a sort in the merge, so this plan
      is the one when silver's range holds many more rows than the batch (a live stream's small
      batches under a long window).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    micros = _micros_literal(window)
    if not files:
        return unique  # silver holds nothing within a window of this batch
    stored_types = {f.name: f.dataType for f in DeltaLog(silver_path).schema().fields}
    # No filter on the time bounds here: the files were chosen by them, the join's condition
    # checks each pair, and a literal that changes every batch would make Spark generate and
    # compile new code for this scan every batch (bench/analysis.md).
    stored = (
        spark.read.schema(StructType([StructField(c, stored_types[c]) for c in [*key, "_event_time"]]))
        .parquet(*files)
        .select(*[F.col(k).alias(f"_s_{k}") for k in key], F.unix_micros("_event_time").alias("_s_t"))
    )
    # Same key as a silver row and an event time within the window of it. The batch's side keeps its
    # own column names (silver's are `_s_` ones), so every join reads this one condition, and the
    # anti join keeps `unique`'s columns as they are: no renamed copy to build and drop (in-process,
    # each DataFrame step is a py4j round trip in which Spark analyses the plan so far).
    within = F.abs(F.unix_micros("_event_time") - F.col("_s_t")) <= F.lit(micros)
    for k in key:
        within = (F.col(k) == F.col(f"_s_{k}")) & within
    if merge:
        return unique.join(stored.hint("merge"), within, "left_anti")
    matched = stored.join(F.broadcast(unique.select(*key, "_event_time")), within, "left_semi")
    return unique.join(F.broadcast(matched), within, "left_anti")


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
    key_range: tuple[str, Any, Any] | None = None,
    columns: list[str] | None = None,
    valid_rows: int | None = None,
) -> Appended:
    """Dedup the batch in Spark, leave out what silver already holds, append the rest once per batch id.

    `key_range`: (column, lowest, highest) of the batch's valid rows, when known (`silver_files`).
    `columns`: `valid`'s columns, when known (else asked of Spark). `valid_rows`: how many rows
    `valid` has, when known (bronze's append observed it): it chooses the lookup's plan."""
    lo, hi = bounds  # the batch's own span, widened by the window on both sides
    span = int((hi - lo - 2 * window) / timedelta(microseconds=1))
    columns = valid.columns if columns is None else columns
    stored = silver_files(silver_path, bounds, key_range)
    name = observation_name("rh_dedup", silver_path)
    in_batch = dedup_batch(valid, key, window, name, span, columns, read_twice=bool(stored.paths))
    try:
        merge = merge_join(stored.records, valid_rows, in_batch.by_key)
        if merge and not in_batch.built:
            # Else the append's one task (`coalesce(1)`) would compute the cache, and the window pass
            # with it: 2.55 -> 2.14 s for a 484,000-row batch (bench/analysis.md).
            _build(in_batch.unique, name)
        spark = valid.sparkSession
        fresh = not_in_silver(spark, silver_path, in_batch.unique, key, window, stored.paths, merge)
        # One file per day and batch (a batch is bounded by maxOffsetsPerTrigger): fewer files for
        # the next batches' lookups and for compaction.
        fresh = fresh.coalesce(1)
        return append_once(fresh, silver_path, app_id, batch_id, metadata=metadata, hint=hint, table="silver")
    finally:
        in_batch.release()
