"""The one entry point to the engine: a pipeline (spec + settings + Spark) and what callers do with it.

The CLI, the demo and the Dagster assets build a `Pipeline` and call its methods; they
never reach into `ingest/`, `gold/`, `sink/` or `backfill.py` themselves. Every method
returns a plain result object (IngestResult, GoldResult, LoadResult, RebuildResult, ...).

Steps that publish a stream run or a window take `window`: `None` publishes what the
stream wrote, a `Window` recomputes that window from bronze (a backfill). The caller
only says which window it has; the engine decides what that means for each table.

The Spark session is made on first use (`spark`), so what needs none (the Kafka lag of a
sensor tick, ClickHouse figures, a reset) never starts a JVM.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from riverhouse.platform import publish
from riverhouse.platform.errors import PipelineError
from riverhouse.platform.gold.joins import GoldResult, gold_path, prepare_gold_tables, run_gold
from riverhouse.platform.gold.rebuild import rebuild_gold
from riverhouse.platform.ingest.rebuild import rebuild_silver
from riverhouse.platform.ingest.resident import RESIDENT_FILE, applies, ingest_resident, stop_resident
from riverhouse.platform.ingest.stream import IngestResult, ingest_sources, prepare_stream, start_queries
from riverhouse.platform.ingest.writer import BatchMetrics
from riverhouse.platform.kafka.bootstrap import resolve_bootstrap
from riverhouse.platform.kafka.lag import PipelineLag, pipeline_lag
from riverhouse.platform.quality import expectations
from riverhouse.platform.quality.checks import delta_row_count
from riverhouse.platform.runtime import metrics
from riverhouse.platform.runtime.spark import get_spark
from riverhouse.platform.sink import clickhouse as sink
from riverhouse.platform.sink.loader import SinkLoader, load_sink
from riverhouse.platform.sink.replace import ReplaceResult
from riverhouse.platform.sink.replace import replace_clickhouse_window as _replace_clickhouse_window
from riverhouse.platform.sink.topic import ProduceResult, TopicSink, produce_topics
from riverhouse.platform.sink.versions import LoadResult
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import checkpoint_dir, pipeline_lock
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.reset import ResetPlan, plan_reset, reset_pipeline
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout
from riverhouse.platform.state.windows import RebuildResult, Window

__all__ = ["Pipeline", "PipelineError", "Window", "WindowRebuild"]

PUBLISH_POLL_S = 0.1  # continuous mode: how soon a landed batch is joined and loaded
COUNTED = ("read", "quarantined", "duplicates_dropped", "inserted", "replayed")


@dataclass
class WindowRebuild:
    """A rebuilt window: silver of every source, gold (join pipelines), the ClickHouse days swapped in,
    the Kafka sinks' new versions (a changed window is produced again, as a new Delta version)."""

    window: Window
    silver: dict[str, RebuildResult] = field(default_factory=dict)
    gold: RebuildResult | None = None
    clickhouse: ReplaceResult | None = None
    topics: list[ProduceResult] = field(default_factory=list)


def batch_line(spec: PipelineSpec, m: BatchMetrics) -> str:
    prefix = f"{m.source} " if len(spec.sources) > 1 else ""
    return (
        f"{prefix}batch {m.batch_id}: read {m.read:,}, quarantined {m.quarantined:,}, "
        f"duplicates dropped {m.duplicates_dropped:,}, inserted {m.inserted:,} ({m.seconds:.1f}s)"
    )


def topic_summary(results: list[ProduceResult]) -> dict[str, Any]:
    """A run summary's figures of its Kafka sinks (summed over them), plus each sink's own."""
    return {
        "topic_rows_produced": sum(r.rows for r in results),
        "topic_versions_produced": sum(len(r.versions_produced) for r in results),
        "topic_transactions": sum(r.transactions for r in results),
        "topic_seconds": round(sum(r.seconds for r in results), 3),
        "topics": [r.summary() for r in results],
    }


class Pipeline:
    """One pipeline's engine: ingest, publish (gold), load, rebuild a window, lag, continuous.

    `spark`: a session to use; `spark_factory`: how to make one on first use (a Dagster
    resource's session); neither: the process's Riverhouse session from the settings.
    `log` gets progress lines; `warn` (default `log`) the loader's retry warnings.
    """

    def __init__(
        self,
        spec: PipelineSpec,
        settings: Settings,
        spark: Any = None,
        log: Callable[[str], None] = print,
        warn: Callable[[str], None] | None = None,
        spark_factory: Callable[[], Any] | None = None,
    ):
        self.spec = spec
        self.settings = settings
        self.log = log
        self.warn = warn or log
        self._spark = spark
        self._spark_factory = spark_factory

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def spark(self) -> Any:
        if self._spark is None:
            if self._spark_factory is not None:
                self._spark = self._spark_factory()
            else:
                self._spark = get_spark(self.settings.spark_master, conf=self.settings.spark_conf)
        return self._spark

    # ------------------------------------------------------------------ steps
    def ingest(
        self,
        source: str | None = None,
        on_batch: Callable[[BatchMetrics], None] | None = None,
        lock_wait_s: float = 0.0,
        resident: bool = False,
    ) -> IngestResult:
        """One triggered (availableNow) query of one source (default: the sink's): everything now in Kafka.

        `resident` (a Dagster stream run of a spec with `orchestration.resident_query`): on an engine,
        attach to the source's query kept running there instead (ingest/resident.py).
        """
        source = source or self.spec.sink_source_name
        if resident and applies(self.spec, self.spark):
            return ingest_resident(self.spark, self.spec, self.settings, source, on_batch, lock_wait_s, self.log)
        if resident:
            self.log("resident_query: Spark runs in this process (no engine), so this run starts its own query")
        return ingest_sources(self.spark, self.spec, self.settings, [source], on_batch, lock_wait_s, self.log)[0]

    def gold(self, window: Window | None = None, drain: bool = False) -> GoldResult | RebuildResult:
        """Join pipelines: join what arrived (`drain`: close every pending window), or rebuild `window`'s gold."""
        if not self.spec.is_join:
            raise PipelineError(f"pipeline {self.name!r} has no join or query: it has no gold table")
        if window is None:
            return run_gold(self.spark, self.spec, self.settings, drain=drain)
        return rebuild_gold(self.spark, self.spec, self.settings, window.start, window.end, log=self.log)

    def rebuild_silver(self, source: str, window: Window) -> RebuildResult:
        """Recompute `source`'s silver rows of `window` from bronze; one Delta commit if they differ."""
        return rebuild_silver(self.spark, self.spec, self.settings, source, window.start, window.end, log=self.log)

    def load(self, window: Window | None = None, client: Any = None) -> LoadResult | ReplaceResult:
        """Load new Delta versions into ClickHouse exactly once, or swap `window`'s days in (after catching up)."""
        if window is None:
            return load_sink(self.spec, self.settings, self.warn, client=client)
        return _replace_clickhouse_window(self.spec, self.settings, window.start, window.end, log=self.log)

    def produce(self, topic: str | None = None) -> list[ProduceResult]:
        """Produce new Delta versions into every Kafka sink (or `topic`'s), exactly once (backfills' included)."""
        return produce_topics(self.spec, self.settings, self.warn, topic=topic)

    def rebuild(self, window: Window) -> WindowRebuild:
        """Backfill `window`: silver of every source from bronze, then gold, then the ClickHouse days and topics."""
        out = WindowRebuild(window)
        for source in self.spec.sources:
            out.silver[source] = self.rebuild_silver(source, window)
        if self.spec.is_join:
            out.gold = rebuild_gold(self.spark, self.spec, self.settings, window.start, window.end, log=self.log)
        if self.spec.clickhouse_sink is not None:
            start, end = window.start, window.end
            out.clickhouse = _replace_clickhouse_window(self.spec, self.settings, start, end, log=self.log)
        out.topics = self.produce()
        return out

    def lag(self, sources: list[str] | None = None, closed_is_final: bool = False) -> PipelineLag:
        """Records waiting in Kafka behind the committed offsets (raises if Kafka is unreachable;
        `closed_is_final`: at once if its port refuses connections, see `kafka.lag.pipeline_lag`)."""
        return pipeline_lag(self.spec, self.settings, sources, closed_is_final)

    def reset_plan(self) -> ResetPlan:
        return plan_reset(self.spec, self.settings)

    def reset(self) -> ResetPlan:
        """Forget everything this pipeline wrote (Delta, checkpoints, ClickHouse table and ledger rows)."""
        return reset_pipeline(self.spec, self.settings, log=self.log, before_delete=self._stop_resident_queries)

    def _stop_resident_queries(self) -> None:
        """Stop the sources' resident queries, if any (the caller holds their run locks)."""
        marked = [
            s for s in self.spec.sources if (checkpoint_dir(self.settings, self.name, s) / RESIDENT_FILE).exists()
        ]
        if not marked:
            return
        try:
            spark = self.spark
        except Exception as exc:  # the engine is down, and its queries with it
            self.log(f"the engine cannot be reached ({exc}); a query it still keeps writes nothing once reset")
            spark = None
        for source in marked:
            if stop_resident(spark, self.spec, self.settings, source):
                self.log(f"stopped the resident query of source {source!r}")

    # ------------------------------------------------------------ what it holds
    def silver_rows(self, source: str | None = None) -> int:
        """Rows in a source's silver table (default: the sink's source)."""
        layout = TableLayout(self.settings.warehouse, self.name)
        return delta_row_count(layout.silver(source or self.spec.sink_source_name))

    def clickhouse_rows(self) -> int:
        """Rows in the ClickHouse table."""
        with sink.open_client(self.settings.clickhouse_dsn) as client:
            return sink.row_count(client, self.spec)

    def clickhouse_stats(self) -> dict[str, int]:
        """Rows and duplicate keys in the ClickHouse table."""
        return sink.table_stats(self.settings.clickhouse_dsn, self.spec)

    def join_stats(self, matched_column: str) -> dict[str, int]:
        """Join pipelines: rows with and without a match (`matched_column` null), duplicate keys, in ClickHouse."""
        return sink.join_stats(self.settings.clickhouse_dsn, self.spec, matched_column)

    def sample_rows(self, limit: int = 5) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The first rows of the ClickHouse table in sink.order_by order: (column names, rows)."""
        return sink.sample_rows(self.settings.clickhouse_dsn, self.spec, limit)

    # ------------------------------------------------- publishing (orchestrators)
    # What a Dagster asset shows: metadata and check outcomes (riverhouse.platform.publish).
    def publish_ingest(self, source: str, lock_wait_s: float = 0.0) -> publish.Published:
        return self.publish_ingests([source], lock_wait_s)[source]

    def publish_ingests(self, sources: list[str], lock_wait_s: float = 0.0) -> dict[str, publish.Published]:
        """A stream run's ingest of `sources`: a join's sources are read side by side (ingest_sources)."""
        _ = self.spark  # the session first (GX imports pyspark's modules too)
        expectations.preload()  # the checks that follow need GX: its import overlaps the query
        lag = self.lag(sources)
        layout = TableLayout(self.settings.warehouse, self.name)
        silver_before = {s: DeltaLog(layout.silver(s)).latest_version() for s in sources}

        def on_batch(m: BatchMetrics) -> None:
            self.log(batch_line(self.spec, m))

        with self._gold_tables_beside():
            if len(sources) == 1:
                resident = self.spec.orchestration.resident_query
                results = [self.ingest(sources[0], on_batch=on_batch, lock_wait_s=lock_wait_s, resident=resident)]
            else:
                results = ingest_sources(self.spark, self.spec, self.settings, sources, on_batch, lock_wait_s, self.log)
        published = {}
        for source, result in zip(sources, results, strict=True):
            before = silver_before[source]
            if result.silver_version_before is not None:  # a resident query's batches, some before this run
                before = result.silver_version_before
            waiting = sum(s.lag for s in lag.sources if s.source == source)
            published[source] = publish.ingest(self.spec, self.settings, source, result, waiting, before)
        return published

    def publish_silver(
        self, source: str, window: Window | None, ingested: dict[str, Any] | None = None
    ) -> publish.Published:
        """Stream run: the rows this run's ingest inserted (`ingested`: its metadata). Backfill: `window` rebuilt."""
        if window is None:
            return publish.silver(self.spec, self.settings, source, ingested)
        rebuilt = self.rebuild_silver(source, window)
        return publish.silver_rebuilt(self.spec, self.settings, source, window, rebuilt)

    def publish_gold(self, window: Window | None, drain: bool = False) -> publish.Published:
        """Stream run: join what arrived (`drain`: close every window). Backfill: join `window` again."""
        before = DeltaLog(gold_path(TableLayout(self.settings.warehouse, self.name), self.spec)).latest_version()
        result = self.gold(window, drain=drain)
        if window is None:
            self.log(f"join: {result.summary()}")
        return publish.gold(self.spec, self.settings, window, result, before)

    def publish_clickhouse(self, window: Window | None) -> publish.Published:
        """Stream run: load new Delta versions exactly once. Backfill: swap `window`'s days in."""
        result = self.load(window)
        return publish.clickhouse(self.spec, self.settings, window, result, self.clickhouse_rows())

    def publish_topic(self, topic: str) -> publish.Published:
        """A Kafka sink's pass: every Delta version not in the topic yet, exactly once."""
        produced = next(r for r in self.produce(topic) if r.topic == topic)
        return publish.topic(self.spec, self.settings, produced)

    def check_rejected_rate(self, records: int, rejected: int) -> publish.CheckOutcome:
        return publish.rejected_rate(self.spec, records, rejected)

    def run_checks(self, checks: dict[str, Callable[[], publish.CheckOutcome]]) -> dict[str, publish.CheckOutcome]:
        """Evaluate `checks` side by side: the first on this thread, the others on threads of their own.

        Each is a few small Spark jobs, mostly the driver's single-threaded planning, so one
        check's jobs use the core another's leave idle. Every check ends before the first
        failure (an exception) is raised.
        """
        names = list(checks)
        if len(names) < 2:
            return {name: checks[name]() for name in names}
        from pyspark import inheritable_thread_target

        with ThreadPoolExecutor(len(names) - 1, thread_name_prefix="riverhouse-check") as pool:  # exits when all ended
            others = {name: pool.submit(inheritable_thread_target(self.spark)(checks[name])) for name in names[1:]}
            first = checks[names[0]]()
        return {names[0]: first, **{name: future.result() for name, future in others.items()}}

    def check_silver(self, source: str, written: publish.Written | None) -> publish.CheckOutcome:
        """The source's GX suite, on Spark, over what the step wrote (Published.written)."""
        return publish.silver_expectations(self.spark, self.spec, self.settings, source, written)

    def check_unique_keys(self, source: str, spans: list[tuple[datetime, datetime]]) -> publish.CheckOutcome:
        """`spans`: the event times the step wrote (Published.touched); the check reads them +- the window."""
        return publish.unique_keys(self.spark, self.spec, self.settings, source, spans)

    def check_one_row_per_left_event(self, spans: list[tuple[datetime, datetime]]) -> publish.CheckOutcome:
        return publish.one_row_per_left_event(self.spark, self.spec, self.settings, spans)

    def check_clickhouse(self) -> publish.CheckOutcome:
        return publish.clickhouse_matches_delta(self.spec, self.settings)

    def check_topic(self, produced: ProduceResult) -> publish.CheckOutcome:
        return publish.topic_matches_delta(self.spec, self.settings, produced)

    # ----------------------------------------------------------- streaming runs
    def _start(self, load: bool) -> SinkLoader | None:
        """What every streaming run begins with: the Spark session and (unless `load` is off) the loader."""
        _ = self.spark
        return SinkLoader(self.spec, self.settings, self.log) if load and self.spec.clickhouse_sink else None

    @contextmanager
    def _gold_tables_beside(self) -> Iterator[None]:
        """A join pipeline's gold tables made while the body (its sources' ingest) runs; their
        error, if any, is raised after it (gold/joins.prepare_gold_tables)."""
        made = prepare_gold_tables(self.spark, self.spec, self.settings)
        try:
            yield
        finally:
            if made is not None:
                wait([made])  # no thread left making tables behind a failed ingest
        if made is not None:
            made.result()

    def _join(self, drain: bool) -> GoldResult | None:
        return run_gold(self.spark, self.spec, self.settings, drain=drain) if self.spec.is_join else None

    def run(self, load: bool = True, drain: bool = False) -> dict[str, Any]:
        """Ingest every source, run the join (join pipelines), load ClickHouse; returns the counts.

        The sources' queries run side by side. A source pipeline loads each batch into
        ClickHouse as soon as it has committed (SinkLoader); a join pipeline loads after its join.
        """
        spec, log = self.spec, self.log
        started = time.monotonic()
        resolve_bootstrap(spec, self.settings)  # no Kafka: say so before a Spark start-up
        loader = self._start(load)
        if loader is not None:
            loader.connect()  # opens while the queries start
        early_loads = loader is not None and not spec.is_join

        def on_batch(m: BatchMetrics) -> None:
            log(batch_line(spec, m))
            if early_loads and m.inserted:
                loader.load_soon()

        summary: dict[str, Any] = {"pipeline": spec.name}
        totals = dict.fromkeys([*COUNTED, "batches"], 0)
        stages: dict[str, float] = {}
        try:
            queries_started = time.time()
            with self._gold_tables_beside():
                results = ingest_sources(self.spark, spec, self.settings, list(spec.sources), on_batch, log=self.log)
            # Starting the streaming queries (checkpoint, the source's planning process, first
            # offsets) up to the first batch: a fixed cost per run, paid once by a continuous pipeline.
            first_batch = min((r.batches[0].started_at for r in results if r.batches), default=time.time())
            for result in results:
                for key in totals:
                    totals[key] += result.summary()[key]
                for stage, seconds in result.stage_seconds().items():
                    stages[stage] = round(stages.get(stage, 0.0) + seconds, 3)
                summary[f"silver_version_{result.source}"] = result.silver_version
            summary.update(totals)
            summary["stage_seconds"] = stages
            summary["query_startup_s"] = round(first_batch - queries_started, 3)
            # Each batch's own seconds, in order (several sources: theirs one after the other).
            summary["batch_seconds"] = [round(b.seconds, 3) for r in results for b in r.batches]
            gold = self._join(drain)
            if gold is not None:
                log(
                    f"join: {gold.processed:,} driving events closed, {gold.emitted:,} emitted "
                    f"({gold.matched:,} matched, {gold.unmatched_left:,} unmatched left), {gold.rejected:,} "
                    f"quarantined, {gold.pending:,} waiting for their window to close"
                )
                summary.update({f"join_{k}": v for k, v in gold.summary().items()})
            if loader is not None:
                sink_version = None if spec.is_join else summary[f"silver_version_{spec.sink_source_name}"]
                summary.update(loader.finish(up_to=sink_version))
            if load and spec.topic_sinks:
                summary.update(topic_summary(self.produce()))
        finally:
            if loader is not None:
                loader.close()
        summary["seconds"] = round(time.monotonic() - started, 3)
        return summary

    def continuous(
        self,
        stop: threading.Event,
        load: bool = True,
        observe: Callable[[BatchMetrics], None] | None = None,
    ) -> dict[str, Any]:
        """Keep every source's streaming query running (processing-time trigger) until `stop` is set.

        As soon as a batch lands, the join (non-draining) and the ClickHouse load run, so rows
        become visible about one batch after they reach Kafka. Stopping lets the batch
        in flight finish, then publishes what it wrote. The exactly-once machinery is the
        same as for triggered runs: a kill at any point is repaired by the next run.
        `observe`, if given, sees every batch's metrics (the benchmark's freshness profile).
        """
        spec, log = self.spec, self.log
        started = time.monotonic()
        resolve_bootstrap(spec, self.settings)
        # A bad setting fails before Spark starts.
        endpoint = metrics.ContinuousMetrics.from_env(spec, partial(pipeline_lag, spec, self.settings))
        loader = self._start(load)  # one connection for the session
        # One transactional producer per Kafka sink for the session (init_transactions once).
        topic_sinks = {s.topic: TopicSink(spec, s, self.settings, self.warn) for s in spec.topic_sinks} if load else {}
        interval = spec.orchestration.trigger_interval
        totals = dict.fromkeys([*COUNTED, "batches"], 0)
        counted = threading.Lock()
        batch_landed = threading.Event()

        def on_batch(m: BatchMetrics) -> None:
            with counted:
                totals["batches"] += 1
                for key in COUNTED:
                    totals[key] += getattr(m, key)
            batch_landed.set()
            if observe is not None:
                observe(m)
            if m.read:
                log(batch_line(spec, m))

        loaded = {"rows": 0, "topic_rows": 0}
        published = {"batches": -1}

        def publish_landed() -> None:
            with counted:
                batches = totals["batches"]
            if batches == published["batches"]:
                return
            published["batches"] = batches
            self._join(drain=False)
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
            for produced in produce_topics(spec, self.settings, self.warn, sinks=topic_sinks):
                if produced.rows:
                    loaded["topic_rows"] += produced.rows
                    log(
                        f"produced {produced.rows:,} rows to topic {produced.topic} (Delta version "
                        f"{produced.last_version}, {loaded['topic_rows']:,} this session) in {produced.seconds:.2f}s"
                    )

        streams = [prepare_stream(spec, self.settings, source, on_batch, log) for source in spec.sources]
        trigger = {"processingTime": f"{max(1, int(interval.total_seconds() * 1000))} milliseconds"}
        with ExitStack() as locks:
            for stream in streams:
                locks.enter_context(pipeline_lock(stream.checkpoint, spec.name))
                locks.callback(stream.close)
            if loader is not None:
                locks.callback(loader.close)  # before the locks are released
            for topic_sink in topic_sinks.values():
                locks.callback(topic_sink.close)
            endpoint.start(log)
            locks.callback(endpoint.stop)
            queries = start_queries(self.spark, streams, trigger)
            log(
                f"continuous: pipeline {spec.name} running ({len(queries)} queries, trigger every "
                f"{interval.total_seconds():g}s); Ctrl-C or SIGTERM stops after the current batch"
            )
            try:
                checked = time.monotonic()
                while not stop.wait(PUBLISH_POLL_S):
                    for stream in streams:
                        stream.collect_reports()  # sets batch_landed through on_batch
                    # Publish as soon as a batch lands (freshness), and check on the queries at
                    # least once per trigger interval either way.
                    if not batch_landed.is_set() and time.monotonic() - checked < interval.total_seconds():
                        continue
                    batch_landed.clear()
                    checked = time.monotonic()
                    for stream, query in zip(streams, queries, strict=True):
                        stream.collect_reports()
                        if not query.isActive:
                            raise stream.failure(query.exception() or PipelineError("the query stopped"))
                    publish_landed()
            finally:
                for stream, query in zip(streams, queries, strict=True):
                    stream.stop(query)
                log("continuous: stopping; the batch in flight finished")
            for stream, query in zip(streams, queries, strict=True):
                error = query.exception()
                if error is not None and not stream.stopped_cleanly(error):
                    raise stream.failure(error)
            published["batches"] = -1
            publish_landed()
        return {
            "pipeline": spec.name,
            "mode": "continuous",
            **totals,
            "clickhouse_rows_loaded": loaded["rows"],
            **({"topic_rows_produced": loaded["topic_rows"]} if topic_sinks else {}),
            "seconds": round(time.monotonic() - started, 3),
        }
