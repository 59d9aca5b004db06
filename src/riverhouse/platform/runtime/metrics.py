"""Prometheus metrics for operators: what a pipeline read, dropped, quarantined, loaded, and how far behind it is.

Two ways out, chosen by environment variables (docs/deployment.md):
- continuous mode serves them over HTTP while it runs: `RIVERHOUSE_METRICS_PORT` (and
  `RIVERHOUSE_METRICS_HOST`, default 127.0.0.1), scraped like any exporter;
- a triggered run (`riverhouse run`, a Dagster run launched by a sensor or schedule) lives
  too briefly to be scraped, so it pushes them to a Prometheus Pushgateway at
  `RIVERHOUSE_METRICS_PUSHGATEWAY` when its ingest ends and after each ClickHouse load, grouped
  by job `riverhouse` and the pipeline's name. A run is one process, so the pushed counters
  are that run's figures; the push time is `riverhouse_metrics_pushed_timestamp_seconds`.

The counters live in one registry per process, labelled by pipeline (and source), fed by
the batch hook every streaming query goes through (`observed`) and by every ClickHouse load.
A failed push or a failed lag lookup is logged, never fails the run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, push_to_gateway, start_http_server

if TYPE_CHECKING:
    from riverhouse.platform.ingest.writer import BatchMetrics
    from riverhouse.platform.kafka.lag import PipelineLag
    from riverhouse.platform.spec import PipelineSpec

PORT_ENV = "RIVERHOUSE_METRICS_PORT"
HOST_ENV = "RIVERHOUSE_METRICS_HOST"
PUSHGATEWAY_ENV = "RIVERHOUSE_METRICS_PUSHGATEWAY"
LAG_INTERVAL_ENV = "RIVERHOUSE_METRICS_LAG_INTERVAL"
PUSH_JOB = "riverhouse"

log = logging.getLogger("riverhouse.metrics")

# Batches take from tens of milliseconds (a few records) to minutes (a backlog at maxOffsetsPerTrigger).
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class MetricsError(RuntimeError):
    """A metrics setting is unusable (bad port...): the message names the variable."""


@dataclass(frozen=True)
class MetricsFamilies:
    records_read: Counter
    duplicates_dropped: Counter
    quarantined: Counter
    inserted: Counter
    replayed: Counter
    batches: Counter
    batch_duration: Histogram
    last_batch: Gauge
    load_duration: Histogram
    rows_loaded: Counter
    insert_errors: Counter
    last_loaded_version: Gauge
    kafka_lag: Gauge
    pushed_at: Gauge


def _families(registry: CollectorRegistry) -> MetricsFamilies:
    source = ["pipeline", "source"]
    return MetricsFamilies(
        records_read=Counter("riverhouse_records_read", "Kafka records read", source, registry=registry),
        duplicates_dropped=Counter(
            "riverhouse_duplicates_dropped",
            "Valid records dropped as duplicates within the window",
            source,
            registry=registry,
        ),
        quarantined=Counter(
            "riverhouse_quarantined", "Records sent to quarantine (malformed or invalid)", source, registry=registry
        ),
        inserted=Counter(
            "riverhouse_silver_inserted", "Records inserted into silver (new keys)", source, registry=registry
        ),
        replayed=Counter(
            "riverhouse_replayed", "Records of replayed batches that were already committed", source, registry=registry
        ),
        batches=Counter("riverhouse_batches", "Micro-batches committed", source, registry=registry),
        batch_duration=Histogram(
            "riverhouse_batch_duration_seconds",
            "Micro-batch wall time",
            source,
            buckets=DURATION_BUCKETS,
            registry=registry,
        ),
        last_batch=Gauge(
            "riverhouse_last_batch_timestamp_seconds",
            "When the last batch committed (Unix time)",
            source,
            registry=registry,
        ),
        load_duration=Histogram(
            "riverhouse_clickhouse_load_duration_seconds",
            "Wall time of a ClickHouse load (all new Delta versions)",
            ["pipeline"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        ),
        rows_loaded=Counter(
            "riverhouse_clickhouse_rows_loaded", "Rows inserted into ClickHouse", ["pipeline"], registry=registry
        ),
        insert_errors=Counter(
            "riverhouse_clickhouse_insert_errors",
            "ClickHouse loads that failed after their retries (the ledger did not advance)",
            ["pipeline"],
            registry=registry,
        ),
        last_loaded_version=Gauge(
            "riverhouse_last_loaded_delta_version",
            "Last Delta version loaded into ClickHouse (-1: none yet)",
            ["pipeline"],
            registry=registry,
        ),
        kafka_lag=Gauge(
            "riverhouse_kafka_lag_records",
            "Records in Kafka after the last committed batch",
            ["pipeline", "source", "topic", "partition"],
            registry=registry,
        ),
        pushed_at=Gauge(
            "riverhouse_metrics_pushed_timestamp_seconds",
            "When this run pushed its metrics",
            ["pipeline"],
            registry=registry,
        ),
    )


REGISTRY = CollectorRegistry(auto_describe=True)
FAMILIES = _families(REGISTRY)
_serving: dict[str, Any] = {}
_serving_lock = threading.Lock()


def observe_batch(pipeline: str, m: BatchMetrics) -> None:
    labels = (pipeline, m.source)
    f = FAMILIES
    f.records_read.labels(*labels).inc(m.read)
    f.duplicates_dropped.labels(*labels).inc(m.duplicates_dropped)
    f.quarantined.labels(*labels).inc(m.quarantined)
    f.inserted.labels(*labels).inc(m.inserted)
    f.replayed.labels(*labels).inc(m.replayed)
    f.batches.labels(*labels).inc()
    f.batch_duration.labels(*labels).observe(m.seconds)
    f.last_batch.labels(*labels).set(time.time())


def observed(pipeline: str, on_batch: Callable[[BatchMetrics], None] | None) -> Callable[[BatchMetrics], None]:
    """The batch hook with the metrics in front: every streaming query reports through it."""

    def hook(m: BatchMetrics) -> None:
        observe_batch(pipeline, m)
        if on_batch is not None:
            on_batch(m)

    return hook


def observe_load(pipeline: str, rows: int, seconds: float, last_loaded_version: int | None) -> None:
    FAMILIES.insert_errors.labels(pipeline)  # a zero series exists from the first load: alerts need no absent()
    FAMILIES.rows_loaded.labels(pipeline).inc(rows)
    FAMILIES.load_duration.labels(pipeline).observe(seconds)
    FAMILIES.last_loaded_version.labels(pipeline).set(-1 if last_loaded_version is None else last_loaded_version)


def observe_load_error(pipeline: str) -> None:
    FAMILIES.insert_errors.labels(pipeline).inc()


def refresh_lag(spec: PipelineSpec, lag_of: Callable[[], PipelineLag]) -> None:
    """Per-partition lag of every source, from `lag_of` (the caller's Kafka watermark lookup);
    logged, not raised, on failure."""
    try:
        lag = lag_of()
    except Exception as exc:
        log.warning("metrics: Kafka lag of pipeline %s not refreshed: %s", spec.name, exc)
        return
    for source in lag.sources:
        for partition, end in source.end.items():
            position = source.committed.get(partition)
            behind = end - position if position is not None else None
            if behind is None:
                continue  # never read: the sum in PipelineLag covers it, per partition it is unknown
            FAMILIES.kafka_lag.labels(spec.name, source.source, source.topic, partition).set(max(0, behind))


def push(spec: PipelineSpec, lag_of: Callable[[], PipelineLag]) -> bool:
    """Push this process's figures for the pipeline to $RIVERHOUSE_METRICS_PUSHGATEWAY, if set and not serving.

    `lag_of` gives the pipeline's Kafka lag (asked only when there is a gateway to push to).
    """
    gateway = os.environ.get(PUSHGATEWAY_ENV, "").strip()
    if not gateway or _serving:
        return False
    refresh_lag(spec, lag_of)
    FAMILIES.pushed_at.labels(spec.name).set(time.time())
    try:
        push_to_gateway(gateway, job=PUSH_JOB, registry=REGISTRY, grouping_key={"pipeline": spec.name}, timeout=10)
    except Exception as exc:  # a monitoring outage must not fail the data pipeline
        log.warning("metrics: push to %s failed: %s", gateway, exc)
        return False
    return True


def serve_port() -> int | None:
    raw = os.environ.get(PORT_ENV, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise MetricsError(f"{PORT_ENV} must be a port number (1-65535), got {raw!r}") from None
    if not 0 < port < 65536:
        raise MetricsError(f"{PORT_ENV} must be a port number (1-65535), got {raw!r}")
    return port


class ContinuousMetrics:
    """Continuous mode's endpoint (when RIVERHOUSE_METRICS_PORT is set) and its lag poller."""

    def __init__(
        self, spec: PipelineSpec, lag_of: Callable[[], PipelineLag], port: int | None, host: str, lag_interval_s: float
    ):
        self.spec = spec
        self.lag_of = lag_of
        self.port = port
        self.host = host
        self.lag_interval_s = lag_interval_s
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    @classmethod
    def from_env(cls, spec: PipelineSpec, lag_of: Callable[[], PipelineLag]) -> ContinuousMetrics:
        raw = os.environ.get(LAG_INTERVAL_ENV, "").strip() or "15"
        try:
            interval = float(raw)
        except ValueError:
            interval = -1.0
        if interval <= 0:
            raise MetricsError(f"{LAG_INTERVAL_ENV} must be a number of seconds above 0, got {raw!r}")
        return cls(spec, lag_of, serve_port(), os.environ.get(HOST_ENV, "") or "127.0.0.1", interval)

    def start(self, log_line: Callable[[str], None]) -> None:
        if self.port is None:
            return
        with _serving_lock:
            if "server" not in _serving:  # one endpoint per process, for every pipeline in it
                try:
                    server, thread = start_http_server(self.port, addr=self.host, registry=REGISTRY)
                except OSError as exc:
                    raise MetricsError(
                        f"cannot serve metrics on {self.host}:{self.port} ({PORT_ENV}): {exc.strerror or exc}"
                    ) from exc
                _serving.update(server=server, thread=thread, users=0)
            _serving["users"] += 1
        log_line(f"metrics: Prometheus endpoint on http://{self.host}:{self.port}/metrics")
        self._poller = threading.Thread(target=self._poll_lag, name="riverhouse-metrics-lag", daemon=True)
        self._poller.start()

    def _poll_lag(self) -> None:
        while True:
            refresh_lag(self.spec, self.lag_of)
            if self._stop.wait(self.lag_interval_s):
                return

    def stop(self) -> None:
        """Stop polling and close the endpoint (the last figures were scraped meanwhile)."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=30)
        if self.port is None:
            return
        with _serving_lock:
            _serving["users"] = _serving.get("users", 1) - 1
            if _serving["users"] > 0:
                return
            server = _serving.pop("server", None)
            _serving.clear()
        if server is not None:
            server.shutdown()
            server.server_close()
