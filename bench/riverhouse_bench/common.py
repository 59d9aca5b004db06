"""What every scenario shares: the bench's configuration, its pipeline specs, generated data, machine facts."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from riverhouse.platform.spec import PipelineSpec, parse_spec

# The repository this package sits in: results and the page are written there by default.
REPO = Path(__file__).resolve().parents[2]

SCENARIOS = (
    "kafka_produce_limit",
    "kafka_read_limit",
    "clickhouse_insert_limit",
    "baseline_consumer",
    "riverhouse_dedup",
    "spark_plain",
    "small_batches",
    "riverhouse_dedup_join",
    "freshness",
    "query_vs_final",
    "topic_sink",  # after riverhouse_dedup: it publishes that run's silver table again
    "dedup_state",
    "scale_local",
    "cluster",
    "triggered_start",
)
# Run only when asked for (`--profile`, or by name in --scenarios): JFR on the engine's JVM;
# riverhouse_dedup on Avro records through the local schema registry (`--format avro`).
OPTIONAL_SCENARIOS = ("jvm_profile", "riverhouse_dedup_avro")
ORDER_FIELDS = {
    "order_id": "string",
    "user_id": "string",
    "amount": "int",
    "price": "double",
    "created_at": "timestamp",
}


# The bench's topics are created with this many partitions at most (`--partitions`).
MAX_PARTITIONS = 32


@dataclass
class BenchConfig:
    events: int = 2_000_000  # distinct orders per throughput scenario
    duplicate_rate: float = 0.10
    partitions: int = 8  # partitions of every topic the bench creates, 1 to MAX_PARTITIONS
    freshness_rate: float = 20_000.0
    freshness_seconds: float = 60.0  # measured, after the warm-up
    freshness_warmup: float = 15.0  # seconds of traffic at the rate before the measured period
    state_keys: tuple[int, ...] = (1_000_000, 10_000_000)
    final_scale: tuple[int, ...] = (2_000_000,)  # query_vs_final again on this many generated orders
    query_runs: int = 5
    # Warm runs per throughput scenario; the median is the steady state. Five, not three: the
    # JVM's JIT is still compiling during the first two or three warm runs (the third was the
    # fastest in every 3-run bench), and a running pipeline is past that.
    steady_runs: int = 5
    # Unmeasured warm runs before the steady ones (riverhouse_dedup with spark_plain beside it, and
    # the join): the JVM's JIT compiled for 4-5 CPU s in the first warm dedup run and still 2-4 s
    # in the next four; from the sixth on ~1-2 s (bench/analysis.md). A running pipeline is past that.
    warmup_runs: int = 5
    # small_batches (issue 25): this many batches of this many records through Pipeline.run.
    small_batches: int = 20
    small_batch_records: int = 7_000
    # triggered_start (issue 26): Dagster runs of `triggered_events` new records each, with
    # the engine warm (measured) and without one (cold).
    triggered_runs: int = 10
    triggered_cold_runs: int = 2
    triggered_events: int = 7_000
    scenarios: tuple[str, ...] = SCENARIOS
    home: Path = Path(".riverhouse/bench")
    results_dir: Path = REPO / "bench" / "results"
    docs: Path = REPO / "docs" / "benchmarks.md"

    def problems(self) -> list[str]:
        """What this configuration cannot run, said before any work starts."""
        found = []
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            found.append(f"--partitions must be 1 to {MAX_PARTITIONS}, got {self.partitions}")
        if self.small_batches < 2 or self.small_batch_records < 100:
            found.append("small_batches needs at least 2 batches of at least 100 records")
        if self.triggered_runs < 1 or self.triggered_cold_runs < 0 or self.triggered_events < 1:
            found.append("triggered_start needs at least one warm run of at least one record")
        return found


# A Kafka sink (Kafka engine, Kafka Connect) flushes a block every so many rows: one part each.
RMT_INSERT_ROWS = 50_000
CLICKHOUSE_BATCH_ROWS = 100_000  # prebuilt Arrow batches: the sink's limit, and bulk-built tables
# query_vs_final: the query first; the others are what dashboards ask of such a table.
FINAL_QUERIES = {
    "count_sum_uniq": "SELECT count(), sum(amount), uniqExact(order_id) FROM {t}",
    "count": "SELECT count() FROM {t}",
    "sum_amount": "SELECT sum(amount) FROM {t}",
    "top_users": "SELECT user_id, sum(amount) AS total FROM {t} GROUP BY user_id ORDER BY total DESC, user_id LIMIT 10",
}

# Every librdkafka consumer of the bench (the read limit, the baseline) reads with this prefetch.
# `queued.min.messages` (default 100,000) caps librdkafka's prefetch: with the default a
# single consumer read this topic at ~190k records/s, with a deeper queue at ~900k/s.
READ_TUNING: dict[str, Any] = {"fetch.max.bytes": 50 * 1024 * 1024, "queued.min.messages": 1_000_000}


def machine_facts() -> dict[str, Any]:
    from importlib.metadata import version

    import chdb
    import confluent_kafka
    import deltalake
    import pyspark

    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "ram_bytes": mem_kib * 1024,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "deltalake": deltalake.__version__,
        # The package users install (`chdb.__version__` became its core's), and its ClickHouse engine.
        "chdb": f"{version('chdb')} (ClickHouse {getattr(chdb, 'engine_version', '?')})",
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka": f"Apache Kafka {_broker_version()} (local broker, KRaft, one node)",
        "calibration": calibrate(),
    }


def _broker_version() -> str:
    from riverhouse.platform.runtime.jars import jars_root

    for jar in (jars_root() / "broker").glob("kafka_2.13-*.jar"):
        return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")
    return "?"


def calibrate() -> dict[str, float]:
    """Seconds for fixed pieces of work, so runs on differently fast machines can be compared.

    Shared machines of one kind differ (and vary by the hour): the ratios of one run are
    fair, absolute events/s are only comparable between runs with similar calibration.
    """
    import numpy as np

    def best_of(action: Callable[[], object], runs: int = 3) -> float:
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            action()
            times.append(time.perf_counter() - started)
        return round(min(times), 4)

    def python_loop() -> int:
        total = 0
        for i in range(2_000_000):
            total += i
        return total

    keys = pa.array(np.random.default_rng(0).integers(0, 10**12, 1_000_000).astype(str))
    return {"python_loop_2m_s": best_of(python_loop), "arrow_sort_1m_strings_s": best_of(lambda: keys.sort())}


def generated_orders(ids: Any, created_at: pa.Array | None = None) -> pa.Table:
    """Orders built from integer ids without Kafka: id i is order `o-<i>`, user i % 5000, amount i % 10."""
    import numpy as np

    ids = np.asarray(ids)
    if created_at is None:
        created_at = pa.array([datetime(2026, 1, 1, tzinfo=UTC)] * len(ids), pa.timestamp("us", tz="UTC"))
    return pa.table(
        {
            "order_id": pa.array([f"o-{i:010d}" for i in ids]),
            "user_id": pa.array([f"u{i % 5000:06d}" for i in ids]),
            "amount": pa.array((ids % 10).astype("int32")),
            "price": pa.array((ids % 1000) / 10.0),
            "created_at": created_at,
        }
    )


def orders_spec(
    name: str, topic: str, max_offsets_per_trigger: int | None = None, registry: str | None = None
) -> PipelineSpec:
    """The bench's dedup pipeline; `max_offsets_per_trigger` bounds its batches (default: the spec's);
    `registry`: its records are Avro through that schema registry (the generator's orders schema)."""
    from riverhouse.platform.avro.produce import SCHEMAS

    kafka = {} if max_offsets_per_trigger is None else {"kafka": {"max_offsets_per_trigger": max_offsets_per_trigger}}
    avro = (
        {}
        if registry is None
        else {"format": "avro", "schema_registry": {"url": registry}, "avro_schema": SCHEMAS["orders"]}
    )
    return parse_spec(
        {
            "name": name,
            **kafka,
            "sources": {
                "orders": {
                    "topic": topic,
                    "fields": ORDER_FIELDS,
                    "key": ["order_id"],
                    "event_time": {"field": "created_at"},
                    "dedup": {"key": ["order_id"], "window": "1h"},
                    **avro,
                }
            },
            "sink": {"table": name, "order_by": ["order_id"]},
            "quality": {"max_rejected_rate": 1.0},
        }
    )


def join_spec(name: str, orders_topic: str, users_topic: str) -> PipelineSpec:
    user_fields = {
        "event_id": "string",
        "user_id": "string",
        "name": "string",
        "email": "string",
        "created_at": "timestamp",
    }
    return parse_spec(
        {
            "name": name,
            "sources": {
                "orders": {
                    "topic": orders_topic,
                    "fields": ORDER_FIELDS,
                    "key": ["order_id"],
                    "event_time": {"field": "created_at"},
                    "dedup": {"window": "1h"},
                },
                "users": {
                    "topic": users_topic,
                    "fields": user_fields,
                    "key": ["event_id"],
                    "event_time": {"field": "created_at"},
                    "dedup": {"window": "1h"},
                },
            },
            "join": {
                "type": "left",
                "left": "orders",
                "right": "users",
                "on": ["user_id"],
                "window": "1h",
                "select": {
                    "order_id": "orders.order_id",
                    "user_id": "orders.user_id",
                    "user_name": "users.name",
                    "amount": "orders.amount",
                },
            },
            "sink": {"table": name, "order_by": ["order_id"]},
        }
    )


def median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run with the median `key` (the lower one of an even count)."""
    return sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2]


def assign_from_start(consumer: Any, topic: str) -> None:
    """Read every partition from its beginning, without a consumer-group rebalance."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])
