"""The foreachBatch body: one micro-batch of a source -> bronze, quarantine, silver, each exactly once.

Every write is a delta-spark append of the batch's DataFrame, run by the executors; the driver
receives observed metrics (counts, the batch's event-time bounds), never rows.

Where it runs: in the run's own process with a local Spark session, or in a Python process
beside the Spark Connect server (Spark starts one per query and pickles this object into it).
So it holds nothing that cannot travel (no callbacks, no locks), imports little, and tells
the run what it did through the checkpoint folder (state/checkpoints.BatchChannel).

Exactly once: Spark's checkpoint fixes the offsets of every batch id before the batch runs,
and replays the same offsets after a crash. Each table's commit carries this stream's app id
and the batch id (state/delta_spark.append_once), so a replayed batch skips every table it
already reached and finishes the rest. Silver's rows are the batch's valid rows minus the
duplicates of rows silver already holds: a deterministic function of the batch and of silver
before it, so a replay that reaches silver again writes the same rows.
"""

from __future__ import annotations

import datetime
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

from riverhouse.platform.errors import StreamStopped
from riverhouse.platform.faults import FaultPlan
from riverhouse.platform.ingest.dedup import insert_new, time_bounds
from riverhouse.platform.ingest.parse import event_date_or
from riverhouse.platform.kafka.client import batch_records
from riverhouse.platform.runtime.threads import in_background
from riverhouse.platform.spec import PipelineSpec, SourceSpec
from riverhouse.platform.state.checkpoints import BatchChannel
from riverhouse.platform.state.delta_log import MARK_MAX_EVENT_TIME, DeltaLog
from riverhouse.platform.state.delta_spark import append_once
from riverhouse.platform.state.tables import (
    TableLayout,
    bronze_schema,
    key_range_column,
    quarantine_schema,
    silver_schema,
)

# Offsets per slot from which a batch runs in twice as many tasks as the engine has slots (`_tasks`).
LARGE_BATCH_RECORDS_PER_SLOT = 50_000


@dataclass
class BatchMetrics:
    batch_id: int
    source: str = ""
    read: int = 0
    quarantined: int = 0
    valid: int = 0
    inserted: int = 0
    duplicates_dropped: int = 0
    # Records of a batch that a crashed run had already committed to silver: Spark
    # replays the batch, every table skips it, and they are counted here instead.
    replayed: int = 0
    bronze_version: int | None = None
    silver_version: int | None = None
    started_at: float = 0.0  # time.time() when the batch began
    seconds: float = 0.0
    # Where the batch's time went: bronze (Kafka read + parse + write), quarantine, silver (dedup + write).
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> BatchMetrics:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in report.items() if k in known})


class BatchWriter:
    """Called by Spark for each micro-batch (foreachBatch): writes the tables, reports the figures."""

    def __init__(
        self,
        spec: PipelineSpec,
        source: str,
        layout: TableLayout,
        app_id: str,
        channel: BatchChannel,
        faults: FaultPlan,
    ):
        self.spec = spec
        self.source_name = source
        self.src: SourceSpec = spec.sources[source]
        self.app_id = app_id
        self.channel = channel  # names the run this body belongs to
        self.faults = faults
        self.bronze_path = layout.bronze(source)
        self.quarantine_path = layout.quarantine(source)
        self.silver_path = layout.silver(source)
        self.bronze_columns = bronze_schema(self.src).names
        self.quarantine_columns = quarantine_schema(self.src).names
        self.silver_columns = silver_schema(self.src).names
        # The batch's range of this key column narrows silver's lookup (state/tables.key_range_column).
        self.key_column = key_range_column(self.src)
        # An Avro source's registry client (credentials resolved here, in the run): the body
        # decodes each batch with the writer schemas it fetches (ingest/avro.py).
        registry = self.src.schema_registry
        self.registry = registry.client() if registry is not None else None
        self.slots: int | None = None  # tasks the engine runs at once: found at the first batch

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        self.channel.begin(int(batch_id))
        try:
            if not self.channel.may_write():
                # A clean stop, or a newer run took over (this query outlived its client on the
                # engine). Failing (not returning) keeps Spark from committing a batch nobody
                # wrote; the next run replays it from the offsets already in the checkpoint.
                raise StreamStopped(f"batch {batch_id} not started: the stream is stopping")
            metrics = self._process(batch_df, int(batch_id))
        finally:
            self.channel.end()
        self.channel.report(metrics.batch_id, asdict(metrics))

    def _process(self, batch_df: Any, batch_id: int) -> BatchMetrics:
        from pyspark import StorageLevel

        started = time.monotonic()
        metrics = BatchMetrics(batch_id=batch_id, source=self.source_name, started_at=time.time())
        # A JSON batch is already parsed: the parse is part of the streaming query's plan, so it
        # is analysed and compiled once per query. What changes per batch stays out of the generated
        # code (the batch id: `batch_id_column`) or is a literal that changes once a day (the date given to
        # records with no time at all), so the generated code stays the same from batch to batch.
        if self.registry is not None:
            # Avro through a registry: decoded here, with the writer schemas the registry has now
            # (a version registered mid-stream is read from the next batch on).
            from riverhouse.platform.ingest.avro import WriterSchemas
            from riverhouse.platform.ingest.parse import parse_records

            batch_df = parse_records(batch_df, self.src, WriterSchemas.fetch(self.src, self.registry))
        # No more tasks than the engine runs at once: a task per Kafka partition paid each task's
        # fixed cost (its plan, consumer, Parquet file) once per partition, and a small batch was
        # mostly that. Merging partitions is narrow (no shuffle), so the read, the parse and
        # the cache still happen in one pass.
        if self.slots is None:
            self.slots = task_slots(batch_df.sparkSession)
        batch_df = batch_df.coalesce(self._tasks(batch_id))
        # The batch id is computed before the cache: once per row, not once per write reading it.
        today = datetime.datetime.now(datetime.UTC).date()
        columns = [c for c in [*self.bronze_columns, *self._silver_only()] if c != "_batch_id"]
        rows = batch_df.select(
            *[event_date_or(today) if c == "_event_date" else c for c in columns],
            batch_id_column(batch_id).alias("_batch_id"),
        )
        # Read by every write: Kafka read + parse happen once, in the first write.
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self._write(rows, batch_id, metrics)
        finally:
            rows.unpersist()
        metrics.seconds = time.monotonic() - started
        return metrics

    def _tasks(self, batch_id: int) -> int:
        """The batch's tasks: the engine's slots, or twice as many for a large batch (its offsets,
        from the checkpoint Spark wrote before the batch). With one task per slot, a core idled
        whenever its task waited (a fetch, a pause, the other processes): a 220,000-record batch
        on 2 cores ran 9% faster in 4 tasks (bench/analysis.md). A small batch pays each task's
        fixed cost, so it keeps one per slot."""
        assert self.slots is not None
        records = batch_records(self.channel.root / "spark", batch_id)
        if records is not None and records >= LARGE_BATCH_RECORDS_PER_SLOT * self.slots:
            return 2 * self.slots
        return self.slots

    def _silver_only(self) -> list[str]:
        return [c for c in self.silver_columns if c not in self.bronze_columns]

    def _write(self, rows: Any, batch_id: int, metrics: BatchMetrics) -> None:
        from pyspark.sql import functions as F

        stage = metrics.stage_seconds
        ok = F.col("_status") == "ok"
        valid_time = F.unix_micros(F.when(ok, F.col("_event_time")))
        mark = time.monotonic()
        observed = [self.key_column] if self.key_column is not None else []  # the key range reads it
        bronze = append_once(
            rows.select(*self.bronze_columns, *observed),
            self.bronze_path,
            self.app_id,
            batch_id,
            hint=self.channel,
            table="bronze",
            observe=self._observed(ok, valid_time),
            columns=self.bronze_columns,
        )
        figures = self._figures(rows, ok, valid_time) if bronze.replayed else {"read": bronze.rows, **bronze.observed}
        metrics.read = int(figures["read"] or 0)
        metrics.valid = int(figures["valid"] or 0)
        metrics.quarantined = metrics.read - metrics.valid
        metrics.bronze_version = bronze.version
        stage["bronze"] = time.monotonic() - mark
        self.faults.hit("after_bronze_commit")
        if not metrics.read:
            return
        quarantine = None
        if metrics.quarantined:  # planned only then: each DataFrame step is analysed at once in-process
            # Rejected records are few: one task and one file per day, not one per Kafka partition.
            rejected = rows.where(F.col("_status") == "rejected").select(*self.quarantine_columns).coalesce(1)
            quarantine = self._quarantine(rejected, batch_id, stage)
            if self.src.format == "avro":
                # Not beside silver's work: Spark 4.2's `from_avro` evaluates its options map when a
                # plan holding it is canonicalized, with a map builder its copies share, and two
                # requests canonicalizing copies of the batch's plan at once corrupted it
                # ("requirement failed" in ArrayBasedMapData; bench/analysis.md).
                quarantine.result()
        try:
            if metrics.valid:
                mark = time.monotonic()
                self._write_silver(rows.where(ok).select(*self.silver_columns), batch_id, metrics, figures)
                stage["silver"] = time.monotonic() - mark
        finally:
            if quarantine is not None:
                quarantine.result()
        self.faults.hit("after_silver_commit")

    def _quarantine(self, rejected: Any, batch_id: int, stage: dict[str, float]) -> Future[Any]:
        """Append the rejected records on a thread of its own: the commit overlaps silver's work."""

        def append() -> None:
            mark = time.monotonic()
            append_once(rejected, self.quarantine_path, self.app_id, batch_id, hint=self.channel, table="quarantine")
            stage["quarantine"] = time.monotonic() - mark

        return in_background("riverhouse-quarantine", append)

    def _observed(self, ok: Any, valid_time: Any) -> list[Any]:
        """What bronze's append observes of the batch: its valid rows, their event-time bounds and key range."""
        from pyspark.sql import functions as F

        figures = [
            F.sum(F.when(ok, 1).otherwise(0)).alias("valid"),
            F.min(valid_time).alias("lo"),
            F.max(valid_time).alias("hi"),
        ]
        if self.key_column is not None:
            key = F.when(ok, F.col(self.key_column))
            figures += [F.min(key).alias("key_lo"), F.max(key).alias("key_hi")]
        return figures

    def _figures(self, rows: Any, ok: Any, valid_time: Any) -> dict[str, Any]:
        """The batch's figures when bronze already had it (a replay): one aggregate over the cache."""
        from pyspark.sql import functions as F

        row = rows.agg(F.count(F.lit(1)).alias("read"), *self._observed(ok, valid_time)).first()
        return row.asDict()

    def _write_silver(self, valid: Any, batch_id: int, metrics: BatchMetrics, figures: dict[str, Any]) -> None:
        dedup = self.src.dedup
        max_micros = max(int(figures["hi"]), self._silver_max_micros())
        mark = {MARK_MAX_EVENT_TIME: max_micros}
        hint = _SilverHint(self.channel, max_micros)
        if dedup is None:
            silver = append_once(valid, self.silver_path, self.app_id, batch_id, mark, hint, "silver")
        else:
            bounds = time_bounds(int(figures["lo"]), int(figures["hi"]), dedup.window)
            key = self.src.dedup_key
            key_range = None
            if self.key_column is not None and figures.get("key_lo") is not None:
                key_range = (self.key_column, figures["key_lo"], figures["key_hi"])
            silver = insert_new(
                self.silver_path,
                valid,
                key,
                dedup.window,
                bounds,
                self.app_id,
                batch_id,
                mark,
                hint,
                key_range,
                columns=self.silver_columns,  # known: no round trip to the engine for them
                valid_rows=metrics.valid,
            )
        metrics.silver_version = silver.version
        if silver.replayed:
            metrics.replayed = metrics.valid
            return
        metrics.inserted = int(silver.rows or 0)
        metrics.duplicates_dropped = metrics.valid - metrics.inserted

    def _silver_max_micros(self) -> int:
        """The newest event time silver holds so far (its last commit's mark), or 0."""
        previous = self.channel.table_progress("silver") or {}
        if previous.get("max_event_micros") is not None:
            return int(previous["max_event_micros"])
        mark = DeltaLog(self.silver_path).latest_mark(MARK_MAX_EVENT_TIME)
        return int(mark[MARK_MAX_EVENT_TIME]) if mark else 0


def task_slots(spark: Any) -> int:
    """How many tasks the session's Spark runs at once (its default parallelism: the cores of
    local mode, the executors' cores of a cluster).

    An in-process session knows it; a Spark Connect client does not, so it is read from how
    Spark splits a range by default, in one small job (once per query: the body keeps it).
    """
    from pyspark.sql import functions as F

    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        parts = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("part"))
        row = parts.agg(F.max("part").alias("last")).first()
        return max(1, int(row["last"]) + 1)


def batch_id_column(batch_id: int) -> Any:
    """`_batch_id` for every row of the batch, a value Spark's generated code does not hold.

    Spark writes a literal's value into the code it generates, so `lit(batch_id)` made it generate
    and compile the batch's write stages anew every batch (13 compilations per batch instead of 6,
    about half the JVM's CPU going to the JIT, bench/analysis.md). `reflect` (Java's `Long.valueOf`
    of the id's text) has no generated code of its own: Spark hands the expression, its literals
    included, to the generated class as an object and evaluates it there, and the optimizer never
    folds it into a literal (Spark counts it non-deterministic). So the code stays the same from
    batch to batch, with no Spark job: the one-row frame joined before it cost a broadcast, which
    is a one-task job per batch, and a copy of every row (bench/analysis.md). Fixed class and
    method names, never a spec's text: a spec's own SQL may not call `reflect` (`sql.JAVA_CALLS`).
    """
    from pyspark.sql import functions as F

    return F.reflect(F.lit("java.lang.Long"), F.lit("valueOf"), F.lit(str(int(batch_id)))).cast("long")


class _SilverHint:
    """The silver progress hint, which also keeps the newest event time silver holds."""

    def __init__(self, channel: BatchChannel, max_micros: int):
        self.channel = channel
        self.max_micros = max_micros

    def table_progress(self, table: str) -> dict[str, Any] | None:
        return self.channel.table_progress(table)

    def record_table(self, table: str, app_id: str, batch_id: int, version: int) -> None:
        from riverhouse.platform.state.checkpoints import write_json

        write_json(
            self.channel.tables / f"{table}.json",
            {"app_id": app_id, "batch_id": batch_id, "version": version, "max_event_micros": self.max_micros},
        )
