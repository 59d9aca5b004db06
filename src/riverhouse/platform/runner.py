"""One pipeline run without Dagster: ingest every source, then load ClickHouse."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from riverhouse.platform.clickhouse import load_new_versions, open_client, sink_table_path
from riverhouse.platform.joins import run_gold
from riverhouse.platform.pipeline import (
    BatchMetrics,
    PipelineError,
    StreamStopped,
    ingest,
    pipeline_lock,
    prepare_stream,
    resolve_bootstrap,
    sink_lock,
)
from riverhouse.platform.settings import Settings
from riverhouse.platform.spark import get_spark
from riverhouse.platform.spec import PipelineSpec

PUBLISH_POLL_S = 0.1  # continuous mode: how soon a landed batch is joined and loaded


def run_once(spec: PipelineSpec, settings: Settings, load: bool = True,
             log: Callable[[str], None] = print, spark: Any = None, drain: bool = False) -> dict[str, Any]:
    """Ingest every source, run the join (join pipelines), load ClickHouse; returns the counts."""
    started = time.monotonic()
    resolve_bootstrap(spec, settings)  # no Kafka: say so before a Spark start-up
    spark = spark or get_spark(settings.spark_master, conf=settings.spark_conf)

    def on_batch(m: BatchMetrics) -> None:
        log(f"batch {m.batch_id}: read {m.read:,}, quarantined {m.quarantined:,}, "
            f"duplicates dropped {m.duplicates_dropped:,}, inserted {m.inserted:,} ({m.seconds:.1f}s)")

    summary: dict[str, Any] = {"pipeline": spec.name}
    totals = {"read": 0, "quarantined": 0, "duplicates_dropped": 0, "inserted": 0, "replayed": 0, "batches": 0}
    stages: dict[str, float] = {}
    # Starting each streaming query (checkpoint, the source's planning process, first offsets)
    # up to its first batch: a fixed cost per run, paid once by a continuous pipeline.
    query_startup_s = 0.0
    for source in spec.sources:
        query_started = time.monotonic()
        result = ingest(spark, spec, settings, source, on_batch=on_batch)
        # No batch: the query's whole time was start-up.
        query_startup_s += (result.batches[0].started_at if result.batches else time.monotonic()) - query_started
        for key in totals:
            totals[key] += result.summary()[key]
        for stage, seconds in result.stage_seconds().items():
            stages[stage] = round(stages.get(stage, 0.0) + seconds, 3)
        summary[f"silver_version_{source}"] = result.silver_version
    summary.update(totals)
    summary["stage_seconds"] = stages
    summary["query_startup_s"] = round(query_startup_s, 3)
    if spec.is_join:
        gold = run_gold(spark, spec, settings, drain=drain)
        log(f"join: {gold.processed:,} driving events closed, {gold.emitted:,} emitted "
            f"({gold.matched:,} matched, {gold.unmatched_left:,} unmatched left), {gold.rejected:,} quarantined, "
            f"{gold.pending:,} waiting for their window to close")
        summary.update({f"join_{k}": v for k, v in gold.summary().items()})
    if load:
        loaded = load_sink(spec, settings, log)
        summary["clickhouse_rows_loaded"] = loaded.rows_loaded
        summary["delta_versions_loaded"] = len(loaded.versions_loaded)
        summary["last_loaded_version"] = loaded.last_loaded_version
        summary["load_seconds"] = round(loaded.seconds, 3)
    summary["seconds"] = round(time.monotonic() - started, 3)
    return summary


def load_sink(spec: PipelineSpec, settings: Settings, log: Callable[[str], None] | None = None,
              client: Any = None) -> Any:
    """Load new Delta versions into ClickHouse, one loader per pipeline at a time."""
    with sink_lock(settings, spec.name, log):
        return load_new_versions(spec, settings.clickhouse_dsn, sink_table_path(spec, settings.warehouse), log=log,
                                 client=client)


def run_continuous(spec: PipelineSpec, settings: Settings, stop: threading.Event, load: bool = True,
                   log: Callable[[str], None] = print, spark: Any = None,
                   observe: Callable[[BatchMetrics], None] | None = None) -> dict[str, Any]:
    """Keep every source's streaming query running (processing-time trigger) until `stop` is set.

    As soon as a batch lands, the join (non-draining) and the ClickHouse load run, so rows
    become visible about one batch after they reach Kafka. Stopping lets the batch
    in flight finish, then publishes what it wrote. The exactly-once machinery is the
    same as for triggered runs: a kill at any point is repaired by the next run.
    `observe`, if given, sees every batch's metrics (the benchmark's freshness profile).
    """
    started = time.monotonic()
    resolve_bootstrap(spec, settings)
    spark = spark or get_spark(settings.spark_master, conf=settings.spark_conf)
    interval = spec.orchestration.trigger_interval
    totals = {"read": 0, "quarantined": 0, "duplicates_dropped": 0, "inserted": 0, "replayed": 0, "batches": 0}
    counted = threading.Lock()

    batch_landed = threading.Event()

    def on_batch(m: BatchMetrics) -> None:
        with counted:
            totals["batches"] += 1
            for key in ("read", "quarantined", "duplicates_dropped", "inserted", "replayed"):
                totals[key] += getattr(m, key)
        batch_landed.set()
        if observe is not None:
            observe(m)
        if m.read:
            log(f"batch {m.batch_id}: read {m.read:,}, quarantined {m.quarantined:,}, "
                f"duplicates dropped {m.duplicates_dropped:,}, inserted {m.inserted:,} ({m.seconds:.1f}s)")

    loaded = {"rows": 0}
    published = {"batches": -1}
    clients: list[Any] = []

    def publish() -> None:
        with counted:
            batches = totals["batches"]
        if batches == published["batches"]:
            return
        published["batches"] = batches
        if spec.is_join:
            run_gold(spark, spec, settings, drain=False)
        if load:
            began = time.monotonic()
            if not clients:  # one connection for the session, closed with the locks
                clients.append(locks.enter_context(open_client(settings.clickhouse_dsn)))
            result = load_sink(spec, settings, log, client=clients[0])
            if result.rows_loaded:
                loaded["rows"] += result.rows_loaded
                log(f"loaded {result.rows_loaded:,} rows into ClickHouse "
                    f"(Delta version {result.last_loaded_version}, {loaded['rows']:,} this session) "
                    f"in {time.monotonic() - began:.2f}s")

    streams = [prepare_stream(spec, settings, source, on_batch) for source in spec.sources]
    trigger = {"processingTime": f"{max(1, int(interval.total_seconds() * 1000))} milliseconds"}
    with ExitStack() as locks:
        for stream in streams:
            locks.enter_context(pipeline_lock(stream.checkpoint, spec.name))
        queries = [stream.start(spark, trigger) for stream in streams]
        log(f"continuous: pipeline {spec.name} running ({len(queries)} queries, trigger every "
            f"{interval.total_seconds():g}s); Ctrl-C or SIGTERM stops after the current batch")
        try:
            checked = time.monotonic()
            while not stop.wait(PUBLISH_POLL_S):
                # Publish as soon as a batch lands (freshness), and check on the queries at
                # least once per trigger interval either way.
                if not batch_landed.is_set() and time.monotonic() - checked < interval.total_seconds():
                    continue
                batch_landed.clear()
                checked = time.monotonic()
                for stream, query in zip(streams, queries, strict=True):
                    if not query.isActive:
                        raise stream.failure(query.exception() or PipelineError("the query stopped"))
                publish()
        finally:
            for stream, query in zip(streams, queries, strict=True):
                stream.stop(query)
            log("continuous: stopping; the batch in flight finished")
        for stream in streams:
            error = stream.writer.error
            if error is not None and not isinstance(error, StreamStopped):
                raise stream.failure(error)
        published["batches"] = -1
        publish()
    summary: dict[str, Any] = {"pipeline": spec.name, "mode": "continuous", **totals,
                               "clickhouse_rows_loaded": loaded["rows"],
                               "seconds": round(time.monotonic() - started, 3)}
    return summary
