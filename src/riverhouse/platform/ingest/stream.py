"""Kafka -> bronze / quarantine / silver Delta tables: the streaming queries, started and awaited.

Spark's Kafka source reads, the parse and checks are in the streaming plan, and the batch body
(writer.BatchWriter, called by foreachBatch) writes with delta-spark from the batch's DataFrame:
the executors do the work; the driver plans, commits and receives counts, never rows.

This module is the run's side: it starts one query per source, waits for them, and turns what
each batch reported (through the checkpoint folder, wherever the batch body ran) into
`BatchMetrics` for the caller, as the batches land.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from riverhouse.platform.errors import PipelineError
from riverhouse.platform.faults import FaultPlan
from riverhouse.platform.ingest.avro import subject_of
from riverhouse.platform.ingest.parse import parse_records
from riverhouse.platform.ingest.writer import BatchMetrics, BatchWriter
from riverhouse.platform.kafka.bootstrap import resolve_bootstrap
from riverhouse.platform.kafka.client import (
    batch_offsets,
    check_data_loss,
    commit_group_offsets,
    committed_offsets,
    connector_options,
    librdkafka_config,
)
from riverhouse.platform.kafka.lag import pipeline_lag
from riverhouse.platform.runtime import metrics
from riverhouse.platform.runtime.engine import engine_lost
from riverhouse.platform.runtime.spark import REMOTE_ENV, is_connect, own_session, release_session
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import (
    BatchChannel,
    checkpoint_dir,
    pipeline_lock,
    read_published,
    stream_app_id,
    write_published,
)
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import (
    BRONZE_PROPERTIES,
    QUARANTINE_PROPERTIES,
    TableLayout,
    bronze_schema,
    ensure_delta_table,
    quarantine_schema,
    silver_properties,
    silver_schema,
)

# How long a clean stop waits for the batch in flight to finish before stopping the query, and
# how often it checks meanwhile that the query still runs (a failed query's batch never ends).
STOP_WAIT_S = 600.0
STOP_POLL_S = 1.0


@dataclass
class IngestResult:
    pipeline: str
    source: str
    batches: list[BatchMetrics]
    seconds: float
    silver_version: int | None
    end_offsets: dict[str, dict[str, int]]
    # Silver's version before the run's first batch, when that is not the version at the run's
    # start (a resident query's batches may land before the run that reports them).
    silver_version_before: int | None = None

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


def ensure_source_tables(spark: Any, spec: PipelineSpec, layout: TableLayout, source: str) -> None:
    """Bronze, quarantine and silver of one source, created with their properties unless they exist.

    Tables that do not exist yet are created side by side, a thread each: each creation is a
    Spark job and a Delta commit of its own, and a new engine spends seconds on its first
    (bench/analysis.md)."""
    src = spec.sources[source]
    tables = [
        (layout.bronze(source), bronze_schema(src), BRONZE_PROPERTIES),
        (layout.quarantine(source), quarantine_schema(src), QUARANTINE_PROPERTIES),
        (layout.silver(source), silver_schema(src), silver_properties(src)),
    ]

    def ensure(table: tuple[str, Any, dict[str, str]]) -> None:
        path, schema, properties = table
        ensure_delta_table(spark, path, schema, ["_event_date"], properties)

    missing = [t for t in tables if not DeltaLog(t[0]).exists()]
    for table in tables:
        if table not in missing:
            ensure(table)  # it exists: its columns are checked
    with ThreadPoolExecutor(max_workers=max(1, len(missing)), thread_name_prefix="riverhouse-create") as pool:
        for future in [pool.submit(ensure, table) for table in missing]:
            future.result()


_QUERY_START = threading.Lock()


@dataclass
class SourceStream:
    """Everything one source's streaming query needs: writer, options, checkpoint, and its reports."""

    spec: PipelineSpec
    source: str
    writer: BatchWriter
    options: dict[str, str]
    checkpoint: Path
    layout: TableLayout
    bootstrap: str = ""
    on_batch: Callable[[BatchMetrics], None] | None = None
    remote: str | None = None  # the Spark Connect engine the run uses, if any
    log: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.channel = self.writer.channel  # names this run; the body carries a copy
        self.batches: list[BatchMetrics] = []
        self._seen = self.channel.last_reported()
        self._offsets_published: dict[str, dict[str, int]] | None = None
        self._offsets_failed = False
        self._own_session: Any = None  # a session of its own, for a takeover (_take_over_from_older_query)

    def start(self, spark: Any, trigger: dict[str, Any]) -> Any:
        kafka_spec = self.spec.kafka
        # Name what Kafka lost since the checkpoint before Spark's connector trips over it.
        check_data_loss(
            librdkafka_config(kafka_spec, self.bootstrap),
            [self.spec.sources[self.source].topic],
            self.checkpoint / "spark",
            kafka_spec.fail_on_data_loss,
        )
        ensure_source_tables(spark, self.spec, self.layout, self.source)
        if self.writer.registry is not None:  # down at the start: said now (the body gets the cache)
            self.writer.registry.refresh(subject_of(self.spec.sources[self.source]))
        # This run holds the source's lock, but under Spark Connect an older run's query may still
        # be running on the engine (its client died; the engine keeps the query). From here on
        # that query's body starts no new batch.
        self.channel.take_over()
        try:
            query = _start_query(spark, partial(self._writer, spark, trigger), replace_active=False, log=self.log)
        except Exception as exc:
            if not _ALREADY_ACTIVE.search(str(exc)):
                raise
            query = self._take_over_from_older_query(spark, trigger)
        self.channel.forget_others()
        return query

    def _writer(self, spark: Any, trigger: dict[str, Any]) -> Any:
        kafka = spark.readStream.format("kafka").options(**self.options).load()
        # An Avro source with a registry is decoded by the batch body, with each batch's writer schemas.
        src = self.spec.sources[self.source]
        parsed = kafka if self.writer.registry is not None else parse_records(kafka, src)
        return (
            parsed.writeStream.foreachBatch(self.writer)
            .option("checkpointLocation", str(self.checkpoint / "spark"))
            # Processes with the same settings share one engine session, and a name is unique
            # per session: the run's token keeps two pipelines' (or a dead client's) queries apart.
            .queryName(f"riverhouse_{self.spec.name}_{self.source}_{self.channel.run[:8]}")
            .trigger(**trigger)
        )

    def _take_over_from_older_query(self, spark: Any, trigger: dict[str, Any]) -> Any:
        """Start this run's query in place of an older run's that is still active on the engine.

        Stopping that query while its body writes a batch would kill the body's Python process
        but not the write it asked the engine for, which may then commit after this run looked
        for it (the same batch twice). So wait for its batch in flight to finish (it starts no
        other: this run owns the checkpoint), then let Spark stop it and start this one.

        Letting Spark stop it is a session setting; the run's session may be shared with other
        processes (`shared_session_id`), where it would let their starts stop a query mid-batch
        too. So under Spark Connect this one start happens in a session of its own.
        """
        writing = self.channel.in_flight(mine=False)
        what = f"writing batch {writing[0].get('batch_id')}" if writing else "between batches"
        if self.log is not None:
            self.log(
                f"source {self.source!r}: an earlier run's query is still active on the engine ({what}; "
                "its client is gone); waiting for its batch in flight, then taking over"
            )
        if not self.channel.wait_idle(STOP_WAIT_S, mine=False):
            raise PipelineError(
                f"pipeline {self.spec.name!r}, source {self.source!r}: an earlier run's batch is still being "
                f"written on the engine after {STOP_WAIT_S:.0f} s; read the engine's log (a local engine's is in "
                "<home>/engine/logs)"
            )
        if is_connect(spark) and (own := own_session(spark)) is not None:
            spark = self._own_session = own
        return _start_query(spark, partial(self._writer, spark, trigger), replace_active=True, log=self.log)

    def close(self) -> None:
        """Release what the run's query needed beyond the run's session (after the query ended).
        Best effort: the run's own outcome is what to report."""
        if self._own_session is not None:
            with contextlib.suppress(Exception):
                release_session(self._own_session)
            self._own_session = None

    def report_after(self, batch_id: int) -> None:
        """Report (collect_reports) the batches after `batch_id`, not only those after the run's start."""
        self._seen = batch_id

    def collect_reports(self) -> list[BatchMetrics]:
        """Batches reported since the last look (oldest first); each is passed to `on_batch` once."""
        new = [BatchMetrics.from_report(r) for r in self.channel.reports_after(self._seen)]
        for batch in new:
            self._seen = max(self._seen, batch.batch_id)
            self.batches.append(batch)
            if self.on_batch is not None:
                self.on_batch(batch)
        if new:
            self._mark_published(new)
            self.publish_offsets()
        return new

    def _mark_published(self, new: list[BatchMetrics]) -> None:
        """Once a source has had a resident query (`published.json` exists), every mode's reported
        batches move its mark: the next resident run reports the batches after them, and the lag
        sensor counts from them (ingest/resident.py)."""
        mark = read_published(self.checkpoint)
        if mark is None:
            return
        last = new[-1].batch_id
        silver = max((b.silver_version for b in new if b.silver_version is not None), default=None)
        silver = mark.get("silver_version") if silver is None else silver
        write_published(self.checkpoint, last, batch_offsets(self.checkpoint / "spark", last), silver)

    def publish_offsets(self) -> None:
        """Commit the offsets of the last batch Spark committed to the pipeline's consumer group
        (`kafka.consumer_group`), so Kafka's tools show its lag. Monitoring only: a failure is
        reported once and never stops the run."""
        group = self.spec.kafka.monitoring_group(self.spec.name)
        if group is None or self._offsets_failed:
            return
        offsets = committed_offsets(self.checkpoint / "spark")
        if not offsets or offsets == self._offsets_published:
            return
        try:
            commit_group_offsets(librdkafka_config(self.spec.kafka, self.bootstrap), group, offsets)
        except Exception as exc:
            self._offsets_failed = True
            print(
                f"riverhouse: warning: could not commit offsets to consumer group {group} (lag monitoring only; "
                f"the pipeline is unaffected): {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            return
        self._offsets_published = offsets

    def stop(self, query: Any) -> None:
        """Clean stop: start no new batch, let the one in flight finish, stop the query.

        The wait ends early once the query is no longer active: a batch whose body died (a killed
        worker) leaves its in-flight marker behind, and nothing would ever end it.
        """
        self.channel.request_stop()
        deadline = time.monotonic() + STOP_WAIT_S
        while not self.channel.wait_idle(STOP_POLL_S) and time.monotonic() < deadline:
            if not query.isActive:
                break
        query.stop()
        self.collect_reports()
        self.publish_offsets()

    def failure(self, exc: BaseException) -> PipelineError:
        if self.remote and (lost := engine_lost(exc, self.remote)) is not None:
            lost.__cause__ = exc
            return lost
        topic = self.spec.sources[self.source].topic
        message = _root_message(exc)
        if _WORKER_NOT_CONNECTED.search(message):
            message = (
                f"the query's Python worker did not connect back to Spark in time, {WORKER_START_ATTEMPTS} starts "
                "in a row: the machine is overloaded, or the engine cannot start its Python (PYSPARK_PYTHON); "
                "read the engine's log (a local engine's is in <home>/engine/logs)"
            )
        elif _KAFKA_UNREACHABLE.search(str(exc)) and "cannot reach Kafka" not in message:
            # The connector's timeouts name a Java exception; the user needs to know it was Kafka.
            message = f"cannot reach Kafka at {self.bootstrap} (Spark's Kafka connector: {message})"
        error = PipelineError(
            f"pipeline {self.spec.name!r}, source {self.source!r} (topic {topic!r}) failed: {message}"
        )
        error.__cause__ = exc
        return error

    def stopped_cleanly(self, exc: BaseException | None) -> bool:
        """Did the query end because a clean stop refused its next batch?"""
        return exc is not None and "StreamStopped" in str(exc)


def prepare_stream(
    spec: PipelineSpec,
    settings: Settings,
    source: str,
    on_batch: Callable[[BatchMetrics], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> SourceStream:
    src = spec.sources[source]
    bootstrap = resolve_bootstrap(spec, settings)
    layout = TableLayout(settings.warehouse, spec.name)
    ckpt = checkpoint_dir(settings, spec.name, source)
    app_id = stream_app_id(ckpt, spec.name, source)
    channel = BatchChannel(ckpt, run=uuid.uuid4().hex)
    writer = BatchWriter(spec, source, layout, app_id, channel, FaultPlan.from_env())
    options = connector_options(spec.kafka, bootstrap, [src.topic])
    remote = settings.spark_conf.get("spark.remote") or os.environ.get(REMOTE_ENV) or None
    hook = metrics.observed(spec.name, on_batch)
    return SourceStream(spec, source, writer, options, ckpt, layout, bootstrap, hook, remote, log)


# Spark refuses to start a query whose checkpoint another active query on the engine uses.
_ALREADY_ACTIVE = re.compile(r"another query with same id is already active")
_REPLACE_ACTIVE = "spark.sql.streaming.stopActiveRunOnRestart"


# Spark gives a query's foreachBatch worker 10 s to connect back to the JVM (PythonWorkerFactory's
# fixed timeout) and fails the start if it does not; the query then never existed (the worker
# starts before the query does: StreamingForeachBatchHelper), so starting again is safe.
_WORKER_NOT_CONNECTED = re.compile(r"Python worker failed to connect back")
WORKER_START_ATTEMPTS = 3
WORKER_RETRY_WAIT_S = 1.0


def _start_query(
    spark: Any, writer: Callable[[], Any], replace_active: bool, log: Callable[[str], None] | None = None
) -> Any:
    """Start the query `writer()` makes; `replace_active`: stop an older query of the same checkpoint
    first (Spark's default, which the caller allows only when that query writes nothing).

    A start whose foreachBatch worker did not connect back in time (a loaded machine) is tried
    again, up to WORKER_START_ATTEMPTS starts, and said in the log."""
    attempt = 1
    while True:
        # Queries may be planned beside another source's (start_queries); the first foreachBatch of
        # a local session starts py4j's callback server, once, and the setting is the session's:
        # one start at a time.
        with _QUERY_START:
            spark.conf.set(_REPLACE_ACTIVE, str(replace_active).lower())
            try:
                return writer().start()
            except Exception as exc:
                if attempt >= WORKER_START_ATTEMPTS or not _WORKER_NOT_CONNECTED.search(str(exc)):
                    raise
        message = (
            f"the query's Python worker did not connect back to Spark in time (start {attempt} of "
            f"{WORKER_START_ATTEMPTS}); starting the query again"
        )
        (log or (lambda m: print(f"riverhouse: {m}", file=sys.stderr, flush=True)))(message)
        time.sleep(WORKER_RETRY_WAIT_S * attempt)
        attempt += 1


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
    app id), so they are read side by side, as continuous mode does: the smaller
    stream's query start and batches overlap the larger one's. If one query fails, the
    others stop cleanly (their batch in flight finishes) and the failure is raised.
    """
    streams = [prepare_stream(spec, settings, source, on_batch, log) for source in sources]
    with ExitStack() as locks:
        for stream in streams:
            locks.enter_context(pipeline_lock(stream.checkpoint, spec.name, wait_s=lock_wait_s, log=log))
        started = time.monotonic()
        try:
            queries = start_queries(spark, streams, {"availableNow": True})
            try:
                await_all(streams, queries)
            except QueryFailed as failed:
                _stop_all(list(zip(streams, queries, strict=True)), failed.stream)
                raise failed.error from failed.error.__cause__
            except BaseException:
                _stop_all(list(zip(streams, queries, strict=True)))
                raise
            return [stream_result(stream, query, started) for stream, query in zip(streams, queries, strict=True)]
        finally:
            for stream in streams:
                stream.close()
            metrics.push(spec, partial(pipeline_lag, spec, settings))  # too short a run to scrape (metrics.py)


def start_queries(spark: Any, streams: list[SourceStream], trigger: dict[str, Any]) -> list[Any]:
    """Start every stream's query, side by side; returns them in `streams`' order.

    Building a query's plan takes hundreds of round trips to the JVM, and a query's first
    steps (its source's planning, the first offsets) are mostly waiting, so a join's second
    source does not wait for the first one's start. If a query cannot start, the ones that
    did are stopped and the failure names its source.
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
    except PipelineError:
        raise
    except Exception as exc:
        raise stream.failure(exc) from exc


def _stop_all(running: list[tuple[SourceStream, Any]], failed: SourceStream | None = None) -> None:
    """Stop the queries still running: the others cleanly, the one that `failed` at once (its
    failure was raised while the engine may still list it as active: its batch will not end)."""
    for stream, query in running:
        try:
            if stream is failed:
                query.stop()
            elif query.isActive:
                stream.stop(query)
        except Exception:  # stopping is best effort: the first failure is the one to report
            pass


class QueryFailed(Exception):
    """`await_all`'s first failure: the stream whose query failed, and the error to raise."""

    def __init__(self, stream: SourceStream, error: BaseException) -> None:
        super().__init__(str(error))
        self.stream, self.error = stream, error


def await_all(streams: list[SourceStream], queries: list[Any], poll_s: float = 0.05) -> None:
    """Wait for every query to end, reporting batches as they land; the first failure is raised at
    once, as QueryFailed (which names its stream)."""
    pending = list(zip(streams, queries, strict=True))
    while pending:
        for stream, query in list(pending):
            try:
                done = query.awaitTermination(poll_s)
            except Exception as exc:
                stream.collect_reports()
                raise QueryFailed(stream, stream.failure(exc)) from exc
            stream.collect_reports()
            if done is None or done:
                pending.remove((stream, query))


def stream_result(stream: SourceStream, query: Any, started: float) -> IngestResult:
    end_offsets: dict[str, dict[str, int]] = {}
    progress = query.lastProgress
    if progress and progress.get("sources"):
        raw = progress["sources"][0].get("endOffset")
        end_offsets = json.loads(raw) if isinstance(raw, str) else (raw or {})
    stream.collect_reports()
    stream.publish_offsets()  # the last batch's, committed by Spark after its report
    silver_version = DeltaLog(stream.layout.silver(stream.source)).latest_version()
    return IngestResult(
        stream.spec.name, stream.source, stream.batches, time.monotonic() - started, silver_version, end_offsets
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
