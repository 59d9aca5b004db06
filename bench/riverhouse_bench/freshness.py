"""Freshness: continuous mode with a producer at a fixed rate, produce -> visible in ClickHouse."""

from __future__ import annotations

import threading
import time
from itertools import pairwise
from statistics import fmean
from typing import TYPE_CHECKING, Any

from riverhouse.platform.kafka.generator import GeneratorConfig, orders
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.settings import Settings
from riverhouse_bench.common import orders_spec

if TYPE_CHECKING:
    from riverhouse.platform.ingest.writer import BatchMetrics
    from riverhouse_bench.harness import Bench


def freshness(bench: Bench) -> dict[str, Any]:
    """Continuous mode with a producer at a fixed rate: produce -> visible in ClickHouse.

    The producer runs for `freshness_warmup` + `freshness_seconds` without a pause; the
    percentiles are over the rows produced after the warm-up (a pipeline that runs for
    days is warm), and the warm-up rows' own percentiles are reported beside them.
    """
    from riverhouse.platform.pipeline import Pipeline
    from riverhouse.platform.state.tables import TableLayout, read_inserts

    topic = "bench_fresh"
    spec = orders_spec("bench_fresh", topic)
    rate, warmup = bench.cfg.freshness_rate, bench.cfg.freshness_warmup
    count = int(rate * (warmup + bench.cfg.freshness_seconds))
    cfg = GeneratorConfig(count=count, duplicate_rate=0.0, malformed=0, seed=11, users=1000)
    bench.produce(topic, iter([(b"warmup", b"{}")]))  # the topic exists before the query
    stop = threading.Event()
    visible: list[tuple[int, float]] = []  # (last silver version loaded, time it became visible)
    loads: list[float] = []  # seconds of each ClickHouse load
    batches: list[BatchMetrics] = []

    def on_log(line: str) -> None:
        if line.startswith("loaded ") and "Delta version" in line:
            version = int(line.split("Delta version ")[1].split(",")[0])
            visible.append((version, time.time()))
            loads.append(float(line.rsplit(" in ", 1)[1].rstrip("s")))

    spark = bench.spark
    worker = threading.Thread(
        target=lambda: Pipeline(spec, bench.settings, spark=spark, log=on_log).continuous(stop, observe=batches.append),
        daemon=True,
    )
    worker.start()
    deadline = time.monotonic() + 120
    while not batches and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.5)  # the query's start-up (its first batch: the one record above) is not freshness
    records, stats = orders(cfg)
    produced_at = producing = time.time()  # batches report wall-clock start times
    bench.produce(topic, records, rate=rate)
    produce_seconds = time.time() - produced_at
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if visible and _silver_rows(bench.settings, spec) >= stats.unique and visible[-1][1] > produced_at:
            time.sleep(3)
            break
        time.sleep(1)
    stop.set()
    worker.join(timeout=120)
    path = TableLayout(bench.settings.warehouse, spec.name).silver("orders")
    measured: list[float] = []
    warming: list[float] = []
    previous = -1
    for version, seen_at in visible:  # one load makes versions previous+1 .. version visible
        rows = read_inserts(path, previous + 1, version, ["order_id", "_kafka_timestamp"])
        previous = version
        for ts in rows.column("_kafka_timestamp").to_pylist():
            sent = ts.timestamp()
            (warming if sent < produced_at + warmup else measured).append(seen_at - sent)
    with open_client(bench.settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT uniqExact(order_id), count() FROM {qualified_table(spec)}").result_rows[0]
    steady = percentiles(measured)
    return {
        "events": stats.messages,
        "seconds": produce_seconds,
        "events_per_s": stats.messages / produce_seconds,
        "rate": rate,
        "p50_s": steady.get("p50"),
        "p95_s": steady.get("p95"),
        "p99_s": steady.get("p99"),
        "measured_rows": len(measured),
        "warmup_s": warmup,
        "warmup_rows": len(warming),
        "warmup_percentiles_s": percentiles(warming),
        "exact": rows[0] == stats.unique and rows[1] == stats.unique,
        "trigger_interval_s": spec.orchestration.trigger_interval.total_seconds(),
        "profile": freshness_profile(
            [b for b in batches if b.read and b.started_at >= producing + warmup],
            [took for (_, seen_at), took in zip(visible, loads, strict=True) if seen_at >= produced_at + warmup],
        ),
        "warmup_batches": [
            [b.read, round(b.seconds, 3)]
            for b in batches
            if b.read and producing - 1 <= b.started_at < producing + warmup
        ],
    }


# The measured batches' last quarter this much larger than their first: the producer outran the pipeline.
FELL_BEHIND = 1.5


def fell_behind(profile: dict[str, Any]) -> tuple[int, int] | None:
    """The first and last quarters' mean records per batch, when the backlog grew over the measured stretch."""
    first, last = profile.get("records_first_last_quarter") or (0, 0)
    return (first, last) if first and last > FELL_BEHIND * first else None


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p95/p99 (nearest rank) of `values`; empty if there are none."""
    ordered = sorted(values)
    n = len(ordered)
    return {f"p{p}": round(ordered[min(n - 1, int(p / 100 * n))], 4) for p in (50, 95, 99)} if n else {}


def freshness_profile(batches: list[BatchMetrics], loads: list[float]) -> dict[str, Any]:
    """What a row waits for in continuous mode: its batch (records, seconds, stages) and the load."""

    def spread(values: list[float]) -> dict[str, float] | None:
        return {**percentiles(values), "max": round(max(values), 4)} if values else None

    stages = sorted({name for b in batches for name in b.stage_seconds})
    gaps = [b.started_at - (a.started_at + a.seconds) for a, b in pairwise(batches)]
    reads = [float(b.read) for b in batches]
    quarter = max(1, len(reads) // 4)
    return {
        "batches": len(batches),
        "records": spread(reads),
        # Batches that keep up with the producer stay the same size; a pipeline that falls behind
        # reads a growing backlog, and its rows' freshness is that backlog's age (FELL_BEHIND).
        "records_first_last_quarter": [round(fmean(reads[:quarter])), round(fmean(reads[-quarter:]))]
        if reads
        else None,
        "batch_s": spread([b.seconds for b in batches]),
        "between_batches_s": spread(gaps),
        "stage_s": {name: spread([b.stage_seconds.get(name, 0.0) for b in batches]) for name in stages},
        "loads": len(loads),
        "load_s": spread(loads),
        "per_batch": [[b.read, round(b.seconds, 3), round(b.stage_seconds.get("bronze", 0.0), 3)] for b in batches],
    }


def _silver_rows(settings: Settings, spec: PipelineSpec) -> int:
    from riverhouse.platform.quality.checks import delta_row_count
    from riverhouse.platform.state.tables import TableLayout

    return delta_row_count(TableLayout(settings.warehouse, spec.name).silver("orders"))


def _load_seconds(summary: dict[str, Any]) -> float:
    return float(summary.get("load_seconds") or 0.0)
