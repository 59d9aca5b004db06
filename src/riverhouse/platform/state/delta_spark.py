"""delta-spark reads and writes shared by gold and backfills: pinned snapshots, windows, commits.

Every read here is a Spark plan over a Delta table at a fixed version, so the several jobs of
one run (counts, comparisons, writes) see the same snapshot even if they recompute it. The
driver receives versions, counts and commit metadata, never the rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any

USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def table_version(spark: Any, path: str) -> int:
    """The table's latest version (one row of its history)."""
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).select("version").first()[0])


def read_at(spark: Any, path: str, version: int) -> Any:
    """The table as of `version`."""
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def inserts_between(spark: Any, path: str, start: int, end: int, columns: list[str]) -> Any:
    """Rows that versions start..end inserted (change data feed), with `columns`."""
    from pyspark.sql import functions as F

    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .option("endingVersion", end)
        .load(path)
        .where(F.col("_change_type") == "insert")
        .select(*columns)
    )


def utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


def spark_time(value: datetime | None) -> datetime | None:
    """A timestamp Spark handed the driver (naive, in the driver's local time zone) as an aware UTC one."""
    return None if value is None else value.astimezone(UTC)


def last_day(end: datetime) -> date:
    """The last date of a half-open window ending at `end`."""
    return (utc(end) - timedelta(microseconds=1)).date()


def between(time_col: str, date_col: str, lo: datetime | None, hi: datetime | None, hi_open: bool = False) -> Any:
    """lo <= time <= hi (time < hi when `hi_open`), with literal date bounds so Delta prunes partitions."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    if lo is not None:
        cond = cond & (F.col(date_col) >= F.lit(utc(lo).date())) & (F.col(time_col) >= F.lit(utc(lo)))
    if hi is not None:
        top = last_day(hi) if hi_open else utc(hi).date()
        upper = F.col(time_col) < F.lit(utc(hi)) if hi_open else F.col(time_col) <= F.lit(utc(hi))
        cond = cond & (F.col(date_col) <= F.lit(top)) & upper
    return cond


def _sql_ts(moment: datetime) -> str:
    return f"TIMESTAMP'{utc(moment).strftime('%Y-%m-%d %H:%M:%S.%f')}Z'"


def window_predicate(time_col: str, date_col: str, start: datetime, end: datetime) -> str:
    """start <= time < end as SQL text (`replaceWhere`), dates first so Delta prunes partitions."""
    return (
        f"`{date_col}` >= DATE'{utc(start).date().isoformat()}' AND `{date_col}` <= DATE'{last_day(end).isoformat()}' "
        f"AND `{time_col}` >= {_sql_ts(start)} AND `{time_col}` < {_sql_ts(end)}"
    )


def conform(df: Any, schema: Any) -> Any:
    """`df`'s columns in the order and types of `schema` (a Spark StructType)."""
    from pyspark.sql import functions as F

    return df.select(*[F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in schema.fields])


def same_rows(new: Any, current: Any) -> tuple[int, int, bool]:
    """Row counts of both sides and whether they hold the same rows (as multisets), computed by Spark.

    Equal counts and nothing of `new` missing from `current` (exceptAll keeps duplicates)
    means equal multisets; only two counts and one emptiness test reach the driver.
    """
    n_new, n_current = new.count(), current.count()
    return n_new, n_current, n_new == n_current and new.exceptAll(current).isEmpty()


def replace_where(df: Any, path: str, predicate: str, metadata: dict[str, str]) -> None:
    """Replace the rows matching `predicate` with `df`: one Delta commit (removes + adds)."""
    (
        df.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", predicate)
        .option("userMetadata", json.dumps(metadata, sort_keys=True))
        .save(path)
    )


@contextmanager
def commit_metadata(spark: Any, metadata: dict[str, str]) -> Iterator[None]:
    """The commit(s) inside carry `metadata` as their userMetadata (MERGE has no writer options)."""
    spark.conf.set(USER_METADATA_CONF, json.dumps(metadata, sort_keys=True))
    try:
        yield
    finally:
        spark.conf.unset(USER_METADATA_CONF)


def user_metadata(raw: str | None) -> dict[str, Any]:
    """A commit's userMetadata as a dict ({} when absent or not Riverhouse's JSON)."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def latest_metadata_with(spark: Any, path: str, key: str, depth: int = 50) -> dict[str, Any] | None:
    """The userMetadata of the newest of the last `depth` commits that holds `key`."""
    from delta.tables import DeltaTable

    for row in DeltaTable.forPath(spark, path).history(depth).select("version", "userMetadata").collect():
        meta = user_metadata(row["userMetadata"])
        if key in meta:
            return meta
    return None


def insert_absent(spark: Any, path: str, rows: Any, condition: str) -> int:
    """`MERGE INTO t USING rows s ON condition WHEN NOT MATCHED THEN INSERT *`; returns rows inserted."""
    from delta.tables import DeltaTable

    metrics = (
        DeltaTable.forPath(spark, path).alias("t").merge(rows.alias("s"), condition).whenNotMatchedInsertAll().execute()
    ).collect()
    return int(metrics[0]["num_inserted_rows"]) if metrics else 0
