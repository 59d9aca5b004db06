"""What an orchestrator shows of a pipeline step: its metadata, the rows it published, its checks.

Each step takes the window it publishes: `None` for a stream run (what the stream wrote),
or a `Window` for a backfill (recomputed from bronze). Metadata values are plain (numbers,
strings; dicts and lists are JSON), never a secret: the Kafka config is redacted and the
ClickHouse DSN is never part of it. Engine code: no Dagster imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa

from riverhouse.platform.gold.joins import GoldResult, gold_path
from riverhouse.platform.ingest.stream import IngestResult
from riverhouse.platform.quality.checks import duplicate_keys_within_window, reconcile_per_day
from riverhouse.platform.quality.expectations import validate_rejected_rate, validate_silver
from riverhouse.platform.sink.replace import ReplaceResult
from riverhouse.platform.sink.topic import ProduceResult
from riverhouse.platform.sink.topic_check import topic_matches_delta as check_topic
from riverhouse.platform.sink.versions import LoadResult
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.spec_sinks import transactional_id
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.delta_spark import window_predicate
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, row_count, silver_schema, spark_schema
from riverhouse.platform.state.windows import RebuildResult, Window


@dataclass(frozen=True)
class Written:
    """What a step wrote to a Delta table, for its checks to read on Spark: the data files a stream
    run's commits added (only those rows), or a rebuild's window (the window's rows as they now are)."""

    path: str
    files: tuple[str, ...] = ()
    window: Window | None = None

    def frame(self, spark: Any, schema: pa.Schema, columns: list[str]) -> Any:
        """`columns` of the written rows as a Spark DataFrame (`schema`: the table's, in Arrow)."""
        if self.window is not None:
            start, end = self.window.start, self.window.end
            rows = spark.read.format("delta").load(self.path)
            return rows.where(window_predicate("_event_time", "_event_date", start, end)).select(*columns)
        wanted = spark_schema(pa.schema([schema.field(c) for c in columns]))
        if not self.files:
            return spark.createDataFrame([], wanted)
        # The files hold the data columns; partition columns live in their folder names.
        return spark.read.schema(wanted).parquet(*self.files).select(*columns)


@dataclass
class Published:
    """One step's outcome as an orchestrator shows it."""

    mode: str  # stream (what the stream wrote) or rebuild (a window recomputed from bronze)
    metadata: dict[str, Any]
    # What this step wrote (silver: what its expectations validate, on Spark).
    written: Written | None = field(default=None, repr=False)
    # Metadata of tables written alongside (the ingest step's quarantine).
    related: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The step's own result, for its checks (a Kafka sink's pass: where it began).
    result: Any = field(default=None, repr=False)
    # Stream runs: [earliest, latest] event time of each file written, so the orchestrator can
    # name every time partition the run changed (not only the one it was launched for).
    touched: list[tuple[datetime, datetime]] = field(default_factory=list, repr=False)


# Dagster's conventions for tables (TableMetadataSet): rows after the step, and rows of the
# rebuilt window.
ROW_COUNT = "dagster/row_count"
PARTITION_ROW_COUNT = "dagster/partition_row_count"


def _written(path: str, versions: list[int], time_column: str, date_column: str) -> list[tuple[datetime, datetime]]:
    """Event-time ranges of the files `versions` of the Delta table at `path` added."""
    log = DeltaLog(path)
    return [span for v in versions for span in log.event_times_in(log.commit(v), time_column, date_column)]


def _window_span(window: Window) -> list[tuple[datetime, datetime]]:
    """A rebuild wrote its half-open window [start, end)."""
    return [(window.start, window.end - timedelta(microseconds=1))]


def _published_table(spec: PipelineSpec, settings: Settings) -> tuple[str, str, str]:
    """The Delta table the sinks read (gold of a join, else the sink source's silver), its time and date columns."""
    layout = TableLayout(settings.warehouse, spec.name)
    if spec.is_join:
        return gold_path(layout, spec), "_left_event_time", "_left_event_date"
    return layout.silver(spec.sink_source_name), "_event_time", "_event_date"


@dataclass
class CheckOutcome:
    passed: bool
    metadata: dict[str, Any]
    description: str | None = None


def _version(value: int | None) -> int:
    return -1 if value is None else value


def ingest(
    spec: PipelineSpec,
    settings: Settings,
    source: str,
    result: IngestResult,
    lag_before: int,
    silver_before: int | None,
) -> Published:
    """A triggered run of one source into bronze, quarantine and silver (`silver_before`: its version before)."""
    layout = TableLayout(settings.warehouse, spec.name)
    summary = result.summary()
    seconds = max(result.seconds, 1e-6)
    batch_ids = [b.batch_id for b in result.batches]
    return Published(
        mode="stream",
        metadata={
            "records_in": summary["read"],
            "inserted": summary["inserted"],
            "duplicates_dropped": summary["duplicates_dropped"],
            "quarantined": summary["quarantined"],
            "replayed": summary["replayed"],
            "lag_before": lag_before,
            "batches": summary["batches"],
            "records_per_second": round(summary["read"] / seconds, 1),
            "seconds": round(result.seconds, 2),
            "first_batch_id": min(batch_ids) if batch_ids else -1,
            "last_batch_id": max(batch_ids) if batch_ids else -1,
            "silver_version_before": _version(silver_before),
            "silver_version_after": _version(summary["silver_version"]),
            "end_offsets": summary["end_offsets"],
            "path": layout.bronze(source),
            "kafka_config": spec.kafka.redacted_config(),
        },
        related={"quarantine": {"quarantined": summary["quarantined"], "path": layout.quarantine(source)}},
    )


def silver(spec: PipelineSpec, settings: Settings, source: str, ingested: dict[str, Any] | None) -> Published:
    """A stream run's silver: the rows this run's ingest inserted (the files its commits added).

    `ingested`: the metadata of the source's ingest step in this run (`ingest` above), if it ran.
    """
    path = TableLayout(settings.warehouse, spec.name).silver(source)
    ingested = ingested or {}
    before = int(ingested.get("silver_version_before", -1))
    after = int(ingested.get("silver_version_after", -1))
    log = DeltaLog(path)
    commits = [log.commit(v) for v in range(before + 1, after + 1)]  # each commit read once
    files = tuple(f.path for c in commits for f in log.added_files(c))
    return Published(
        "stream",
        {
            "path": path,
            "mode": "stream",
            "inserted": int(ingested.get("inserted", 0)),
            "duplicates_dropped": int(ingested.get("duplicates_dropped", 0)),
            "delta_version": after,
            ROW_COUNT: row_count(path),
        },
        Written(path, files=files),
        touched=[span for c in commits for span in log.event_times_in(c, "_event_time", "_event_date")],
    )


def silver_rebuilt(
    spec: PipelineSpec, settings: Settings, source: str, window: Window, rebuilt: RebuildResult
) -> Published:
    """A backfill's silver: `window` recomputed from bronze."""
    path = TableLayout(settings.warehouse, spec.name).silver(source)
    metadata = {"path": path, **_rebuild_metadata(rebuilt), ROW_COUNT: row_count(path)}
    return Published("rebuild", metadata, Written(path, window=window), touched=_window_span(window))


def _rebuild_metadata(rebuilt: RebuildResult) -> dict[str, Any]:
    return {
        "mode": "rebuild",
        "window": rebuilt.window,
        "rows": rebuilt.rows,
        "rows_before": rebuilt.rows_before,
        PARTITION_ROW_COUNT: rebuilt.rows,
        "changed": rebuilt.changed,
        "delta_version": _version(rebuilt.delta_version),
    }


def gold(
    spec: PipelineSpec,
    settings: Settings,
    window: Window | None,
    result: GoldResult | RebuildResult,
    before: int | None,
) -> Published:
    """A join's gold step: what a stream run joined (`before`: gold's version before it), or `window` rebuilt."""
    path = gold_path(TableLayout(settings.warehouse, spec.name), spec)
    if window is not None:
        assert isinstance(result, RebuildResult)
        metadata = {**_rebuild_metadata(result), "path": path, ROW_COUNT: row_count(path)}
        return Published("rebuild", metadata, touched=_window_span(window))
    summary = result.summary()
    after = _version(summary["gold_version"])
    metadata = {
        "mode": "stream",
        "processed": summary["processed"],
        "emitted": summary["emitted"],
        "join_hit_rate": summary["hit_rate"],
        "unmatched_left": summary["unmatched_left"],
        "unmatched_inner": summary["unmatched_inner"],
        "late_matches": summary["late_matches"],
        "quarantined": summary["rejected"],
        "filtered": summary["filtered"],
        "pending": summary["pending"],
        "watermark": summary["watermark"] or "",
        "delta_version": after,
        ROW_COUNT: row_count(path),
        "path": path,
    }
    first = _version(before) + 1
    written = _written(path, list(range(first, after + 1)), "_left_event_time", "_left_event_date")
    return Published("stream", metadata, touched=written)


def clickhouse(
    spec: PipelineSpec, settings: Settings, window: Window | None, result: LoadResult | ReplaceResult, rows: int
) -> Published:
    """A stream run's load of new Delta versions, or a backfill's swap of `window`'s days; `rows`: the table's after."""
    summary = result.summary()
    if window is None:
        assert isinstance(result, LoadResult)
        path, time_column, date_column = _published_table(spec, settings)
        return Published(
            "stream",
            {
                "mode": "stream",
                "rows_loaded": summary["rows_loaded"],
                "delta_versions_loaded": summary["versions_loaded"],
                "chunks": summary["chunks"],
                "seconds": summary["seconds"],
                "delta_version": _version(summary["delta_version"]),
                "last_loaded_version": _version(summary["last_loaded_version"]),
                ROW_COUNT: rows,
            },
            touched=_written(path, list(result.versions_loaded), time_column, date_column),
        )
    return Published(
        "rebuild",
        {
            "mode": "rebuild",
            "days": ", ".join(summary["days"]),
            "rows_replaced": summary["rows"],
            PARTITION_ROW_COUNT: summary["rows"],
            ROW_COUNT: rows,
            "rows_caught_up": summary["caught_up_rows"],
            "seconds": summary["seconds"],
            "delta_version": _version(summary["delta_version"]),
        },
    )


def topic(spec: PipelineSpec, settings: Settings, produced: ProduceResult) -> Published:
    """A Kafka sink's pass: every Delta version not in the topic yet (a backfill's included), exactly once."""
    sink = next(s for s in spec.topic_sinks if s.topic == produced.topic)
    summary = produced.summary()
    path, time_column, date_column = _published_table(spec, settings)
    return Published(
        "stream",
        {
            "topic": sink.topic,
            "rows_produced": summary["rows_produced"],
            "delta_versions_produced": summary["versions_produced"],
            "transactions": summary["transactions"],
            "seconds": summary["seconds"],
            "delta_version": _version(summary["delta_version"]),
            "last_produced_version": _version(summary["last_version"]),
            "ledger_topic": sink.ledger,
            "transactional_id": transactional_id(spec.name, sink),
        },
        result=produced,
        touched=_written(path, produced.versions_produced, time_column, date_column),
    )


# ------------------------------------------------------------------------ checks
def rejected_rate(spec: PipelineSpec, records: int, rejected: int) -> CheckOutcome:
    outcome = validate_rejected_rate(spec, records, rejected)
    return CheckOutcome(
        outcome.success,
        {
            "records": records,
            "rejected": rejected,
            "rejected_rate": round(rejected / records, 6) if records else 0.0,
            "max_rejected_rate": spec.quality.max_rejected_rate,
            "gx": outcome.metadata(),
        },
        None if outcome.success else outcome.describe_failures(),
    )


def silver_expectations(
    spark: Any, spec: PipelineSpec, settings: Settings, source: str, written: Written | None
) -> CheckOutcome:
    """The source's GX suite on what the step wrote, evaluated by Spark (no rows on the driver)."""
    src = spec.sources[source]
    schema = silver_schema(src)
    columns = [f.name for f in src.fields] + ["_event_time"]
    if written is None:  # nothing was written: the suite over no rows
        written = Written(TableLayout(settings.warehouse, spec.name).silver(source))
    outcome = validate_silver(spec, source, written.frame(spark, schema, columns))
    return CheckOutcome(outcome.success, outcome.metadata(), None if outcome.success else outcome.describe_failures())


def unique_keys(
    spark: Any, spec: PipelineSpec, settings: Settings, source: str, spans: list[tuple[datetime, datetime]]
) -> CheckOutcome:
    """No two silver rows share a dedup key within the window, around what the step wrote (`spans`)."""
    src = spec.sources[source]
    if src.dedup is None:
        return CheckOutcome(True, {"duplicate_rows": 0, "sample": []})
    path = TableLayout(settings.warehouse, spec.name).silver(source)
    count, sample = duplicate_keys_within_window(spark, path, src.dedup_key, src.dedup.window, spans)
    return CheckOutcome(count == 0, {"duplicate_rows": count, "sample": sample, **_checked(spans)})


def one_row_per_left_event(
    spark: Any, spec: PipelineSpec, settings: Settings, spans: list[tuple[datetime, datetime]]
) -> CheckOutcome:
    plan = spec.plan
    driving = spec.sources[plan.driving_source]
    window = driving.dedup.window if driving.dedup else plan.close_after
    path = gold_path(TableLayout(settings.warehouse, spec.name), spec)
    count, sample = duplicate_keys_within_window(
        spark,
        path,
        ["_left_key"],
        window,
        spans,
        time_column="_left_event_time",
        date_column="_left_event_date",
        emitted_only=True,
    )
    return CheckOutcome(count == 0, {"duplicate_rows": count, "sample": sample, **_checked(spans)})


def _checked(spans: list[tuple[datetime, datetime]]) -> dict[str, Any]:
    """What a windowed check looked at: the event times the step wrote (it reads them +- the window)."""
    if not spans:
        return {"checked": "nothing written"}
    return {"checked": f"{min(lo for lo, _ in spans).isoformat()}/{max(hi for _, hi in spans).isoformat()}"}


def topic_matches_delta(spec: PipelineSpec, settings: Settings, produced: ProduceResult) -> CheckOutcome:
    passed, metadata = check_topic(spec, settings, produced)
    described = None
    if not passed:
        described = "; ".join(
            f"version {m['version']}: {m['rows_in_topic']} rows in the topic, {m['rows_in_delta']} in Delta"
            for m in metadata["mismatches"]
        )
    return CheckOutcome(passed, metadata, described)


def clickhouse_matches_delta(spec: PipelineSpec, settings: Settings) -> CheckOutcome:
    outcome, stats = reconcile_per_day(spec, settings)
    return CheckOutcome(
        outcome.success and stats["duplicate_keys"] == 0,
        {**stats, "gx": outcome.metadata()},
        None if outcome.success else outcome.describe_failures(),
    )
