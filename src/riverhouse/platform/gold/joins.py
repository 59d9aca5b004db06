"""Gold: temporal joins and SQL pipelines over silver, each driving event emitted exactly once.

When is a result final? A driving (left) event at time t is *closed* once the
event-time watermark passes t + the longest stream window. The watermark is the
smallest "latest event time" among the stream sources (dimensions excluded): a
stalled stream holds results back instead of emitting them without their matches.
Closed events are joined with, per lookup, the latest row with equal keys whose
event time is within the window of t (dimensions: the latest row, no window),
then projected and filtered by the query. The result does not depend on arrival
order, so replays after a crash give the same rows.

`drain=True` closes every pending window now (for bounded replays, demos and
backfills): Flink's "stop with drain".

Exactly once: gold rows are keyed by the driving event's Kafka coordinates. Under
the gold lock (one writer), events whose key gold already holds are left out, and
the rest are appended in one commit together with the progress (the driving
silver version read and the watermark), so a crash anywhere re-runs to the same
gold table. Quarantined results use MERGE insert-if-absent: they are committed
before gold, so a crash in between replays them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, write_deltalake
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from riverhouse.platform.faults import crash_point
from riverhouse.platform.gold.arrow_join import evaluate_arrow, plain_gold_schema
from riverhouse.platform.ingest.stream import pipeline_lock
from riverhouse.platform.runtime.spark import local_fast_path
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.sql import JoinPlan, flat
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import (
    KAFKA_IDENTITY,
    TableLayout,
    ensure_table,
    open_table,
    plain_strings,
    read_inserts,
    silver_schema,
)

IDENTITY = ["_left_topic", "_left_partition", "_left_offset"]
STATE_VERSION = "riverhouse.left_version"
STATE_WATERMARK = "riverhouse.watermark"
STATUSES = ("emitted", "unmatched", "filtered", "rejected")


@dataclass
class GoldResult:
    processed: int = 0
    emitted: int = 0
    matched: int = 0
    unmatched_left: int = 0  # emitted by a LEFT JOIN without a match
    unmatched_inner: int = 0  # dropped by an inner JOIN without a match
    filtered: int = 0  # WHERE was false
    rejected: int = 0  # a `require`d field still missing: quarantined
    late_matches: int = 0  # the matched right row reached Kafka after the left one
    pending: int = 0  # driving events whose window has not closed yet
    watermark: str | None = None
    gold_version: int | None = None
    engine: str = ""  # what ran the join: numpy (local mode, plain columns) or spark
    seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.matched / self.processed if self.processed else 0.0

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": round(self.hit_rate, 4), "seconds": round(self.seconds, 3)}


def gold_path(layout: TableLayout, spec: PipelineSpec) -> str:
    return layout.path("gold", spec.sink.table)


def gold_quarantine_path(layout: TableLayout, spec: PipelineSpec) -> str:
    return layout.path("gold_quarantine", spec.sink.table)


def _empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def _to_spark(spark: Any, table: pa.Table) -> DataFrame:
    return spark.createDataFrame(plain_strings(table))


def _with_prefix(df: DataFrame, alias: str, columns: list[str]) -> DataFrame:
    return df.select(
        *[F.col(c).alias(flat(alias, c)) for c in columns],
        F.col("_event_time").alias(flat(alias, "_t")),
        F.col("_kafka_timestamp").alias(flat(alias, "_kts")),
        F.col("_partition").alias(flat(alias, "_p")),
        F.col("_offset").alias(flat(alias, "_o")),
    )


def evaluate(
    spark: Any, spec: PipelineSpec, plan: JoinPlan, driving: pa.Table, lookups: dict[str, pa.Table]
) -> DataFrame:
    """The join itself: driving rows (closed, unprocessed) + lookup rows -> gold rows."""
    sources = spec.sources
    base_fields = [f.name for f in sources[plan.driving_source].fields]
    base = _to_spark(spark, driving)
    left_key = sources[plan.driving_source].dedup_key
    base = base.select(
        *[F.col(c).alias(flat(plan.driving_alias, c)) for c in base_fields],
        F.col("_topic").alias("_left_topic"),
        F.col("_partition").alias("_left_partition"),
        F.col("_offset").alias("_left_offset"),
        F.col("_event_time").alias("_left_event_time"),
        F.col("_event_date").alias("_left_event_date"),
        F.col("_kafka_timestamp").alias("_left_kts"),
        F.concat_ws("\u0001", *[F.col(c).cast("string") for c in left_key]).alias("_left_key"),
    )
    matched_flags, inner_flags, late_flags = [], [], []
    for step in plan.steps:
        fields = [f.name for f in sources[step.source].fields]
        right = _with_prefix(_to_spark(spark, lookups[step.alias]), step.alias, fields)
        cond = None
        for key in step.keys:
            term = F.col(flat(key.base_alias, key.base_column)) == F.col(flat(step.alias, key.column))
            cond = term if cond is None else cond & term
        rt = F.col(flat(step.alias, "_t"))
        if step.window is not None:
            seconds = int(step.window.total_seconds())
            lt = F.col("_left_event_time")
            cond = (
                cond
                & (rt >= lt - F.expr(f"INTERVAL {seconds} SECONDS"))
                & (rt <= lt + F.expr(f"INTERVAL {seconds} SECONDS"))
            )
        joined = base.join(right, cond, "left")
        latest_first = Window.partitionBy(*IDENTITY).orderBy(
            rt.desc_nulls_last(),
            F.col(flat(step.alias, "_p")).desc_nulls_last(),
            F.col(flat(step.alias, "_o")).desc_nulls_last(),
        )
        base = joined.withColumn("_rn", F.row_number().over(latest_first)).filter("_rn = 1").drop("_rn")
        flag = rt.isNotNull()
        matched_flags.append(flag)
        if step.kind == "inner":
            inner_flags.append(flag)
        late_flags.append(flag & (F.col(flat(step.alias, "_kts")) > F.col("_left_kts")))
        base = base.drop(flat(step.alias, "_p"), flat(step.alias, "_o"))

    def all_of(flags: list[Any]) -> Any:
        out = F.lit(True)
        for f in flags:
            out = out & f
        return out

    def any_of(flags: list[Any]) -> Any:
        out = F.lit(False)
        for f in flags:
            out = out | f
        return out

    base = base.withColumn("_matched", all_of(matched_flags)).withColumn("_inner_ok", all_of(inner_flags))
    base = base.withColumn("_late_match", any_of(late_flags))
    view = f"rh_gold_{uuid.uuid4().hex[:12]}"
    base.createOrReplaceTempView(view)
    projections = ", ".join(f"{expr} AS `{name}`" for name, expr in plan.projections)
    where = f"COALESCE(({plan.where}), false)" if plan.where else "true"
    meta = ", ".join(
        [
            "_left_topic",
            "_left_partition",
            "_left_offset",
            "_left_event_time",
            "_left_event_date",
            "_left_key",
            "_matched",
            "_inner_ok",
            "_late_match",
        ]
    )
    result = spark.sql(f"SELECT {projections}, {meta}, {where} AS _where_ok FROM `{view}`")
    missing = [
        F.when(F.col(f"`{name}`").isNull(), F.lit(f"required field '{name}' is missing when the join window closed"))
        for name in plan.require
    ]
    reason = F.coalesce(*missing) if missing else F.lit(None).cast("string")
    status = (
        F.when(~F.col("_inner_ok"), "unmatched")
        .when(~F.col("_where_ok"), "filtered")
        .when(reason.isNotNull(), "rejected")
        .otherwise("emitted")
    )
    result = result.withColumn("_reason", F.when(status == "rejected", reason)).withColumn("_status", status)
    return result.drop("_inner_ok", "_where_ok")


def join_rows(
    spark: Any, spec: PipelineSpec, plan: JoinPlan, driving: pa.Table, lookups: dict[str, pa.Table]
) -> tuple[pa.Table, str]:
    """The join's rows as Arrow, and what computed them.

    In local mode a plan of plain columns without WHERE is joined with numpy on the driver,
    which already holds every row (arrow_join.py); everything else, and every plan on a
    cluster, runs in Spark.
    """
    if local_fast_path(spark):
        rows = evaluate_arrow(spec, plan, driving, lookups)
        if rows is not None:
            return rows, "numpy"
    return evaluate(spark, spec, plan, driving, lookups).toArrow(), "spark"


_GOLD_SCHEMAS: dict[str, pa.Schema] = {}


def gold_schema(spark: Any, spec: PipelineSpec) -> pa.Schema:
    """The gold table's schema, once per spec and process.

    A plan of plain columns needs no analysis (arrow_join.plain_gold_schema); any other
    is analysed by Spark (`spark_gold_schema`).
    """
    key = spec.model_dump_json()
    if key not in _GOLD_SCHEMAS:
        _GOLD_SCHEMAS[key] = plain_gold_schema(spec, spec.plan) or spark_gold_schema(spark, spec)
    return _GOLD_SCHEMAS[key]


def spark_gold_schema(spark: Any, spec: PipelineSpec) -> pa.Schema:
    """The query analysed by Spark on empty inputs (no job runs)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    plan = spec.plan
    driving = _empty(silver_schema(spec.sources[plan.driving_source]))
    lookups = {s.alias: _empty(silver_schema(spec.sources[s.source])) for s in plan.steps}
    # The Arrow types `toArrow()` gives these columns (timestamps in UTC).
    schema = to_arrow_schema(evaluate(spark, spec, plan, driving, lookups).schema, timezone="UTC")
    # Gold columns are nullable: a LEFT JOIN leaves lookup columns empty.
    return pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])


def _state(gold: Any) -> tuple[int, datetime | None]:
    for commit in gold.history(50):
        if STATE_VERSION in commit:
            wm = commit.get(STATE_WATERMARK)
            return int(commit[STATE_VERSION]), (datetime.fromisoformat(wm) if wm else None)
    return -1, None


def _max_event_time(path: str) -> datetime | None:
    """Latest event time in a silver table, from the Delta log's per-file statistics.

    Cost follows the number of files, not rows. Delta stores these statistics at
    millisecond precision (rounded down), which only makes the watermark more
    conservative. Files written without statistics fall back to a column scan.
    """
    table = open_table(path)
    if table is None:
        return None
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return None
    column = "max._event_time"
    if column in actions.column_names and actions.column(column).null_count == 0:
        return pc.max(actions.column(column)).as_py()
    scanned = table.to_pyarrow_dataset().to_table(columns=["_event_time"]).column("_event_time")
    return pc.max(scanned).as_py() if len(scanned) else None


def _cdf_inserts(path: str, start: int, end: int, schema: pa.Schema) -> pa.Table:
    return read_inserts(path, start, end, schema.names).select(schema.names).cast(schema)


def _read_range(path: str, schema: pa.Schema, lo: datetime | None, hi: datetime | None) -> pa.Table:
    table = open_table(path)
    if table is None:
        return _empty(schema)
    flt = None
    if lo is not None:
        flt = (pc.field("_event_date") >= pa.scalar(lo.date(), pa.date32())) & (pc.field("_event_time") >= lo)
    if hi is not None:
        upper = (pc.field("_event_date") <= pa.scalar(hi.date(), pa.date32())) & (pc.field("_event_time") <= hi)
        flt = upper if flt is None else flt & upper
    rows = table.to_pyarrow_dataset().to_table(columns=schema.names, filter=flt)
    return plain_strings(rows).cast(schema)


def _numbered_identities(rows: pa.Table) -> pa.Table:
    """`rows`' Kafka identities with each row's position (`_row`), for Arrow's group-by and joins."""
    return plain_strings(rows.select(KAFKA_IDENTITY)).append_column("_row", pa.array(np.arange(rows.num_rows)))


def _keep_rows(rows: pa.Table, kept: pa.ChunkedArray) -> pa.Table:
    """The rows at the positions `kept`, in their original order."""
    return rows if len(kept) == rows.num_rows else rows.take(pa.array(np.sort(kept.to_numpy())))


def _dedupe_identity(rows: pa.Table) -> pa.Table:
    """Rows that came both as new (change feed) and as pending (date range) appear once (the first)."""
    if rows.num_rows == 0:
        return rows
    numbered = _numbered_identities(rows)
    return _keep_rows(
        rows, numbered.group_by(KAFKA_IDENTITY, use_threads=False).aggregate([("_row", "min")]).column("_row_min")
    )


def _not_processed(closed: pa.Table, gold_path_: str) -> pa.Table:
    """The driving events of `closed` that gold does not hold yet (by Kafka identity), in order."""
    table = open_table(gold_path_)
    if table is None or closed.num_rows == 0:
        return closed
    lo_date = pc.min(closed.column("_event_date")).as_py()
    done = table.to_pyarrow_dataset().to_table(
        columns=IDENTITY, filter=pc.field("_left_event_date") >= pa.scalar(lo_date, pa.date32())
    )
    if done.num_rows == 0:
        return closed
    numbered = _numbered_identities(closed)
    done = plain_strings(done).rename_columns(KAFKA_IDENTITY).cast(numbered.select(KAFKA_IDENTITY).schema)
    return _keep_rows(
        closed, numbered.join(done, keys=KAFKA_IDENTITY, join_type="left anti", use_threads=False).column("_row")
    )


def _merge_by_identity(table: Any, rows: pa.Table) -> int:
    lo = pc.min(rows.column("_left_event_date")).as_py()
    hi = pc.max(rows.column("_left_event_date")).as_py()
    predicate = " AND ".join(
        [
            *(f't."{c}" = s."{c}"' for c in IDENTITY),
            f"t.\"_left_event_date\" >= '{lo.isoformat()}'",
            f"t.\"_left_event_date\" <= '{hi.isoformat()}'",
        ]
    )
    metrics = (
        table.merge(source=rows, predicate=predicate, source_alias="s", target_alias="t")
        .when_not_matched_insert(updates={c: f's."{c}"' for c in rows.column_names})
        .execute()
    )
    return int(metrics.get("num_target_rows_inserted", 0))


def lookup_rows(spec: PipelineSpec, layout: TableLayout, lo: datetime, hi: datetime) -> dict[str, pa.Table]:
    """Per lookup alias, the silver rows that can match driving events with times in [lo, hi]."""
    lookups: dict[str, pa.Table] = {}
    for step in spec.plan.steps:
        src_schema = silver_schema(spec.sources[step.source])
        if step.window is None:
            lookups[step.alias] = _read_range(layout.silver(step.source), src_schema, None, None)
        else:
            lookups[step.alias] = _read_range(
                layout.silver(step.source), src_schema, lo - step.window, hi + step.window
            )
    return lookups


@contextmanager
def gold_lock(settings: Settings, pipeline: str, log: Callable[[str], None] | None = None) -> Iterator[None]:
    """One writer of a pipeline's gold table at a time (stream runs and backfills)."""
    with pipeline_lock(Path(settings.checkpoints) / pipeline, pipeline, wait_s=600, name="gold.lock", log=log):
        yield


def run_gold(spark: Any, spec: PipelineSpec, settings: Settings, drain: bool = False) -> GoldResult:
    """Emit every closed, not yet emitted driving event of a join pipeline into gold."""
    with gold_lock(settings, spec.name):
        return _run_gold(spark, spec, settings, drain)


def _run_gold(spark: Any, spec: PipelineSpec, settings: Settings, drain: bool) -> GoldResult:
    started = time.monotonic()
    plan = spec.plan
    layout = TableLayout(settings.warehouse, spec.name)
    schema = gold_schema(spark, spec)
    gold = ensure_table(gold_path(layout, spec), schema, ["_left_event_date"], cdf=True)
    quarantine = ensure_table(gold_quarantine_path(layout, spec), schema, ["_left_event_date"])
    for name, src in spec.sources.items():
        ensure_table(layout.silver(name), silver_schema(src), ["_event_date"], cdf=True)
    driving_path = layout.silver(plan.driving_source)
    driving_schema = silver_schema(spec.sources[plan.driving_source])
    close_after = plan.close_after
    result = GoldResult()

    last_version, last_watermark = _state(gold)
    current = open_table(driving_path).version()
    latest = [_max_event_time(layout.silver(s)) for s in plan.stream_sources]
    stream_watermark = None if any(t is None for t in latest) else min(t for t in latest if t is not None)
    result.watermark = stream_watermark.isoformat() if stream_watermark else None

    parts = []
    if last_version < current:
        parts.append(_cdf_inserts(driving_path, last_version + 1, current, driving_schema))
    if last_watermark is not None:
        parts.append(_read_range(driving_path, driving_schema, last_watermark - close_after, None))
    candidates = _dedupe_identity(pa.concat_tables(parts)) if parts else _empty(driving_schema)
    if drain:
        closed_mask = pa.array([True] * candidates.num_rows, pa.bool_())
    elif stream_watermark is None:
        closed_mask = pa.array([False] * candidates.num_rows, pa.bool_())
    else:
        limit = pa.scalar(stream_watermark - close_after, candidates.schema.field("_event_time").type)
        closed_mask = pc.less_equal(candidates.column("_event_time"), limit)
    closed = candidates.filter(closed_mask)
    result.pending = candidates.num_rows - closed.num_rows
    closed = _not_processed(closed, gold_path(layout, spec))
    # What the next run must look at again: events not closed yet.
    if drain:
        max_t = pc.max(candidates.column("_event_time")).as_py() if candidates.num_rows else None
        next_watermark = max(
            filter(None, [last_watermark, (max_t + close_after) if max_t else None, stream_watermark]), default=None
        )
    else:
        next_watermark = max(filter(None, [last_watermark, stream_watermark]), default=None)
    if closed.num_rows == 0:
        result.seconds = time.monotonic() - started
        result.gold_version = gold.version()
        return result

    lo = pc.min(closed.column("_event_time")).as_py()
    hi = pc.max(closed.column("_event_time")).as_py()
    lookups = lookup_rows(spec, layout, lo, hi)
    rows, result.engine = join_rows(spark, spec, plan, closed, lookups)
    rows = plain_strings(rows).select(schema.names).cast(schema)
    status = rows.column("_status")
    result.processed = rows.num_rows
    for name in STATUSES:
        count = pc.sum(pc.equal(status, name)).as_py() or 0
        if name == "emitted":
            result.emitted = count
        elif name == "unmatched":
            result.unmatched_inner = count
        elif name == "filtered":
            result.filtered = count
        else:
            result.rejected = count
    matched = rows.column("_matched")
    result.matched = pc.sum(pc.cast(matched, pa.int64())).as_py() or 0
    emitted = pc.equal(status, "emitted")
    result.unmatched_left = pc.sum(pc.cast(pc.and_(emitted, pc.invert(matched)), pa.int64())).as_py() or 0
    result.late_matches = pc.sum(pc.cast(rows.column("_late_match"), pa.int64())).as_py() or 0

    rejected = rows.filter(pc.equal(status, "rejected"))
    if rejected.num_rows:
        # Insert-if-absent: a crash after this commit and before gold's replays these rows.
        _merge_by_identity(quarantine, rejected)
    crash_point("after_gold_quarantine")
    metadata = {STATE_VERSION: str(current)}
    if next_watermark is not None:
        metadata[STATE_WATERMARK] = next_watermark.astimezone(UTC).isoformat()
    # A plain append: `closed` already left out every identity gold holds, read under the
    # gold lock (the only writer), and the rows and the progress are one commit. A MERGE
    # would check again, and write every row twice (data and change-data files).
    write_deltalake(gold, rows, mode="append", commit_properties=CommitProperties(custom_metadata=metadata))
    crash_point("after_gold_commit")
    result.gold_version = open_table(gold_path(layout, spec)).version()
    result.seconds = time.monotonic() - started
    return result
