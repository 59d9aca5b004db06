"""One pipeline run without Dagster: ingest every source, then load ClickHouse."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

from riverhouse.platform.gold.joins import run_gold
from riverhouse.platform.ingest.stream import (
    BatchMetrics,
    PipelineError,
    StreamStopped,
    ingest_sources,
    pipeline_lock,
    prepare_stream,
    resolve_bootstrap,
    sink_lock,
    start_queries,
)
from riverhouse.platform.runtime import metrics
from riverhouse.platform.runtime.spark import get_spark
from riverhouse.platform.sink.clickhouse import (
    ClickHouseLoadError,
    LoadResult,
    load_new_versions,
    open_client,
    sink_table_path,
)
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.settings import Settings

PUBLISH_POLL_S = 0.1  # continuous mode: how soon a landed batch is joined and loaded


def run_once(
    spec: PipelineSpec,
    settings: Settings,
    load: bool = True,
    log: Callable[[str], None] = print,
    spark: Any = None,
    drain: bool = False,
) -> dict[str, Any]:
    """Ingest every source, run the join (join pipelines), load ClickHouse; returns the counts.

    The sources' queries run side by side. A source pipeline loads each batch into
    ClickHouse as soon as it has committed (SinkLoader); a join pipeline loads after its join.
    """
    started = time.monotonic()
    resolve_bootstrap(spec, settings)  # no Kafka: say so before a Spark start-up
    spark = spark or get_spark(settings.spark_master, conf=settings.spark_conf)
    loader = SinkLoader(spec, settings, log, spark) if load else None
    if loader is not None:
        loader.connect()  # opens while the queries start
    early_loads = loader is not None and not spec.is_join

    def on_batch(m: BatchMetrics) -> None:
        log(_batch_line(spec, m))
        if early_loads and m.inserted:
            loader.load_soon()

    summary: dict[str, Any] = {"pipeline": spec.name}
    totals = {"read": 0, "quarantined": 0, "duplicates_dropped": 0, "inserted": 0, "replayed": 0, "batches": 0}
    stages: dict[str, float] = {}
    try:
        queries_started = time.monotonic()
        results = ingest_sources(spark, spec, settings, list(spec.sources), on_batch=on_batch)
        # Starting the streaming queries (checkpoint, the source's planning process, first
        # offsets) up to the first batch: a fixed cost per run, paid once by a continuous pipeline.
        first_batch = min((r.batches[0].started_at for r in results if r.batches), default=time.monotonic())
        for result in results:
            for key in totals:
                totals[key] += result.summary()[key]
            for stage, seconds in result.stage_seconds().items():
                stages[stage] = round(stages.get(stage, 0.0) + seconds, 3)
            summary[f"silver_version_{result.source}"] = result.silver_version
        summary.update(totals)
        summary["stage_seconds"] = stages
        summary["query_startup_s"] = round(first_batch - queries_started, 3)
        if spec.is_join:
            gold = run_gold(spark, spec, settings, drain=drain)
            log(
                f"join: {gold.processed:,} driving events closed, {gold.emitted:,} emitted "
                f"({gold.matched:,} matched, {gold.unmatched_left:,} unmatched left), {gold.rejected:,} quarantined, "
                f"{gold.pending:,} waiting for their window to close"
            )
            summary.update({f"join_{k}": v for k, v in gold.summary().items()})
        if loader is not None:
            sink_version = None if spec.is_join else summary[f"silver_version_{spec.sink_source_name}"]
            summary.update(loader.finish(up_to=sink_version))
    finally:
        if loader is not None:
            loader.close()
    summary["seconds"] = round(time.monotonic() - started, 3)
    return summary


def load_sink(
    spec: PipelineSpec,
    settings: Settings,
    log: Callable[[str], None] | None = None,
    client: Any = None,
    spark: Any = None,
) -> Any:
    """Load new Delta versions into ClickHouse, one loader per pipeline at a time."""
    began = time.monotonic()
    try:
        with sink_lock(settings, spec.name, log):
            result = load_new_versions(
                spec,
                settings.clickhouse_dsn,
                sink_table_path(spec, settings.warehouse),
                log=log,
                client=client,
                spark=spark,
            )
    except ClickHouseLoadError:
        metrics.observe_load_error(spec.name)
        metrics.push(spec, settings)
        raise
    metrics.observe_load(spec.name, result.rows_loaded, time.monotonic() - began, result.last_loaded_version)
    metrics.push(spec, settings)
    return result


class SinkLoader:
    """A run's ClickHouse loads, on one thread that owns the connection.

    Loading a batch while Spark is still finishing the run (its commit log, the next
    batch) is the same exactly-once load as loading after it: the loader reads only
    committed Delta versions and the ClickHouse ledger (continuous mode has always
    loaded alongside its queries). The connection is held for the run, as continuous
    mode holds it for its session (with embedded chDB, no other process can open the
    same path meanwhile).
    """

    def __init__(self, spec: PipelineSpec, settings: Settings, log: Callable[[str], None] | None, spark: Any = None):
        self.spec = spec
        self.spark = spark
        self.settings = settings
        self.log = log
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="riverhouse-load")
        self._connecting: Future[Any] | None = None
        self._loads: list[Future[LoadResult]] = []
        self._client: Any = None
        self._connect_error: Exception | None = None
        self._connection = ExitStack()
        self._lock = threading.Lock()
        self._waiting = False  # a load is queued and has not started: a new request joins it

    def connect(self) -> None:
        """Open the connection now, in the background (it takes ~0.1 s with chDB)."""
        self._connecting = self._pool.submit(self._open)

    def load_soon(self) -> None:
        """Load whatever has committed by the time the loader thread gets to it."""
        with self._lock:
            if self._waiting:
                return
            self._waiting = True
        self._loads.append(self._pool.submit(self._load))

    def load_now(self) -> LoadResult:
        """Load whatever has committed, and wait for it."""
        return self._pool.submit(self._load).result()

    def finish(self, up_to: int | None) -> dict[str, Any]:
        """Wait for the loads under way, then load the rest unless they reached Delta version `up_to`.

        Raises the first error. Returns the run summary's load figures.
        """
        if self._connecting is not None:
            self._connecting.result()
        results = [load.result() for load in self._loads]
        if up_to is None or not results or results[-1].last_loaded_version != up_to:
            results.append(self.load_now())
        return {
            "clickhouse_rows_loaded": sum(r.rows_loaded for r in results),
            "delta_versions_loaded": sum(len(r.versions_loaded) for r in results),
            "last_loaded_version": results[-1].last_loaded_version,
            "load_seconds": round(sum(r.seconds for r in results), 3),
            "clickhouse_loads": len(results),
        }

    def close(self) -> None:
        """Let a load under way finish, then close the connection."""
        self._pool.submit(self._connection.close).result()
        self._pool.shutdown()

    def _open(self) -> Any:
        if self._connect_error is not None:  # retried once already (with backoff): say so again, fast
            raise self._connect_error
        if self._client is None:
            try:
                self._client = self._connection.enter_context(open_client(self.settings.clickhouse_dsn))
            except Exception as exc:
                self._connect_error = exc
                raise
        return self._client

    def _load(self) -> LoadResult:
        with self._lock:
            self._waiting = False
        return load_sink(self.spec, self.settings, self.log, client=self._open(), spark=self.spark)


def _batch_line(spec: PipelineSpec, m: BatchMetrics) -> str:
    prefix = f"{m.source} " if len(spec.sources) > 1 else ""
    return (
        f"{prefix}batch {m.batch_id}: read {m.read:,}, quarantined {m.quarantined:,}, "
        f"duplicates dropped {m.duplicates_dropped:,}, inserted {m.inserted:,} ({m.seconds:.1f}s)"
    )


def run_continuous(
    spec: PipelineSpec,
    settings: Settings,
    stop: threading.Event,
    load: bool = True,
    log: Callable[[str], None] = print,
    spark: Any = None,
    observe: Callable[[BatchMetrics], None] | None = None,
) -> dict[str, Any]:
    """Keep every source's streaming query running (processing-time trigger) until `stop` is set.

    As soon as a batch lands, the join (non-draining) and the ClickHouse load run, so rows
    become visible about one batch after they reach Kafka. Stopping lets the batch
    in flight finish, then publishes what it wrote. The exactly-once machinery is the
    same as for triggered runs: a kill at any point is repaired by the next run.
    `observe`, if given, sees every batch's metrics (the benchmark's freshness profile).
    """
    started = time.monotonic()
    resolve_bootstrap(spec, settings)
    endpoint = metrics.ContinuousMetrics.from_env(spec, settings)  # a bad setting fails before Spark starts
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
            log(_batch_line(spec, m))

    loaded = {"rows": 0}
    published = {"batches": -1}
    loader = SinkLoader(spec, settings, log, spark) if load else None  # one connection for the session

    def publish() -> None:
        with counted:
            batches = totals["batches"]
        if batches == published["batches"]:
            return
        published["batches"] = batches
        if spec.is_join:
            run_gold(spark, spec, settings, drain=False)
        if loader is not None:
            began = time.monotonic()
            result = loader.load_now()
            if result.rows_loaded:
                loaded["rows"] += result.rows_loaded
                log(
                    f"loaded {result.rows_loaded:,} rows into ClickHouse "
                    f"(Delta version {result.last_loaded_version}, {loaded['rows']:,} this session) "
                    f"in {time.monotonic() - began:.2f}s"
                )

    streams = [prepare_stream(spec, settings, source, on_batch) for source in spec.sources]
    trigger = {"processingTime": f"{max(1, int(interval.total_seconds() * 1000))} milliseconds"}
    with ExitStack() as locks:
        for stream in streams:
            locks.enter_context(pipeline_lock(stream.checkpoint, spec.name))
        if loader is not None:
            locks.callback(loader.close)  # before the locks are released
        endpoint.start(log)
        locks.callback(endpoint.stop)
        queries = start_queries(spark, streams, trigger)
        log(
            f"continuous: pipeline {spec.name} running ({len(queries)} queries, trigger every "
            f"{interval.total_seconds():g}s); Ctrl-C or SIGTERM stops after the current batch"
        )
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
    summary: dict[str, Any] = {
        "pipeline": spec.name,
        "mode": "continuous",
        **totals,
        "clickhouse_rows_loaded": loaded["rows"],
        "seconds": round(time.monotonic() - started, 3),
    }
    return summary
