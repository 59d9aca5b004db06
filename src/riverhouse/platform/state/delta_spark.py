"""delta-spark reads and writes shared by every layer: pinned snapshots, windows, appends once.

Every read here is a Spark plan over a Delta table at a fixed version, so the several jobs of
one run (counts, comparisons, writes) see the same snapshot even if they recompute it. The
driver receives versions, counts and commit metadata, never the rows.

Writes are appends marked with their writer's app id and batch (or run) number in the
commit's userMetadata (`append_once`). A writer that replays a batch finds its mark in the
Delta log and skips the table: exactly once per table without Delta's `txnAppId`/`txnVersion`,
which in Delta 4.4 rebuild the whole snapshot state before every write (bench/analysis.md),
and without session settings that two pipelines sharing a Spark Connect session could see.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Protocol

from riverhouse.platform.state.delta_log import MARK_APP, MARK_BATCH, DeltaLog, DeltaLogError


@dataclass(frozen=True)
class Appended:
    """What `append_once` did: the version holding the batch, and the rows it wrote (None: replayed)."""

    version: int
    rows: int | None
    observed: dict[str, Any] = field(default_factory=dict)

    @property
    def replayed(self) -> bool:
        return self.rows is None


class ProgressHint(Protocol):
    """Where a writer keeps, per table, the last batch it committed (a hint; the log is the truth)."""

    def table_progress(self, table: str) -> dict[str, Any] | None: ...

    def record_table(self, table: str, app_id: str, batch_id: int, version: int) -> None: ...


def table_version(path: str) -> int:
    """The table's latest version, read from its Delta log (no Spark job)."""
    version = DeltaLog(path).latest_version()
    if version is None:
        raise DeltaLogError(f"no Delta table at {path}")
    return version


def append_once(
    rows: Any,
    path: str,
    app_id: str,
    batch_id: int,
    metadata: dict[str, Any] | None = None,
    hint: ProgressHint | None = None,
    table: str = "",
    observe: list[Any] | None = None,
    columns: list[str] | None = None,
) -> Appended:
    """Append `rows` to the Delta table at `path` unless it already holds `app_id`'s batch `batch_id`.

    The commit's userMetadata carries the mark (app id, batch id) and `metadata`. `observe`:
    extra aggregate columns computed while writing (Spark's observed metrics, no extra job);
    the row count is always among them. `columns`: the columns written, when `rows` holds more
    that an observed aggregate reads.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    log = DeltaLog(path)
    known = hint.table_progress(table) if hint is not None else None
    after = -1
    if known and known.get("app_id") == app_id:
        if int(known["batch_id"]) >= batch_id:
            return Appended(int(known["version"]), None)
        after = int(known["version"])
    done = log.find_batch(app_id, batch_id, after)
    if done is not None:
        if hint is not None:
            hint.record_table(table, app_id, batch_id, done)
        return Appended(done, None)
    before = log.latest_version()
    mark = {MARK_APP: app_id, MARK_BATCH: batch_id, **(metadata or {})}
    observation = Observation(observation_name(f"rh_append_{table or 'rows'}", path))
    observed = observe_batch(rows, observation, [F.count(F.lit(1)).alias("_rows"), *(observe or [])])
    if columns is not None:
        observed = observed.select(*columns)
    observed.write.format("delta").mode("append").option("userMetadata", json.dumps(mark, sort_keys=True)).save(path)
    figures = dict(observation.get)
    written = int(figures.pop("_rows"))
    version = log.find_batch(app_id, batch_id, -1 if before is None else before)
    if version is None:
        if written == 0 and before is not None:
            # Delta commits nothing for an empty append: no mark, and none needed, since a
            # replay of this batch writes nothing again.
            return Appended(before, 0, figures)
        raise DeltaLogError(f"Delta table {path}: the commit of {app_id} batch {batch_id} is not in the log")
    if hint is not None:
        hint.record_table(table, app_id, batch_id, version)
    return Appended(version, written, figures)


def observe_batch(rows: Any, observation: Any, exprs: list[Any]) -> Any:
    """`rows.observe(observation, *exprs)` for a frame that is not a streaming one (a micro-batch
    in foreachBatch, a backfill's rows).

    Spark Connect's `observe` first asks the engine whether the frame is streaming: a round trip
    in which the engine analyses the whole plan (15-40 ms a write, two writes a batch,
    bench/analysis.md). Riverhouse never observes a streaming frame, so that question is left
    out: the plan is the one `observe` builds (pyspark 4's client, pinned in pyproject.toml),
    and any other session observes as usual.
    """
    if not type(rows).__module__.startswith("pyspark.sql.connect"):  # an in-process session's frame
        return rows.observe(observation, *exprs)
    try:
        from pyspark.sql.connect import plan as connect_plan
        from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame
        from pyspark.sql.connect.observation import Observation as ConnectObservation
    except ImportError:  # pyspark without Spark Connect's client
        return rows.observe(observation, *exprs)
    if not (isinstance(rows, ConnectFrame) and isinstance(observation, ConnectObservation)):
        return rows.observe(observation, *exprs)
    if observation._result is not None:  # the check `observe` makes: an observation is used once
        return rows.observe(observation, *exprs)  # raises REUSE_OBSERVATION
    observation._result = {}
    observed = ConnectFrame(connect_plan.CollectMetrics(rows._plan, observation, list(exprs)), rows._session)
    observed._cached_schema = rows._cached_schema
    return observed


def observation_name(step: str, path: str) -> str:
    """The name of a write's observed metrics: the step and a digest of the table's path.

    Stable per table, not per call: the name is in the plan, and a plan that differs every
    batch is generated and compiled again every batch. Unique per table: Spark hands an
    observation the metrics of the first finished query carrying its name in the session, and
    a pipeline's sources (and pipelines sharing an engine) write at the same time.
    """
    return f"{step}_{hashlib.sha1(path.encode()).hexdigest()[:12]}"


def read_at(spark: Any, path: str, version: int) -> Any:
    """The table as of `version`."""
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def read_between(
    spark: Any, path: str, version: int, time_col: str, date_col: str, lo: datetime, hi: datetime | None
) -> Any:
    """`read_at(...).where(between(time_col, date_col, lo, hi))` without Delta's snapshot job (`hi` None: no end).

    Delta's reader plans a filtered scan of a version by rebuilding that version's state in a
    Spark job (every new version: 0.7 s warm, 2.3 s on a new engine, for a small silver table).
    The files are chosen from the log on the driver instead (delta_log.overlapping: the
    partition values and statistics Delta's planner uses) and read by Spark as Parquet, the
    partition column from the files' folders (`basePath`). For tables Riverhouse writes:
    appends and compactions, no deletion vectors or column mapping.
    """
    from pyspark.sql import functions as F

    from riverhouse.platform.state.delta_log import overlapping, table_root

    schema = DeltaLog(path).schema()
    files = overlapping(path, time_col, lo, hi, date_col, version).paths
    if not files:
        return spark.createDataFrame([], schema)
    rows = spark.read.schema(schema).option("basePath", table_root(path)).parquet(*files)
    return rows.select(*[F.col(name) for name in schema.fieldNames()]).where(between(time_col, date_col, lo, hi))


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
    return n_new, n_current, n_new == n_current and _comparable(new).exceptAll(_comparable(current)).isEmpty()


def _comparable(df: Any) -> Any:
    """`df` with every column that holds a map as its JSON text: Spark's set operations refuse maps
    (UNSUPPORTED_FEATURE.SET_OPERATION_ON_MAP_TYPE). Both sides keep their keys in the order the
    record gave them; a different order would only count as a change, and a rebuild rewrites rows
    that are equal."""
    from pyspark.sql import functions as F

    def has_map(kind: Any) -> bool:
        return "map<" in kind.simpleString()

    return df.select(
        *[
            F.to_json(F.col(f"`{f.name}`")).alias(f.name) if has_map(f.dataType) else F.col(f"`{f.name}`")
            for f in df.schema.fields
        ]
    )


def replace_where(df: Any, path: str, predicate: str, metadata: dict[str, str]) -> None:
    """Replace the rows matching `predicate` with `df`: one Delta commit (removes + adds)."""
    (
        df.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", predicate)
        .option("userMetadata", json.dumps(metadata, sort_keys=True))
        .save(path)
    )


def user_metadata(raw: str | None) -> dict[str, Any]:
    """A commit's userMetadata as a dict ({} when absent or not Riverhouse's JSON)."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
