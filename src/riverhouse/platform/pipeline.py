"""Kafka -> bronze / quarantine / silver Delta tables, one Spark micro-batch at a time.

Exactly once: Spark's checkpoint fixes the offsets of every batch id before the
batch runs, and replays the same offsets after a crash. Each Delta table records
`(app_id, batch_id)` as a Delta app transaction in the same commit as the data,
so a replayed batch skips every table it already reached and finishes the rest.
The silver write is insert-if-absent, so even a replay without that record would
not create a duplicate.
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

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from riverhouse.platform import local_kafka, metrics
from riverhouse.platform.arrow_validate import clear_spool, rules_for, spool_folder, take_spooled
from riverhouse.platform.dedup import (
    compact_at_files,
    compact_lookup_days,
    dedup_in_batch,
    insert_if_absent,
)
from riverhouse.platform.faults import crash_point
from riverhouse.platform.kafka_source import FORMAT_NAME, source_options
from riverhouse.platform.parse import fill_missing_dates, parse_records
from riverhouse.platform.settings import Settings
from riverhouse.platform.spark import local_fast_path
from riverhouse.platform.spec import PipelineSpec, SourceSpec
from riverhouse.platform.tables import (
    TableLayout,
    bronze_schema,
    commit_properties,
    committed,
    ensure_table,
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
    # Where the batch's time went: Kafka read + JVM parse + transfer to the driver, and each Delta write.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # Files the batch's silver compaction removed and added (see dedup.compact_lookup_days).
    compacted: dict[str, int] | None = None
    # Records local mode's fast path validated in the source (they skipped the JVM's parse).
    fast_path: int = 0


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


def _offset_ranges(rows: pa.Table) -> dict[str, dict[str, list[int]]]:
    if rows.num_rows == 0:
        return {}
    grouped = rows.group_by(["_topic", "_partition"]).aggregate([("_offset", "min"), ("_offset", "max")])
    out: dict[str, dict[str, list[int]]] = {}
    for row in grouped.to_pylist():
        out.setdefault(row["_topic"], {})[str(row["_partition"])] = [row["_offset_min"], row["_offset_max"]]
    return out


class BatchWriter:
    """The foreachBatch body: one Spark batch -> bronze, quarantine, silver, each exactly once."""

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

    def ensure_tables(self) -> None:
        ensure_table(self.bronze_path, self.bronze_schema, ["_event_date"])
        ensure_table(self.quarantine_path, self.quarantine_schema, ["_event_date"])
        ensure_table(self.silver_path, self.silver_schema, ["_event_date"], cdf=True)

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

    def _append_once(self, path: str, rows: pa.Table, schema: pa.Schema, batch_id: int) -> int | None:
        table = ensure_table(path, schema, ["_event_date"])
        if committed(table, self.app_id, batch_id):
            return None
        write_deltalake(
            table,
            rows.select(schema.names).cast(schema),
            mode="append",
            commit_properties=commit_properties(self.app_id, batch_id, {"riverhouse.pipeline": self.spec.name}),
        )
        return table.version()

    def _process(self, batch_df: Any, batch_id: int) -> None:
        started = time.monotonic()
        metrics = BatchMetrics(batch_id=batch_id, source=self.source_name, started_at=started)
        # The batch is already parsed: the parse is part of the streaming query's plan
        # (SourceStream.start), so it is analysed and compiled once, not per batch.
        rows, spooled = take_spooled(batch_df.toArrow())
        metrics.fast_path = spooled.rows
        rows = fill_missing_dates(rows, datetime.datetime.now(datetime.UTC).date())
        stage = metrics.stage_seconds
        stage["read_parse_collect"] = time.monotonic() - started
        batch_col = pa.array([batch_id] * rows.num_rows, pa.int64())
        rows = rows.append_column("_batch_id", batch_col)
        metrics.read = rows.num_rows
        metrics.offsets = _offset_ranges(rows)
        if rows.num_rows:
            # Bronze (+ quarantine) and silver are separate tables, each committed once per
            # batch id, so they are written side by side (delta-rs and Arrow release the GIL).
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="riverhouse-bronze") as pool:
                raw_written = pool.submit(self._write_bronze, rows, batch_id, metrics)
                valid = rows.filter(pc.equal(rows.column("_status"), "ok")).select(self.silver_schema.names)
                valid = valid.cast(self.silver_schema)
                metrics.valid = valid.num_rows
                mark = time.monotonic()
                self._write_silver(valid, batch_id, metrics)
                stage["silver_dedup"] = time.monotonic() - mark
                raw_written.result()
            crash_point("after_silver_commit")
        for path in spooled.paths:
            os.unlink(path)  # after every table committed: a re-run reads Kafka again anyway
        metrics.seconds = time.monotonic() - started
        self.batches.append(metrics)
        if self.on_batch:
            self.on_batch(metrics)

    def _write_bronze(self, rows: pa.Table, batch_id: int, metrics: BatchMetrics) -> None:
        mark = time.monotonic()
        metrics.bronze_version = self._append_once(self.bronze_path, rows, self.bronze_schema, batch_id)
        crash_point("after_bronze_commit")
        rejected = rows.filter(pc.equal(rows.column("_status"), "rejected"))
        metrics.quarantined = rejected.num_rows
        if rejected.num_rows:
            self._append_once(self.quarantine_path, rejected, self.quarantine_schema, batch_id)
        metrics.stage_seconds["bronze_write"] = time.monotonic() - mark

    def _write_silver(self, valid: pa.Table, batch_id: int, metrics: BatchMetrics) -> None:
        silver = ensure_table(self.silver_path, self.silver_schema, ["_event_date"], cdf=True)
        if committed(silver, self.app_id, batch_id):
            metrics.replayed = valid.num_rows
            return
        dedup = self.src.dedup
        if dedup is None:
            if valid.num_rows:
                write_deltalake(
                    silver, valid, mode="append", commit_properties=commit_properties(self.app_id, batch_id)
                )
            metrics.inserted = valid.num_rows
            metrics.silver_version = silver.version()
            return
        unique = dedup_in_batch(valid, self.src.dedup_key, dedup.window)
        outcome = insert_if_absent(silver, unique, self.src.dedup_key, dedup.window, self.app_id, batch_id)
        metrics.inserted = outcome.inserted
        metrics.duplicates_dropped = valid.num_rows - outcome.inserted
        metrics.silver_version = silver.version()
        if outcome.files_scanned >= compact_at_files():
            # After the batch's own commit: a crash here leaves only unreferenced files.
            mark = time.monotonic()
            metrics.compacted = compact_lookup_days(silver, unique, dedup.window)
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

    def start(self, spark: Any, trigger: dict[str, Any]) -> Any:
        options = {**self.options, **self.fast_path_options(spark)}
        kafka = spark.readStream.format(FORMAT_NAME).options(**options).load()
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

    def fast_path_options(self, spark: Any) -> dict[str, str]:
        """Local mode: valid records are finished in the source and skip the JVM (arrow_validate.py).

        Only where the source's workers share the driver's disk (a local master), the session
        time zone is UTC (the fast path's dates are UTC dates, as Spark's are then) and the
        Arrow parse is on. RIVERHOUSE_FAST_PATH=0 turns it off.
        """
        if "parse.fields" not in self.options or not local_fast_path(spark):
            return {}
        rules = rules_for(self.spec.sources[self.source])
        if rules is None or spark.conf.get("spark.sql.session.timeZone") != "UTC":
            return {}
        folder = spool_folder(self.checkpoint.resolve())
        clear_spool(folder)  # under the pipeline lock: leftovers of a run that stopped mid-batch
        return {"spool.dir": str(folder), "validate.rules": rules.encode()}

    def stop(self, query: Any) -> None:
        """Clean stop: let the batch in flight finish, start no new one, stop the query."""
        self.writer.stopping = True
        with self.writer.busy:
            pass
        query.stop()

    def failure(self, exc: BaseException) -> PipelineError:
        cause = self.writer.error or exc
        topic = self.spec.sources[self.source].topic
        error = PipelineError(
            f"pipeline {self.spec.name!r}, source {self.source!r} (topic {topic!r}) failed: {_root_message(cause)}"
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
    writer.ensure_tables()
    options = source_options(
        bootstrap,
        [src.topic],
        spec.kafka.config,
        spec.kafka.starting_offsets,
        spec.kafka.max_offsets_per_trigger,
        parse_fields=[(f.name, f.type) for f in src.fields],
        max_message_bytes=src.max_message_bytes,
        fail_on_data_loss=spec.kafka.fail_on_data_loss,
    )
    return SourceStream(spec, source, writer, options, ckpt, layout)


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
            return [stream_result(stream, query, started) for stream, query in zip(streams, queries, strict=True)]
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


def stream_result(stream: SourceStream, query: Any, started: float) -> IngestResult:
    end_offsets: dict[str, dict[str, int]] = {}
    progress = query.lastProgress
    if progress and progress.get("sources"):
        raw = progress["sources"][0].get("endOffset")
        end_offsets = json.loads(raw) if isinstance(raw, str) else (raw or {})
    writer = stream.writer
    silver = ensure_table(stream.layout.silver(stream.source), writer.silver_schema, ["_event_date"], cdf=True)
    return IngestResult(
        stream.spec.name, stream.source, writer.batches, time.monotonic() - started, silver.version(), end_offsets
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
