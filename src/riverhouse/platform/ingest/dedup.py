"""Window-bounded deduplication in Spark: inside a micro-batch, then Delta MERGE against silver.

Semantics (`keep: first`): for each key, the first event (by event time, then
Kafka partition and offset) is kept; a later event with the same key whose
event time is within `window` of a kept event is a duplicate. An event that
arrives in a later batch is compared with what silver already holds, which
has already been published downstream, so the stored event wins.

Everything here runs on the executors: the batch is deduplicated with window functions
(and, for the rare key whose events span more than a window inside one batch, the walk of
`dedup_in_batch` per key group), then written with an insert-only `MERGE` whose condition
is bounded to the days within a window of the batch, so Delta prunes the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ORDER_COLUMNS = ["_event_time", "_topic", "_partition", "_offset"]
# Each batch adds a file to every day it touches, and each MERGE reads every file within a
# window of the batch's days: past this many, those days are compacted.
COMPACT_AT_FILES_DEFAULT = 16


def compact_at_files() -> int:
    """Files a MERGE may read before their days are compacted ($RIVERHOUSE_COMPACT_AT_FILES)."""
    raw = os.environ.get("RIVERHOUSE_COMPACT_AT_FILES", "")
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else COMPACT_AT_FILES_DEFAULT


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


def lookup_days(min_date: date, max_date: date, window: timedelta) -> tuple[date, date]:
    """First and last `_event_date` a batch's MERGE reads: its own days, a window either side."""
    days = timedelta(days=window.days + 1)
    return min_date - days, max_date + days


def _sql_date(day: date) -> str:
    return f"DATE'{day.isoformat()}'"


def merge_condition(key: list[str], window: timedelta, days: tuple[date, date]) -> str:
    """Stored row `t` is a duplicate of batch row `s`: same key, event times within a window.

    The `_event_date` bounds are literals, so Delta prunes silver to those partitions before
    it reads a file: the MERGE's cost follows the window and the batch, not the history.
    """
    micros = _micros_literal(window)
    keys = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key)
    return (
        f"{keys} AND t._event_date BETWEEN {_sql_date(days[0])} AND {_sql_date(days[1])} "
        f"AND unix_micros(t._event_time) BETWEEN unix_micros(s._event_time) - {micros} "
        f"AND unix_micros(s._event_time) + {micros}"
    )


@dataclass(frozen=True)
class MergeOutcome:
    inserted: int
    replayed: bool  # the table already had this batch (app transaction): nothing was written


def merge_insert_only(spark: Any, path: str, rows: Any, condition: str, app_id: str, batch_id: int) -> MergeOutcome:
    """`MERGE INTO silver t USING rows s ON condition WHEN NOT MATCHED THEN INSERT *`, once per batch id.

    MERGE ignores the writer's txnAppId/txnVersion options; Delta reads the session's
    `spark.databricks.delta.write.txnAppId/txnVersion` instead, records them in the MERGE's
    commit, and skips the MERGE (returning no metrics row) when the table already holds
    that version for the app. `spark` is the streaming query's own session, so two queries
    running at once never see each other's settings.
    """
    from delta.tables import DeltaTable

    spark.conf.set("spark.databricks.delta.write.txnAppId", app_id)
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
    try:
        metrics = (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(rows.alias("s"), condition)
            .whenNotMatchedInsertAll()
            .execute()
            .collect()
        )
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")
    if not metrics:
        return MergeOutcome(0, replayed=True)
    return MergeOutcome(int(metrics[0]["num_inserted_rows"]), replayed=False)


def insert_new(
    spark: Any,
    path: str,
    valid: Any,
    key: list[str],
    window: timedelta,
    days: tuple[date, date],
    app_id: str,
    batch_id: int,
) -> MergeOutcome:
    """Dedup the batch in Spark, then MERGE insert-only into silver, bounded to `days` (lookup_days)."""
    unique = dedup_batch(valid, key, window)
    return merge_insert_only(spark, path, unique, merge_condition(key, window, days), app_id, batch_id)


def files_in_days(spark: Any, path: str, days: tuple[date, date]) -> int:
    """Data files of silver in [days]: planned from the Delta log (partition values), no data read."""
    from pyspark.sql import functions as F

    table = spark.read.format("delta").load(path)
    day = F.col("_event_date")
    return len(table.where((day >= F.lit(days[0])) & (day <= F.lit(days[1]))).inputFiles())


def compact_days(spark: Any, path: str, days: tuple[date, date]) -> dict[str, int]:
    """Rewrite the small files of those days into few large ones (Delta OPTIMIZE).

    OPTIMIZE changes no data (`dataChange` false): the change feed the loader and the
    Dagster assets read has no rows for it, and each app's last batch id stays in the
    log, so replays are still skipped.
    """
    from delta.tables import DeltaTable

    where = f"_event_date >= {_sql_date(days[0])} AND _event_date <= {_sql_date(days[1])}"
    done = DeltaTable.forPath(spark, path).optimize().where(where).executeCompaction().collect()
    metrics = done[0]["metrics"] if done else None
    return {
        "files_removed": int(metrics["numFilesRemoved"]) if metrics else 0,
        "files_added": int(metrics["numFilesAdded"]) if metrics else 0,
    }
