"""A resident query (`orchestration.resident_query`): a source's streaming query kept running on the
engine between triggered runs, so a trigger does not pay a query's start.

A triggered run (a sensor tick, a schedule, Materialize) otherwise starts a query, reads what Kafka
holds and stops it: seconds of fixed cost before its first record (the query's start, its Python
worker on the engine, a first batch about twice a steady one; bench/analysis.md). A resident query
pays them once. It runs on the Spark Connect engine with a processing-time trigger
(`orchestration.trigger_interval`), and a triggered run attaches to it:

1. under the source's run lock, it reads the end offsets Kafka has now (the trigger's offsets);
2. it finds the resident query on the engine (`resident.json` in the checkpoint names it), or starts
   one when none runs, when the one named is no longer the checkpoint's owner (a clean stop, a
   backfill, or another run took over), or when it was started for another spec or release;
3. it waits until Spark has committed a batch that covers the trigger's offsets: silver then holds
   every record Kafka had at the trigger. Batches are reported as they land;
4. its batches are those no earlier run published (`published.json`), so each batch is reported by
   exactly one run. The Kafka-lag sensor counts from the published offsets (kafka/lag.py): records
   the resident query already wrote still wait for the run that checks and loads them.

Exactly once is the stream's own: the same checkpoint, app ids and batch body as a run's query.
Whatever else writes the source's tables or checkpoint (a backfill of silver, a reset) stops the
resident query first (`stop_resident`), under the same lock; a run that starts a query of its own
takes the checkpoint over as it would from any older query.

Join pipelines keep a query per run (spec.py refuses the setting there): their gold step reads
both sources' silver as one run wrote them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import riverhouse
from riverhouse.platform.errors import PipelineError
from riverhouse.platform.ingest.stream import IngestResult, SourceStream, prepare_stream, stream_result
from riverhouse.platform.ingest.writer import BatchMetrics
from riverhouse.platform.kafka.client import committed_offsets
from riverhouse.platform.kafka.lag import pipeline_lag
from riverhouse.platform.runtime import metrics
from riverhouse.platform.runtime.spark import attach_named_session, is_connect
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import (
    BatchChannel,
    checkpoint_dir,
    pipeline_lock,
    read_json,
    read_published,
    write_json,
    write_published,
)
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.settings import Settings

Offsets = dict[str, dict[str, int]]

RESIDENT_FILE = "resident.json"  # the query kept on the engine: run token, query id, session, fingerprint
# A run waits for the resident query as long as it commits batches; this long without one, it gives up.
STALL_S = 300.0
POLL_S = 0.05


def applies(spec: PipelineSpec, spark: Any) -> bool:
    """Does a triggered run of `spec` on `spark` use a resident query? (Only an engine keeps one.)"""
    return spec.orchestration.resident_query and is_connect(spark)


def fingerprint(spec: PipelineSpec, settings: Settings) -> str:
    """What the resident query's body was built from: a change of spec, release or paths restarts it."""
    what = {
        "spec": spec.model_dump(mode="json"),
        "release": riverhouse.__version__,
        "warehouse": str(settings.warehouse),
        "checkpoints": str(settings.checkpoints),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def covers(committed: Offsets | None, target: Offsets) -> bool:
    """Has the query committed every offset of `target` ({topic: {partition: end offset}})?"""
    for topic, ends in target.items():
        have = (committed or {}).get(topic, {})
        for partition, end in ends.items():
            if end > 0 and have.get(str(partition), -1) < end:
                return False
    return True


def ingest_resident(
    spark: Any,
    spec: PipelineSpec,
    settings: Settings,
    source: str,
    on_batch: Callable[[BatchMetrics], None] | None = None,
    lock_wait_s: float = 0.0,
    log: Callable[[str], None] | None = None,
) -> IngestResult:
    """A triggered run through the source's resident query: everything Kafka holds at the call is in
    silver when it returns; the result holds the batches no earlier run reported."""
    stream = prepare_stream(spec, settings, source, on_batch, log)
    try:
        with pipeline_lock(stream.checkpoint, spec.name, wait_s=lock_wait_s, log=log):
            started = time.monotonic()
            target = pipeline_lag(spec, settings, [source]).end_offsets
            fp = fingerprint(spec, settings)
            query = _running(spark, stream, fp, log) or _start(spark, stream, settings, fp, log)
            mark = read_published(stream.checkpoint) or {}
            stream.report_after(int(mark.get("batch_id", -1)))
            _wait_covered(stream, query, target)
            result = stream_result(stream, query, started)
            _publish(result, mark)
    finally:
        stream._own_session = None  # a resident query's session stays on the engine (never released here)
    result.end_offsets = target
    metrics.push(spec, lambda: pipeline_lag(spec, settings, [source]))
    return result


def stop_resident(spark: Any, spec: PipelineSpec, settings: Settings, source: str) -> bool:
    """Stop the source's resident query, if one runs, after its batch in flight (the caller holds the
    source's run lock). A no-op without one. Returns whether a query was stopped."""
    checkpoint = checkpoint_dir(settings, spec.name, source)
    marker = read_json(checkpoint / RESIDENT_FILE)
    if not isinstance(marker, dict):
        return False
    channel = BatchChannel(checkpoint, run=f"stop-{os.getpid()}")
    channel.request_stop()  # its body starts no new batch from here on
    channel.wait_idle(STALL_S, mine=False)
    query = _find(spark, marker) if spark is not None and is_connect(spark) else None
    stopped = False
    if query is not None and query.isActive:
        query.stop()
        stopped = True
    (checkpoint / RESIDENT_FILE).unlink(missing_ok=True)
    return stopped


# ---------------------------------------------------------------------------- internals
def _find(spark: Any, marker: dict[str, Any]) -> Any | None:
    """The query `marker` names, through the engine session it was started in (None if gone)."""
    try:
        session = spark
        if marker.get("session_id") and marker["session_id"] != spark.session_id:
            session = attach_named_session(spark, marker["session_id"])
        return session.streams.get(marker["query_id"])
    except Exception:  # its session closed, the engine restarted: no such query
        return None


def _running(spark: Any, stream: SourceStream, fp: str, log: Callable[[str], None] | None) -> Any | None:
    """The source's resident query if it runs and may write for this spec; a stale one is stopped."""
    marker = read_json(stream.checkpoint / RESIDENT_FILE)
    if not isinstance(marker, dict):
        return None
    query = _find(spark, marker)
    if query is None or not query.isActive or str(query.runId) != marker.get("run_id"):
        return None
    owner = read_json(stream.channel.owner_marker) or {}
    if owner.get("run") == marker.get("run") and marker.get("fingerprint") == fp:
        return query
    why = "the spec or release changed" if owner.get("run") == marker.get("run") else "another run took over"
    if log is not None:
        log(f"source {stream.source!r}: restarting its resident query ({why})")
    stream.channel.request_stop()
    stream.channel.wait_idle(STALL_S, mine=False)
    query.stop()
    return None


def _start(spark: Any, stream: SourceStream, settings: Settings, fp: str, log: Callable[[str], None] | None) -> Any:
    """Start the source's resident query; the first one also marks where runs' reports begin."""
    if read_published(stream.checkpoint) is None:
        silver = DeltaLog(stream.layout.silver(stream.source)).latest_version()
        offsets = committed_offsets(stream.checkpoint / "spark")
        write_published(stream.checkpoint, stream.channel.last_reported(), offsets, silver)
    interval = stream.spec.orchestration.trigger_interval.total_seconds()
    query = stream.start(spark, {"processingTime": f"{max(1, int(interval * 1000))} milliseconds"})
    session = stream._own_session or spark
    if stream._own_session is not None:
        stream._own_session.release_session_on_close = False  # the query lives in it after this run
    write_json(
        stream.checkpoint / RESIDENT_FILE,
        {
            "run": stream.channel.run,
            "query_id": str(query.id),  # the checkpoint's: the same for every query of it
            "run_id": str(query.runId),  # this start's
            "session_id": session.session_id,
            "fingerprint": fp,
            "started": time.time(),
            "pid": os.getpid(),
        },
    )
    if log is not None:
        log(f"source {stream.source!r}: started its resident query (trigger every {interval:g}s)")
    return query


def _wait_covered(stream: SourceStream, query: Any, target: Offsets) -> None:
    """Wait until Spark has committed a batch covering `target`, reporting batches as they land."""
    spark_checkpoint = stream.checkpoint / "spark"
    last, progressed = None, time.monotonic()
    while True:
        committed = committed_offsets(spark_checkpoint)
        stream.collect_reports()
        if covers(committed, target):
            return
        if committed != last:
            last, progressed = committed, time.monotonic()
        if not query.isActive:
            raise stream.failure(query.exception() or PipelineError("the resident query stopped"))
        if time.monotonic() - progressed > STALL_S:
            raise PipelineError(
                f"pipeline {stream.spec.name!r}, source {stream.source!r}: the resident query committed no batch "
                f"for {STALL_S:.0f} s while Kafka holds offsets {target} it has not read; read the engine's log"
            )
        time.sleep(POLL_S)


def _publish(result: IngestResult, mark: dict[str, Any]) -> None:
    """Give the result silver's versions before and after its batches (their reports moved the mark
    as they landed: SourceStream.collect_reports)."""
    before = mark.get("silver_version")
    result.silver_version_before = before
    versions = [b.silver_version for b in result.batches if b.silver_version is not None]
    result.silver_version = max([*versions, *([] if before is None else [before])], default=None)
