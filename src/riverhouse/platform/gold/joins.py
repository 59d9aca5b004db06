"""Gold: temporal joins and SQL pipelines over silver, in Spark, each driving event emitted exactly once.

When is a result final? A driving (left) event at time t is *closed* once the
event-time watermark passes t + the longest stream window. The watermark is the
smallest "latest event time" among the stream sources (dimensions excluded): a
stalled stream holds results back instead of emitting them without their matches.
Closed events are joined with, per lookup, the latest row with equal keys whose
event time is within the window of t (dimensions: the latest row, no window),
then projected and filtered by the query (`evaluate.py`). The result does not
depend on arrival order, so replays after a crash give the same rows.

`drain=True` closes every pending window now (for bounded replays, demos and
backfills): Flink's "stop with drain".

Where the work runs: Spark reads the driving candidates from silver's change data
feed (plus the still-open events since the last watermark), the lookups from silver
pruned to the candidates' days (dimensions whole, latest row per key), joins, and
writes gold with delta-spark. Every read is pinned to the table versions taken at the
start of the run. The driver plans, and receives versions, a few aggregates (counts,
the watermark, date bounds) and commit metrics: never rows.

Exactly once: gold rows are keyed by the driving event's Kafka coordinates. Under the
gold lock (one writer) events gold already holds are left out (an anti-join on those
coordinates, pruned to the events' days), and the rest go in by one append whose commit
also records the progress (the driving silver version read, the watermark, the run number)
and Riverhouse's mark (app id, run number: state/delta_spark.append_once), so a retried
commit of the same run is skipped and a crash anywhere re-runs to the same gold table.
Quarantined results are appended first, minus those the quarantine already holds, so a
crash between the two commits replays them without doubling them.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from riverhouse.platform.faults import crash_point
from riverhouse.platform.gold.evaluate import IDENTITY, drop_views, gold_schema, latest_per_key
from riverhouse.platform.gold.poison import evaluate_rows
from riverhouse.platform.ingest.dedup import first_rows
from riverhouse.platform.runtime.threads import in_background
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import gold_lock
from riverhouse.platform.state.delta_log import MARK_MAX_EVENT_TIME, DeltaLog
from riverhouse.platform.state.delta_spark import (
    append_once,
    inserts_between,
    read_at,
    read_between,
    spark_time,
    table_version,
    utc,
)
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import (
    GOLD_PROPERTIES,
    KAFKA_IDENTITY,
    TableLayout,
    ensure_delta_table,
    silver_properties,
    silver_schema,
    spark_schema,
)

__all__ = ["IDENTITY", "GoldResult", "gold_lock", "gold_path", "gold_quarantine_path", "gold_schema", "run_gold"]

STATE_VERSION = "riverhouse.left_version"
STATE_WATERMARK = "riverhouse.watermark"
STATE_RUN = "riverhouse.gold_run"
STATUSES = ("emitted", "unmatched", "filtered", "rejected")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class GoldResult:
    processed: int = 0
    emitted: int = 0
    matched: int = 0
    unmatched_left: int = 0  # emitted by a LEFT JOIN without a match
    unmatched_inner: int = 0  # dropped by an inner JOIN without a match
    filtered: int = 0  # WHERE was false
    rejected: int = 0  # a `require`d field still missing, or the query fails on its values: quarantined
    late_matches: int = 0  # the matched right row reached Kafka after the left one
    pending: int = 0  # driving events whose window has not closed yet
    watermark: str | None = None
    gold_version: int | None = None
    seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.matched / self.processed if self.processed else 0.0

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": round(self.hit_rate, 4), "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class GoldState:
    """The stream's progress, recorded in gold's commits: what the next run starts from."""

    left_version: int = -1
    watermark: datetime | None = None
    run: int = 0

    def metadata(self) -> dict[str, str]:
        meta = {STATE_VERSION: str(self.left_version), STATE_RUN: str(self.run)}
        if self.watermark is not None:
            meta[STATE_WATERMARK] = self.watermark.astimezone(UTC).isoformat()
        return meta


def gold_path(layout: TableLayout, spec: PipelineSpec) -> str:
    return layout.path("gold", spec.output_name)


def gold_quarantine_path(layout: TableLayout, spec: PipelineSpec) -> str:
    return layout.path("gold_quarantine", spec.output_name)


def gold_app_id(spec: PipelineSpec) -> str:
    return f"riverhouse:{spec.name}:gold:{spec.output_name}"


def read_state(path: str) -> GoldState:
    """The progress of the newest gold commit that records one (stream runs and rebuilds both do)."""
    meta = DeltaLog(path).latest_mark(STATE_VERSION)
    if meta is None:
        return GoldState()
    wm = meta.get(STATE_WATERMARK)
    return GoldState(int(meta[STATE_VERSION]), datetime.fromisoformat(wm) if wm else None, int(meta.get(STATE_RUN, 0)))


def ensure_gold_tables(spark: Any, spec: PipelineSpec, layout: TableLayout, silver: bool = True) -> Any:
    """Create gold (change data feed on: the loader reads it), its quarantine and (`silver`) the silver
    tables it reads."""
    schema = gold_schema(spark, spec)
    ensure_delta_table(spark, gold_path(layout, spec), schema, ["_left_event_date"], GOLD_PROPERTIES)
    ensure_delta_table(spark, gold_quarantine_path(layout, spec), schema, ["_left_event_date"], GOLD_PROPERTIES)
    for name, src in spec.sources.items() if silver else ():
        ensure_delta_table(spark, layout.silver(name), silver_schema(src), ["_event_date"], silver_properties(src))
    return spark_schema(schema)


def prepare_gold_tables(spark: Any, spec: PipelineSpec, settings: Settings) -> Future[Any] | None:
    """A join pipeline's gold tables, made on a thread of their own while its sources are ingested.

    Their schema is the spec's query analysed by Spark, and a new table is a Spark job and a
    Delta commit: a new pipeline's join waited 0.6-1.2 s for them after its sources' batches
    (bench/analysis.md). The caller waits for the future before the join, which finds them made.
    Silver's tables are the ingest's to make. None for a pipeline without a join.
    """
    if not spec.is_join:
        return None
    from pyspark import inheritable_thread_target

    layout = TableLayout(settings.warehouse, spec.name)
    make = inheritable_thread_target(spark)(ensure_gold_tables)
    return in_background("riverhouse-gold-tables", make, spark, spec, layout, silver=False)


def max_event_time(spark: Any, path: str, version: int) -> datetime | None:
    """Latest event time in a silver snapshot.

    Each ingest commit records the newest event time silver holds (delta_log.MARK_MAX_EVENT_TIME), so
    the log answers without a Spark job; a table without such marks (written by a backfill
    only) is asked with one aggregate.
    """
    meta = DeltaLog(path).latest_mark(MARK_MAX_EVENT_TIME, newest=version)
    if meta is not None:
        return EPOCH + timedelta(microseconds=int(meta[MARK_MAX_EVENT_TIME]))
    return spark_time(read_at(spark, path, version).agg(F.max("_event_time").alias("t")).first()["t"])


def lookup_frames(
    spark: Any, spec: PipelineSpec, layout: TableLayout, versions: dict[str, int], lo: datetime, hi: datetime
) -> dict[str, DataFrame]:
    """Per lookup alias, the silver rows that can match driving events with times in [lo, hi].

    Windowed lookups are pruned to the days (and times) within their window of [lo, hi];
    dimensions are read whole and reduced to the latest row per join key.
    """
    lookups: dict[str, DataFrame] = {}
    for step in spec.plan.steps:
        path, version = layout.silver(step.source), versions[step.source]
        if step.window is None:
            lookups[step.alias] = latest_per_key(read_at(spark, path, version), step)
        else:
            start, end = lo - step.window, hi + step.window
            lookups[step.alias] = read_between(spark, path, version, "_event_time", "_event_date", start, end)
    return lookups


def dedupe_identity(rows: DataFrame) -> DataFrame:
    """Rows that a silver backfill inserted again (its change feed holds them twice) appear once.

    The copies are the same silver row, so which one is kept does not matter (ordered by the
    identity itself). A window's first row, not `dropDuplicates`, which Spark plans as a sort
    aggregate (a sort on each side of the shuffle): 3.1 -> 2.2 CPU s on 210,000 rows
    (bench/analysis.md)."""
    return first_rows(rows, KAFKA_IDENTITY, KAFKA_IDENTITY)


def may_insert_twice(path: str, start: int, end: int) -> bool:
    """Whether versions start..end of silver may insert one row twice, read from the log.

    The stream only appends, so each row is inserted once; a backfill (`replaceWhere`) removes a
    window's rows and inserts them again, with data changed. Compaction's removes change no data,
    and its adds are not in the change feed. Commits missing from the log count as such.
    """
    commits = list(DeltaLog(path).commits_back(end, start))
    if len(commits) != end - start + 1:
        return True
    return any(remove.get("dataChange", True) for commit in commits for remove in commit.removes)


def not_processed(
    closed: DataFrame, gold: DataFrame, first_day: date, identity: list[str] = KAFKA_IDENTITY
) -> DataFrame:
    """The rows of `closed` (driving events, by `identity` columns) that `gold` does not hold yet.

    Gold is read from `first_day` (the earliest closed event's date) on: partitions before
    it cannot hold these events.
    """
    done = gold.where(F.col("_left_event_date") >= F.lit(first_day)).select(
        *[F.col(g).alias(k) for g, k in zip(IDENTITY, identity, strict=True)]
    )
    return closed.join(done, identity, "left_anti")


def held_since(spark: Any, path: str, version: int, first_day: date) -> DataFrame:
    """A gold table's rows (or its quarantine's) from `first_day` on, at `version`: read from the files
    the log chooses, without Delta's state job (delta_spark.read_between)."""
    start = datetime.combine(first_day, datetime.min.time(), UTC)
    return read_between(spark, path, version, "_left_event_time", "_left_event_date", start, None)


def run_gold(spark: Any, spec: PipelineSpec, settings: Settings, drain: bool = False) -> GoldResult:
    """Emit every closed, not yet emitted driving event of a join pipeline into gold."""
    with gold_lock(settings, spec.name):
        return _run_gold(spark, spec, settings, drain)


def _candidates(
    spark: Any, spec: PipelineSpec, layout: TableLayout, state: GoldState, current: int, since: datetime | None
) -> DataFrame | None:
    """Driving events to consider: the still-open ones (from `since` on), plus the others inserted since
    the last run.

    When the stream only appended to silver since the last run, its rows from `since` on hold
    every new row from then on, so the change feed gives only the new rows before `since`: the
    parts are disjoint without a shuffle to find rows read twice (bench/analysis.md). After a
    backfill, which may insert rows twice, the whole change feed is read and deduplicated.
    """
    plan = spec.plan
    path = layout.silver(plan.driving_source)
    columns = silver_schema(spec.sources[plan.driving_source]).names
    appended = state.left_version >= current or not may_insert_twice(path, state.left_version + 1, current)
    parts = []
    if since is not None:
        parts.append(read_between(spark, path, current, "_event_time", "_event_date", since, None))
    if state.left_version < current:
        new = inserts_between(spark, path, state.left_version + 1, current, columns)
        if appended and since is not None:
            new = new.where(F.col("_event_time") < F.lit(utc(since)))
        parts.append(new)
    if not parts:
        return None
    rows = parts[0].select(*columns)
    for part in parts[1:]:
        rows = rows.unionByName(part.select(*columns))
    return rows if appended else dedupe_identity(rows)


def _run_gold(spark: Any, spec: PipelineSpec, settings: Settings, drain: bool) -> GoldResult:
    started = time.monotonic()
    plan = spec.plan
    layout = TableLayout(settings.warehouse, spec.name)
    target = ensure_gold_tables(spark, spec, layout)
    path = gold_path(layout, spec)
    close_after = plan.close_after
    result = GoldResult()

    state = read_state(path)
    gold_version = table_version(path)
    versions = {name: table_version(layout.silver(name)) for name in spec.sources}
    current = versions[plan.driving_source]
    latest = [max_event_time(spark, layout.silver(s), versions[s]) for s in plan.stream_sources]
    stream_watermark = None if any(t is None for t in latest) else min(t for t in latest if t is not None)
    result.watermark = stream_watermark.isoformat() if stream_watermark else None

    since = state.watermark - close_after if state.watermark is not None else None
    candidates = _candidates(spark, spec, layout, state, current, since)
    if drain:
        is_closed = F.lit(True)
    elif stream_watermark is None:
        is_closed = F.lit(False)
    else:
        is_closed = F.col("_event_time") <= F.lit(stream_watermark - close_after)
    if candidates is not None:
        # Cached by the counts' job and read again by the join: silver's new files are read, and
        # their identity's duplicates dropped (a shuffle), once per run (bench/analysis.md).
        candidates = candidates.withColumn("_closed", is_closed).persist()
    try:
        counts = _counts(candidates, result)
        # What the next run must look at again: events not closed yet.
        if drain:
            max_t = spark_time(counts["max_t"]) if counts is not None else None
            next_watermark = max(
                filter(None, [state.watermark, (max_t + close_after) if max_t else None, stream_watermark]),
                default=None,
            )
        else:
            next_watermark = max(filter(None, [state.watermark, stream_watermark]), default=None)
        result.gold_version = gold_version
        if candidates is not None and counts is not None and counts["closed"]:
            progress = GoldState(current, next_watermark, state.run + 1)
            _emit(spark, spec, layout, versions, target, candidates, counts, progress, result)
    finally:
        if candidates is not None:
            candidates.unpersist()
    result.seconds = time.monotonic() - started
    return result


def _counts(candidates: DataFrame | None, result: GoldResult) -> Any:
    """The candidates' counts and the closed ones' time bounds (one aggregate), or None without candidates."""
    if candidates is None:
        return None
    closed_time = F.when(F.col("_closed"), F.col("_event_time"))
    counts = candidates.agg(
        F.count(F.lit(1)).alias("candidates"),
        F.count(closed_time).alias("closed"),
        F.min(F.when(F.col("_closed"), F.col("_event_date"))).alias("first_day"),
        F.min(closed_time).alias("lo"),
        F.max(closed_time).alias("hi"),
        F.max("_event_time").alias("max_t"),
    ).first()
    result.pending = int(counts["candidates"]) - int(counts["closed"])
    return counts


def _emit(
    spark: Any,
    spec: PipelineSpec,
    layout: TableLayout,
    versions: dict[str, int],
    target: Any,
    candidates: DataFrame,
    counts: Any,
    progress: GoldState,
    result: GoldResult,
) -> None:
    """Join the closed candidates gold does not hold yet; append the rejected to gold's quarantine, then
    the rows to gold under the run's mark (`progress`)."""
    path, gold_version = gold_path(layout, spec), result.gold_version
    closed = candidates.where("_closed").drop("_closed")
    fresh = closed
    if _holds_rows(path, gold_version):  # a new gold table: no Spark job reads its empty snapshot
        fresh = not_processed(closed, held_since(spark, path, gold_version, counts["first_day"]), counts["first_day"])
    lo, hi = spark_time(counts["lo"]), spark_time(counts["hi"])
    assert lo is not None and hi is not None  # some events are closed, so both bounds exist
    lookups = lookup_frames(spark, spec, layout, versions, lo, hi)
    views: list[str] = []
    rows = None
    try:
        # Read by the counts and both appends: joined once (events the query fails on, rejected).
        rows, tally = evaluate_rows(spark, spec, spec.plan, fresh, lookups, views, target, lambda r: _tally(r, result))
        if not result.processed:
            return
        if result.rejected:
            # Insert-if-absent: a crash after this commit and before gold's replays these rows.
            quarantine = gold_quarantine_path(layout, spec)
            held = held_since(spark, quarantine, table_version(quarantine), tally["first_day"])
            rejected = not_processed(rows.where("_status = 'rejected'"), held, tally["first_day"], IDENTITY)
            append_once(rejected, quarantine, gold_app_id(spec), _quarantine_batch(quarantine, spec, progress.run))
        crash_point("after_gold_quarantine")
        outcome = append_once(rows, path, gold_app_id(spec), progress.run, metadata=progress.metadata())
        if outcome.replayed:
            # Gold holds this run number already, yet its commits' progress said otherwise: writing
            # on would skip these rows silently.
            raise RuntimeError(
                f"gold table {path} already records run {progress.run} of {gold_app_id(spec)} but not its "
                f"progress metadata ({STATE_VERSION}); reset the pipeline (`riverhouse reset {spec.name}`)"
            )
        crash_point("after_gold_commit")
    finally:
        if rows is not None:
            rows.unpersist()
        drop_views(spark, views)
    result.gold_version = table_version(path)


def _holds_rows(path: str, version: int) -> bool:
    """Whether the table may hold rows at `version`: false only for its creation commit without files."""
    if version > 0:
        return True
    return bool(DeltaLog(path).commit(version).adds)


def _quarantine_batch(path: str, spec: PipelineSpec, run: int) -> int:
    """The mark of a quarantine append: the run number, or past the newest one the table holds.

    A re-run after a crash between the two commits has the same run number, but may have more
    rows to quarantine (silver moved on): its rows were anti-joined above, so it must append
    them rather than find the crashed run's mark and skip.
    """
    log = DeltaLog(path)
    held = log.find_batch(gold_app_id(spec), 0)
    if held is None:
        return run
    newest = log.commit(held).batch_of(gold_app_id(spec)) or 0
    return max(run, newest + 1)


def _tally(rows: DataFrame, result: GoldResult) -> Any:
    """Count the joined rows by outcome into `result` (one aggregate); returns it (with the date bounds)."""
    status = F.col("_status")

    def count_of(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0))

    tally = rows.agg(
        F.count(F.lit(1)).alias("processed"),
        *[count_of(status == name).alias(name) for name in STATUSES],
        count_of(F.col("_matched")).alias("matched"),
        count_of((status == "emitted") & ~F.col("_matched")).alias("unmatched_left"),
        count_of(F.col("_late_match")).alias("late_matches"),
        F.min("_left_event_date").alias("first_day"),
        F.max("_left_event_date").alias("last_day"),
    ).first()
    result.processed = int(tally["processed"])
    if not result.processed:
        return tally
    result.emitted = int(tally["emitted"])
    result.unmatched_inner = int(tally["unmatched"])
    result.filtered = int(tally["filtered"])
    result.rejected = int(tally["rejected"])
    result.matched = int(tally["matched"])
    result.unmatched_left = int(tally["unmatched_left"])
    result.late_matches = int(tally["late_matches"])
    return tally
