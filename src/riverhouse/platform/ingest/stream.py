"""Kafka -> bronze / quarantine / silver Delta tables, one Spark micro-batch at a time.

Spark's Kafka source reads, the parse and checks are in the streaming plan, and
foreachBatch writes with delta-spark from the batch's DataFrame: the executors do
the work; the driver plans, commits and receives counts and metrics, never rows.

Exactly once: Spark's checkpoint fixes the offsets of every batch id before the
batch runs, and replays the same offsets after a crash. Each Delta table records
`(app_id, batch_id)` as a Delta app transaction in the same commit as the data
(`txnAppId`/`txnVersion`), so a replayed batch skips every table it already reached
and finishes the rest. The silver MERGE is insert-only, so even a replay without
that record would not create a duplicate.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from riverhouse.platform.faults import crash_point
from riverhouse.platform.ingest.dedup import (
    compact_at_files,
    compact_days,
    files_in_days,
    insert_new,
    lookup_days,
)
from riverhouse.platform.ingest.parse import fill_missing_dates, parse_records
from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.kafka.client import check_data_loss, connector_options, librdkafka_config
from riverhouse.platform.runtime import metrics
from riverhouse.platform.spec import PipelineSpec, SourceSpec
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import (
    TableLayout,
    bronze_schema,
    ensure_delta_table,
    quarantine_schema,
    silver_schema,
)


class PipelineError(RuntimeError):
    """A pipeline run failed; the message says what and where, for a person to act on."""


class StreamStopped(RuntimeError):
    """Raised into a batch that starts after a clean stop was requested."""


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
    offsets: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    bronze_version: int | None = None
    silver_version: int | None = None
    started_at: float = 0.0  # time.monotonic() when the batch began
    seconds: float = 0.0
    # Where the batch's time went: the counts (Kafka read + parse, into the cache), each Delta write.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # Files the batch's silver compaction removed and added (see dedup.compact_days).
    compacted: dict[str, int] | None = None


@dataclass
class IngestResult:
    pipeline: str
    source: str
    batches: list[BatchMetrics]
    seconds: float
    silver_version: int | None
    end_offsets: dict[str, dict[str, int]]

    def total(self, name: str) -> int:
        return sum(getattr(b, name) for b in self.batches)

    @property
    def read(self) -> int:
        return self.total("read")

    def stage_seconds(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for batch in self.batches:
            for stage, seconds in batch.stage_seconds.items():
                totals[stage] = round(totals.get(stage, 0.0) + seconds, 3)
        return totals

    def summary(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "source": self.source,
            "batches": len(self.batches),
            "read": self.read,
            "quarantined": self.total("quarantined"),
            "duplicates_dropped": self.total("duplicates_dropped"),
            "inserted": self.total("inserted"),
            "replayed": self.total("replayed"),
            "silver_version": self.silver_version,
            "stage_seconds": self.stage_seconds(),
            "end_offsets": self.end_offsets,
            "seconds": round(self.seconds, 3),
        }


def resolve_bootstrap(spec: PipelineSpec, settings: Settings) -> str:
    """Bootstrap servers: the settings override, the spec's, or the running local Kafka."""
    bootstrap = settings.kafka_bootstrap or spec.kafka.bootstrap_servers
    if bootstrap != "local":
        return bootstrap
    state = local_kafka.status(settings.kafka_state_dir)
    if state is None:
        raise PipelineError(
            f"pipeline {spec.name!r} reads the local Kafka, which is not running "
            f"(state dir {settings.kafka_state_dir}). Start it with `riverhouse kafka start`, "
            "or set kafka.bootstrap_servers in the spec / RIVERHOUSE_KAFKA_BOOTSTRAP."
        )
    return state.bootstrap


def checkpoint_dir(settings: Settings, pipeline: str, source: str) -> Path:
    return Path(settings.checkpoints) / pipeline / source


def stream_app_id(checkpoint: Path, pipeline: str, source: str) -> str:
    """The Delta app id of this checkpoint's stream.

    Batch ids restart at 0 when a checkpoint is deleted; a fresh id per checkpoint
    keeps a new stream's batches from being mistaken for an old stream's.
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    marker = checkpoint / "riverhouse.json"
    try:
        stream_id = json.loads(marker.read_text())["stream_id"]
    except (OSError, ValueError, KeyError):
        stream_id = uuid.uuid4().hex
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stream_id": stream_id, "pipeline": pipeline, "source": source}))
        tmp.replace(marker)
    return f"riverhouse:{pipeline}:{source}:{stream_id}"


@contextmanager
def pipeline_lock(
    checkpoint: Path,
    pipeline: str,
    wait_s: float = 0.0,
    name: str = "run.lock",
    log: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """One run per pipeline source at a time (a sensor run and a manual run must not overlap).

    `wait_s` > 0 waits that long for the holder to finish (backfills wait for streaming runs).
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    with open(checkpoint / name, "a+") as handle:
        deadline = time.monotonic() + wait_s
        announced = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                if time.monotonic() >= deadline:
                    raise PipelineError(
                        f"another run of pipeline {pipeline!r} is in progress (pid {holder}); wait for it to finish"
                    ) from None
                if log and not announced:
                    log(f"waiting for the run of pipeline {pipeline!r} in pid {holder} to finish")
                    announced = True
                time.sleep(0.5)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _table_version(spark: Any, path: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).select("version").first()[0])


class BatchWriter:
    """The foreachBatch body: one Spark batch -> bronze, quarantine, silver, each exactly once.

    Every write is a delta-spark job on the batch's DataFrame, run by the executors. The
    batch is cached once (several writes read it) and released after; the driver only
    gets one row per Kafka partition (counts, offsets, dates) and the MERGE's metrics.
    """

    def __init__(
        self,
        spec: PipelineSpec,
        source: str,
        layout: TableLayout,
        app_id: str,
        on_batch: Callable[[BatchMetrics], None] | None = None,
    ):
        self.spec = spec
        self.source_name = source
        self.src: SourceSpec = spec.sources[source]
        self.layout = layout
        self.app_id = app_id
        self.on_batch = on_batch
        self.batches: list[BatchMetrics] = []
        self.error: BaseException | None = None
        # Held while a batch is written: a clean stop waits for it, then stops the query.
        self.busy = threading.Lock()
        self.stopping = False
        self.bronze_path = layout.bronze(source)
        self.quarantine_path = layout.quarantine(source)
        self.silver_path = layout.silver(source)
        self.bronze_schema = bronze_schema(self.src)
        self.quarantine_schema = quarantine_schema(self.src)
        self.silver_schema = silver_schema(self.src)

    def ensure_tables(self, spark: Any) -> None:
        ensure_delta_table(spark, self.bronze_path, self.bronze_schema, ["_event_date"])
        ensure_delta_table(spark, self.quarantine_path, self.quarantine_schema, ["_event_date"])
        ensure_delta_table(spark, self.silver_path, self.silver_schema, ["_event_date"], cdf=True)

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        if self.stopping:
            # Failing (not returning) keeps Spark from committing a batch nobody wrote;
            # the next run replays it from the offsets already in the checkpoint.
            raise StreamStopped(f"batch {batch_id} not started: the stream is stopping")
        try:
            with self.busy:
                self._process(batch_df, int(batch_id))
        except BaseException as exc:
            self.error = exc
            raise

    def _append_once(self, rows: Any, path: str, columns: list[str], batch_id: int) -> None:
        """Append; Delta skips it when the table already has this app's batch (txnAppId/txnVersion)."""
        (
            rows.select(*columns)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", self.app_id)
            .option("txnVersion", batch_id)
            .option(
                "userMetadata", json.dumps({"riverhouse.pipeline": self.spec.name, "riverhouse.batch_id": batch_id})
            )
            .save(path)
        )

    def _process(self, batch_df: Any, batch_id: int) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        started = time.monotonic()
        metrics = BatchMetrics(batch_id=batch_id, source=self.source_name, started_at=started)
        # The batch is already parsed: the parse is part of the streaming query's plan
        # (SourceStream.start), so it is analysed and compiled once, not per batch.
        rows = fill_missing_dates(batch_df, datetime.datetime.now(datetime.UTC).date())
        rows = rows.withColumn("_batch_id", F.lit(batch_id).cast("long"))
        # Read by the counts and by every write: computed (Kafka read + parse) once.
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self._write(rows, batch_id, metrics)
        finally:
            rows.unpersist()
        metrics.seconds = time.monotonic() - started
        self.batches.append(metrics)
        if self.on_batch:
            self.on_batch(metrics)

    def _write(self, rows: Any, batch_id: int, metrics: BatchMetrics) -> None:
        from pyspark.sql import functions as F

        spark = rows.sparkSession  # the query's own session: its Delta settings are its own
        stage = metrics.stage_seconds
        mark = time.monotonic()
        ok = F.col("_status") == "ok"
        per_partition = (
            rows.groupBy("_topic", "_partition")
            .agg(
                F.count(F.lit(1)).alias("read"),
                F.sum(F.when(ok, 1).otherwise(0)).alias("valid"),
                F.min("_offset").alias("first"),
                F.max("_offset").alias("last"),
                F.min(F.when(ok, F.col("_event_date"))).alias("min_date"),
                F.max(F.when(ok, F.col("_event_date"))).alias("max_date"),
            )
            .collect()
        )
        stage["read_parse"] = time.monotonic() - mark
        metrics.read = sum(r["read"] for r in per_partition)
        metrics.valid = sum(r["valid"] for r in per_partition)
        metrics.quarantined = metrics.read - metrics.valid
        for r in per_partition:
            metrics.offsets.setdefault(r["_topic"], {})[str(r["_partition"])] = [r["first"], r["last"]]
        if not metrics.read:
            return
        mark = time.monotonic()
        self._append_once(rows, self.bronze_path, self.bronze_schema.names, batch_id)
        metrics.bronze_version = _table_version(spark, self.bronze_path)
        crash_point("after_bronze_commit")
        if metrics.quarantined:
            rejected = rows.filter(F.col("_status") == "rejected")
            self._append_once(rejected, self.quarantine_path, self.quarantine_schema.names, batch_id)
        stage["bronze_write"] = time.monotonic() - mark
        mark = time.monotonic()
        dates = [d for r in per_partition for d in (r["min_date"], r["max_date"]) if d is not None]
        valid = rows.filter(F.col("_status") == "ok").select(*self.silver_schema.names)
        self._write_silver(spark, valid, batch_id, metrics, (min(dates), max(dates)) if dates else None)
        stage["silver_merge"] = time.monotonic() - mark
        crash_point("after_silver_commit")

    def _write_silver(
        self,
        spark: Any,
        valid: Any,
        batch_id: int,
        metrics: BatchMetrics,
        dates: tuple[datetime.date, datetime.date] | None,
    ) -> None:
        if dates is None:
            return
        dedup = self.src.dedup
        if dedup is None:
            before = _table_version(spark, self.silver_path)
            self._append_once(valid, self.silver_path, self.silver_schema.names, batch_id)
            metrics.silver_version = _table_version(spark, self.silver_path)
            if metrics.silver_version == before:
                metrics.replayed = metrics.valid
            else:
                metrics.inserted = metrics.valid
            return
        days = lookup_days(dates[0], dates[1], dedup.window)
        outcome = insert_new(
            spark, self.silver_path, valid, self.src.dedup_key, dedup.window, days, self.app_id, batch_id
        )
        metrics.silver_version = _table_version(spark, self.silver_path)
        if outcome.replayed:
            metrics.replayed = metrics.valid
            return
        metrics.inserted = outcome.inserted
        metrics.duplicates_dropped = metrics.valid - outcome.inserted
        threshold = compact_at_files()
        if files_in_days(spark, self.silver_path, days) >= threshold:
            # After the batch's own commit: a crash here leaves only unreferenced files.
            mark = time.monotonic()
            metrics.compacted = compact_days(spark, self.silver_path, days)
            metrics.stage_seconds["silver_compact"] = time.monotonic() - mark
            crash_point("after_silver_compaction")


_QUERY_START = threading.Lock()


@dataclass
class SourceStream:
    """Everything one source's streaming query needs: writer, options, checkpoint."""

    spec: PipelineSpec
    source: str
    writer: BatchWriter
    options: dict[str, str]
    checkpoint: Path
    layout: TableLayout
    bootstrap: str = ""

    def start(self, spark: Any, trigger: dict[str, Any]) -> Any:
        kafka_spec = self.spec.kafka
        # Name what Kafka lost since the checkpoint before Spark's connector trips over it.
        check_data_loss(
            librdkafka_config(kafka_spec, self.bootstrap),
            [self.spec.sources[self.source].topic],
            self.checkpoint / "spark",
            kafka_spec.fail_on_data_loss,
        )
        self.writer.ensure_tables(spark)
        kafka = spark.readStream.format("kafka").options(**self.options).load()
        parsed = parse_records(kafka, self.spec.sources[self.source])
        # The plan above may be built beside another source's (start_queries); the first
        # foreachBatch of a process starts py4j's callback server, once, so one at a time here.
        with _QUERY_START:
            return (
                parsed.writeStream.foreachBatch(self.writer)
                .option("checkpointLocation", str(self.checkpoint / "spark"))
                .queryName(f"riverhouse_{self.spec.name}_{self.source}")
                .trigger(**trigger)
                .start()
            )

    def stop(self, query: Any) -> None:
        """Clean stop: let the batch in flight finish, start no new one, stop the query."""
        self.writer.stopping = True
        with self.writer.busy:
            pass
        query.stop()

    def failure(self, exc: BaseException) -> PipelineError:
        cause = self.writer.error or exc
        topic = self.spec.sources[self.source].topic
        message = _root_message(cause)
        if _KAFKA_UNREACHABLE.search(str(cause)) and "cannot reach Kafka" not in message:
            # The connector's timeouts name a Java exception; the user needs to know it was Kafka.
            message = f"cannot reach Kafka at {self.bootstrap} (Spark's Kafka connector: {message})"
        error = PipelineError(
            f"pipeline {self.spec.name!r}, source {self.source!r} (topic {topic!r}) failed: {message}"
        )
        error.__cause__ = cause
        return error


def prepare_stream(
    spec: PipelineSpec, settings: Settings, source: str, on_batch: Callable[[BatchMetrics], None] | None = None
) -> SourceStream:
    src = spec.sources[source]
    bootstrap = resolve_bootstrap(spec, settings)
    layout = TableLayout(settings.warehouse, spec.name)
    ckpt = checkpoint_dir(settings, spec.name, source)
    app_id = stream_app_id(ckpt, spec.name, source)
    writer = BatchWriter(spec, source, layout, app_id, metrics.observed(spec.name, on_batch))
    options = connector_options(spec.kafka, bootstrap, [src.topic])
    return SourceStream(spec, source, writer, options, ckpt, layout, bootstrap)


def ingest(
    spark: Any,
    spec: PipelineSpec,
    settings: Settings,
    source: str | None = None,
    on_batch: Callable[[BatchMetrics], None] | None = None,
    lock_wait_s: float = 0.0,
    log: Callable[[str], None] | None = None,
) -> IngestResult:
    """Run one triggered (availableNow) streaming query: everything in Kafka now, in bounded batches.

    `lock_wait_s`: how long to wait for another run of the same source (orchestrated runs queue).
    """
    return ingest_sources(spark, spec, settings, [source or spec.sink_source_name], on_batch, lock_wait_s, log)[0]


def ingest_sources(
    spark: Any,
    spec: PipelineSpec,
    settings: Settings,
    sources: list[str],
    on_batch: Callable[[BatchMetrics], None] | None = None,
    lock_wait_s: float = 0.0,
    log: Callable[[str], None] | None = None,
) -> list[IngestResult]:
    """One triggered query per source, all running at once; returns their results in `sources`' order.

    A join's sources are independent streams (each with its own checkpoint, tables and
    Delta app id), so they are read side by side, as continuous mode does: the smaller
    stream's query start and batches overlap the larger one's. If one query fails, the
    others stop cleanly (their batch in flight finishes) and the failure is raised.
    """
    streams = [prepare_stream(spec, settings, source, on_batch) for source in sources]
    with ExitStack() as locks:
        for stream in streams:
            locks.enter_context(pipeline_lock(stream.checkpoint, spec.name, wait_s=lock_wait_s, log=log))
        started = time.monotonic()
        try:
            queries = start_queries(spark, streams, {"availableNow": True})
            try:
                _await_all(streams, queries)
            except BaseException:
                _stop_all(list(zip(streams, queries, strict=True)))
                raise
            return [
                stream_result(spark, stream, query, started) for stream, query in zip(streams, queries, strict=True)
            ]
        finally:
            metrics.push(spec, settings)  # a triggered run is too short to scrape (metrics.py)


def start_queries(spark: Any, streams: list[SourceStream], trigger: dict[str, Any]) -> list[Any]:
    """Start every stream's query, side by side; returns them in `streams`' order.

    Building a query's plan takes ~2,000 py4j calls (~0.4 s), and a query's first steps
    (its source's planning process, the first offsets) are mostly waiting, so a join's
    second source no longer waits for the first one's start. If a query cannot start,
    the ones that did are stopped and the failure names its source.
    """
    if len(streams) == 1:
        return [_start_or_explain(spark, streams[0], trigger)]
    from pyspark import inheritable_thread_target

    start = inheritable_thread_target(spark)(lambda stream: _start_or_explain(spark, stream, trigger))
    with ThreadPoolExecutor(max_workers=len(streams), thread_name_prefix="riverhouse-start") as pool:
        futures = [pool.submit(start, stream) for stream in streams]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        _stop_all([(s, f.result()) for s, f in zip(streams, futures, strict=True) if f.exception() is None])
        raise errors[0]
    return [f.result() for f in futures]


def _start_or_explain(spark: Any, stream: SourceStream, trigger: dict[str, Any]) -> Any:
    try:
        return stream.start(spark, trigger)
    except Exception as exc:
        raise stream.failure(exc) from exc


def _stop_all(running: list[tuple[SourceStream, Any]]) -> None:
    for stream, query in running:
        try:
            if query.isActive:
                stream.stop(query)
        except Exception:  # stopping is best effort: the first failure is the one to report
            pass


def _await_all(streams: list[SourceStream], queries: list[Any], poll_s: float = 0.05) -> None:
    """Wait for every query to end; the first failure is raised (as a PipelineError) at once."""
    pending = list(zip(streams, queries, strict=True))
    while pending:
        for stream, query in list(pending):
            try:
                done = query.awaitTermination() if len(pending) == 1 else query.awaitTermination(poll_s)
            except Exception as exc:
                raise stream.failure(exc) from exc
            if done is None or done:
                pending.remove((stream, query))


@contextmanager
def sink_lock(settings: Settings, pipeline: str, log: Callable[[str], None] | None = None) -> Iterator[None]:
    """Serializes ClickHouse loads and partition replacements of one pipeline."""
    with pipeline_lock(Path(settings.checkpoints) / pipeline, pipeline, wait_s=600, name="sink.lock", log=log):
        yield


def stream_result(spark: Any, stream: SourceStream, query: Any, started: float) -> IngestResult:
    end_offsets: dict[str, dict[str, int]] = {}
    progress = query.lastProgress
    if progress and progress.get("sources"):
        raw = progress["sources"][0].get("endOffset")
        end_offsets = json.loads(raw) if isinstance(raw, str) else (raw or {})
    writer = stream.writer
    silver_version = _table_version(spark, writer.silver_path)
    return IngestResult(
        stream.spec.name, stream.source, writer.batches, time.monotonic() - started, silver_version, end_offsets
    )


# What Spark's Kafka connector raises when the broker cannot be reached or stops answering.
_KAFKA_UNREACHABLE = re.compile(
    r"TimeoutException|Timed out waiting|Cannot fetch record|DisconnectException|AuthenticationException"
)
_PYTHON_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?P<name>[A-Za-z_]\w*(?:Error|Exception)): (?P<message>.+)$")


def _root_message(exc: BaseException) -> str:
    text = str(exc).strip()
    if "Traceback (most recent call last)" in text:
        # A Python error inside Spark (our Kafka source in Spark's planner process): its own
        # last "SomeError: message" line says what happened; the trace is for developers.
        found = [m for line in text.splitlines() if (m := _PYTHON_ERROR_LINE.match(line.strip()))]
        if found:
            return found[-1].group("message").strip()[:1000]
    # Spark wraps Python errors in long JVM traces; the user needs the first real line.
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "at ", "JVM stacktrace")):
            return line[:500]
    return type(exc).__name__
