"""`riverhouse bench`: every scenario in one run, against the same local Kafka and ClickHouse engine.

Each scenario verifies its own output against the generator's bookkeeping (a fast
wrong answer does not count: `exact` is false and the table says so) and records
its raw inputs. Results go to bench/results/<timestamp>.json and latest.json, and
docs/benchmarks.md (+ a PNG plot) is rendered from the latest result.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from riverhouse.bench_cpu import CpuMeter
from riverhouse.bench_report import render_docs, write_results
from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.kafka.generator import (
    GeneratorConfig,
    expected_join,
    orders,
    produce,
    user_events,
)
from riverhouse.platform.sink.clickhouse import create_table_sql, open_client, qualified_table, quote
from riverhouse.platform.spec import PipelineSpec, parse_spec
from riverhouse.platform.state.settings import Settings

if TYPE_CHECKING:
    from riverhouse.platform.ingest.stream import BatchMetrics

SCENARIOS = (
    "kafka_produce_limit",
    "kafka_read_limit",
    "clickhouse_insert_limit",
    "baseline_consumer",
    "riverhouse_dedup",
    "riverhouse_dedup_join",
    "freshness",
    "query_vs_final",
    "dedup_state",
    "scale_local",
)
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
    scenarios: tuple[str, ...] = SCENARIOS
    home: Path = Path(".riverhouse/bench")
    results_dir: Path = Path("bench/results")
    docs: Path = Path("docs/benchmarks.md")

    def problems(self) -> list[str]:
        """What this configuration cannot run, said before any work starts."""
        found = []
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            found.append(f"--partitions must be 1 to {MAX_PARTITIONS}, got {self.partitions}")
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

# Every consumer in the bench reads with the same librdkafka tuning as Riverhouse's source.
# `queued.min.messages` (default 100,000) caps librdkafka's prefetch: with the default a
# single consumer read this topic at ~190k records/s, with a deeper queue at ~900k/s.
READ_TUNING: dict[str, Any] = {"fetch.max.bytes": 50 * 1024 * 1024, "queued.min.messages": 1_000_000}


def machine_facts() -> dict[str, Any]:
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
        "chdb": chdb.__version__,
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


def _generated_orders(ids: Any, created_at: pa.Array | None = None) -> pa.Table:
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


def _orders_spec(name: str, topic: str) -> PipelineSpec:
    return parse_spec(
        {
            "name": name,
            "sources": {
                "orders": {
                    "topic": topic,
                    "fields": ORDER_FIELDS,
                    "key": ["order_id"],
                    "event_time": {"field": "created_at"},
                    "dedup": {"key": ["order_id"], "window": "1h"},
                }
            },
            "sink": {"table": name, "order_by": ["order_id"]},
            "quality": {"max_rejected_rate": 1.0},
        }
    )


def _join_spec(name: str, orders_topic: str, users_topic: str) -> PipelineSpec:
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


class Bench:
    def __init__(self, cfg: BenchConfig, log: Callable[[str], None] = print):
        self.cfg = cfg
        self.log = log
        self.home = cfg.home.resolve()
        if self.home.exists():
            local_kafka.stop(self.home / "kafka")
            shutil.rmtree(self.home)
        self.state = local_kafka.start(self.home / "kafka")
        self.settings = Settings.from_env(self.home).with_(kafka_bootstrap=self.state.bootstrap)
        self._spark: Any = None
        self.spark_startup_s: float | None = None

    @property
    def spark(self) -> Any:
        if self._spark is None:
            from riverhouse.platform.runtime.spark import get_spark

            started = time.monotonic()
            self._spark = get_spark(
                self.settings.spark_master, app_name="riverhouse-bench", conf=self.settings.spark_conf
            )
            self.spark_startup_s = time.monotonic() - started
        return self._spark

    def close(self) -> None:
        local_kafka.stop(self.home / "kafka")

    # -- data -------------------------------------------------------------------
    def _orders_config(self, count: int, seed: int) -> GeneratorConfig:
        return GeneratorConfig(
            count=count, duplicate_rate=self.cfg.duplicate_rate, malformed=0, seed=seed, users=max(10, count // 20)
        )

    def _produce(self, topic: str, records: Iterator[Any], rate: float | None = None) -> int:
        """Produce to a topic of `--partitions` partitions (created here when it does not exist)."""
        local_kafka.create_topic(self.state.bootstrap, topic, self.cfg.partitions)
        return produce(self.state.bootstrap, topic, records, rate=rate)

    def produce_orders(self, topic: str, count: int, seed: int = 1) -> Any:
        records, stats = orders(self._orders_config(count, seed))
        started = time.monotonic()
        acknowledged = self._produce(topic, records)
        seconds = time.monotonic() - started
        self.log(f"  produced {stats.messages:,} orders to {topic} in {seconds:.1f}s")
        self.produced = {"events": acknowledged, "seconds": seconds, "events_per_s": acknowledged / seconds}
        self.produced["exact"] = acknowledged == stats.messages
        return stats

    # -- scenarios --------------------------------------------------------------
    def kafka_read_limit(self, topic: str, messages: int) -> dict[str, Any]:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.state.bootstrap,
                "group.id": f"rl-{topic}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": 3,
                **READ_TUNING,
            }
        )
        started = time.monotonic()
        _assign_from_start(consumer, topic)
        seen = 0
        while seen < messages and time.monotonic() - started < 300:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is None:
                    seen += 1
        seconds = time.monotonic() - started
        consumer.close()
        return {"events": seen, "seconds": seconds, "events_per_s": seen / seconds, "exact": seen == messages}

    def clickhouse_insert_limit(self, rows: int) -> dict[str, Any]:
        table = _generated_orders(range(rows))
        batch = CLICKHOUSE_BATCH_ROWS
        with open_client(self.settings.clickhouse_dsn) as client:
            client.command("DROP TABLE IF EXISTS bench_insert_limit")
            client.command(
                "CREATE TABLE bench_insert_limit (order_id String, user_id String, amount Int32, "
                "price Float64, created_at DateTime64(6, 'UTC')) ENGINE = MergeTree ORDER BY order_id"
            )
            started = time.monotonic()
            for offset in range(0, rows, batch):
                client.insert_arrow("bench_insert_limit", table.slice(offset, batch))
            seconds = time.monotonic() - started
            count = client.query("SELECT count() FROM bench_insert_limit").result_rows[0][0]
        return {
            "events": rows,
            "seconds": seconds,
            "events_per_s": rows / seconds,
            "exact": count == rows,
            "batch_rows": batch,
        }

    def baseline_consumer(self, topic: str, messages: int, expected_unique: int) -> dict[str, Any]:
        """The yardstick: confluent-kafka -> json + set dedup -> batched inserts, commit after each insert."""
        from confluent_kafka import Consumer

        batch_rows = 50_000
        consumer = Consumer(
            {
                "bootstrap.servers": self.state.bootstrap,
                "group.id": f"baseline-{topic}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": 3,
                **READ_TUNING,
            }
        )
        seen_keys: set[str] = set()
        columns: dict[str, list[Any]] = {k: [] for k in ORDER_FIELDS}
        consumed = inserted = 0
        last: dict[int, Any] = {}  # partition -> last message consumed
        with open_client(self.settings.clickhouse_dsn) as client, CpuMeter() as cpu:
            client.command("DROP TABLE IF EXISTS bench_baseline")
            client.command(
                "CREATE TABLE bench_baseline (order_id String, user_id String, amount Int32, "
                "price Float64, created_at String) ENGINE = MergeTree ORDER BY order_id"
            )

            def flush() -> None:
                nonlocal inserted
                n = len(columns["order_id"])
                if n:
                    client.insert(
                        "bench_baseline", list(columns.values()), column_names=list(columns), column_oriented=True
                    )
                    inserted += n
                    for values in columns.values():
                        values.clear()
                if last:  # offsets after each insert: at-least-once
                    from confluent_kafka import TopicPartition

                    consumer.commit(
                        offsets=[TopicPartition(topic, p, m.offset() + 1) for p, m in last.items()], asynchronous=False
                    )

            started = time.monotonic()
            _assign_from_start(consumer, topic)
            while consumed < messages and time.monotonic() - started < 600:
                for msg in consumer.consume(10_000, timeout=1.0):
                    if msg.error() is not None:
                        continue
                    consumed += 1
                    last[msg.partition()] = msg
                    try:
                        event = json.loads(msg.value())
                    except ValueError:
                        continue
                    key = event.get("order_id")
                    if key is None or key in seen_keys:
                        continue
                    seen_keys.add(key)
                    for name in ORDER_FIELDS:
                        columns[name].append(event.get(name))
                if len(columns["order_id"]) >= batch_rows:
                    flush()
            flush()
            seconds = time.monotonic() - started
            rows = client.query("SELECT count(), uniqExact(order_id) FROM bench_baseline").result_rows[0]
        consumer.close()
        return {
            "events": consumed,
            "seconds": seconds,
            "events_per_s": consumed / seconds,
            "exact": tuple(rows) == (expected_unique, expected_unique) and consumed == messages,
            "rows": rows[0],
            "expected_unique": expected_unique,
            "batch_rows": batch_rows,
            "cpu": cpu.window(started, started + seconds),
        }

    def _dedup_run(self, name: str, topic: str, messages: int, expected_unique: int) -> dict[str, Any]:
        from riverhouse.platform.runner import run_once

        spec = _orders_spec(name, topic)
        spark = self.spark
        with CpuMeter() as cpu:
            started = time.monotonic()
            summary = run_once(spec, self.settings, spark=spark, log=lambda m: None)
            seconds = time.monotonic() - started
        with open_client(self.settings.clickhouse_dsn) as client:
            rows = client.query(f"SELECT count(), uniqExact(order_id) FROM {qualified_table(spec)}").result_rows[0]
        return {
            "events": summary["read"],
            "seconds": seconds,
            "query_startup_s": summary["query_startup_s"],
            "batches": summary["batches"],
            "stage_seconds": {**summary["stage_seconds"], "clickhouse_load": _load_seconds(summary)},
            "exact": tuple(rows) == (expected_unique, expected_unique) and summary["read"] == messages,
            "rows": rows[0],
            "expected_unique": expected_unique,
            "table": spec.sink.table,
            # From the first batch to every row in ClickHouse (the steady part of the run).
            "cpu": cpu.window(started + summary["query_startup_s"], started + seconds),
        }

    def scale_local(self, topic: str, messages: int, expected_unique: int) -> dict[str, Any]:
        """The same run (`riverhouse run`, a process each) with Spark on `local[1]` and on `local[2]`.

        The ratio of their times from the first batch to every row in ClickHouse says whether
        the work uses both cores (the executors read, parse, dedup and write; the driver plans).
        """
        import subprocess
        import sys

        import yaml

        out: dict[str, Any] = {"events": messages}
        for master in ("local[1]", "local[2]"):
            cores = master[6]
            name = f"bench_scale_{cores}"
            home = self.home / f"scale_{cores}"
            spec_file = home / "spec.yaml"
            home.mkdir(parents=True, exist_ok=True)
            spec_file.write_text(yaml.safe_dump(_orders_spec(name, topic).model_dump(mode="json", by_alias=True)))
            env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERHOUSE_")}
            env.update(
                RIVERHOUSE_HOME=str(home),
                RIVERHOUSE_KAFKA_BOOTSTRAP=self.state.bootstrap,
                RIVERHOUSE_SPARK_MASTER=master,
            )
            ran = subprocess.run(
                [sys.executable, "-m", "riverhouse.cli", "run", str(spec_file), "--json"],
                capture_output=True,
                text=True,
                env=env,
                timeout=3600,
            )
            if ran.returncode != 0:
                raise RuntimeError(f"{master}: {ran.stderr.strip()[-500:]}")
            summary = json.loads(ran.stdout)
            steady = summary["seconds"] - summary["query_startup_s"]
            out[master] = {
                "seconds": summary["seconds"],
                "steady_seconds": steady,
                "events_per_s": messages / steady,
                "inserted": summary["inserted"],
                "stage_seconds": summary["stage_seconds"],
            }
        out["ratio"] = out["local[1]"]["steady_seconds"] / out["local[2]"]["steady_seconds"]
        out["exact"] = all(out[m]["inserted"] == expected_unique for m in ("local[1]", "local[2]"))
        return out

    def riverhouse_dedup(self, topic: str, messages: int, expected_unique: int) -> dict[str, Any]:
        """A cold run (Spark session, query start, JVM warm-up) and steady runs of the same size.

        Steady state is what a running pipeline sustains: more pipelines, each on a fresh topic
        in the now warm process, each timed from its first batch to all rows visible in
        ClickHouse; the median run is reported (the JIT is still warming during the first ones).
        """
        self.spark  # noqa: B018 - start the session inside this scenario's time
        cold = self._dedup_run("bench_dedup", topic, messages, expected_unique)
        total = cold["seconds"] + (self.spark_startup_s or 0.0)
        runs = []
        for i in range(self.cfg.steady_runs):
            name = f"bench_dedup_steady_{i + 1}"
            stats = self.produce_orders(name, self.cfg.events, seed=2 + i)
            run = self._dedup_run(name, name, stats.messages, stats.unique)
            run["steady_seconds"] = run["seconds"] - run["query_startup_s"]
            runs.append(run)
        steady = _median_run(runs, "steady_seconds")
        steady_seconds = steady["steady_seconds"]
        return {
            "events": cold["events"],
            "seconds": total,
            "events_per_s": cold["events"] / total,
            "events_per_s_excluding_startup": steady["events"] / steady_seconds,
            "startup_s": (self.spark_startup_s or 0.0) + cold["query_startup_s"],
            "spark_session_s": self.spark_startup_s,
            "query_startup_s": cold["query_startup_s"],
            "batches": steady["batches"],
            "stage_seconds": steady["stage_seconds"],
            "steady": steady,
            "steady_runs_seconds": [round(r["steady_seconds"], 3) for r in runs],
            "exact": cold["exact"] and all(r["exact"] for r in runs),
            "rows": cold["rows"],
            "expected_unique": expected_unique,
            "table": cold["table"],
        }

    def _join_run(self, name: str, count: int, seed: int) -> dict[str, Any]:
        from riverhouse.platform.runner import run_once

        cfg = self._orders_config(count, seed)
        records, order_stats = orders(cfg)
        self._produce(f"{name}_orders", records)
        user_records, user_stats = user_events(replace(cfg, count=max(10, count // 10)))
        self._produce(f"{name}_users", user_records)
        spec = _join_spec(name, f"{name}_orders", f"{name}_users")
        reference = expected_join(order_stats, user_stats, spec.join.window)
        spark = self.spark
        with CpuMeter() as cpu:
            started = time.monotonic()
            summary = run_once(spec, self.settings, spark=spark, log=lambda m: None, drain=True)
            seconds = time.monotonic() - started
        with open_client(self.settings.clickhouse_dsn) as client:
            rows = client.query(
                f"SELECT count(), countIf(user_name IS NOT NULL) FROM {qualified_table(spec)}"
            ).result_rows[0]
        exact = (
            rows[0] == reference["expected_joined"] + reference["expected_unmatched"]
            and rows[1] == reference["expected_joined"]
        )
        return {
            "events": order_stats.messages + user_stats.messages,
            "seconds": seconds,
            "startup_s": summary["query_startup_s"],
            "work_seconds": seconds - summary["query_startup_s"],
            "join_seconds": summary.get("join_seconds"),
            "load_seconds": summary.get("load_seconds"),
            "stage_seconds": summary["stage_seconds"],
            "exact": exact,
            "rows": rows[0],
            "joined": rows[1],
            "expected_joined": reference["expected_joined"],
            "expected_unmatched": reference["expected_unmatched"],
            # The whole run: the two queries start side by side, then the join and the load.
            "cpu_whole_run": cpu.window(started, started + seconds),
        }

    def riverhouse_dedup_join(self, count: int) -> dict[str, Any]:
        """The first join pipeline in the process, then warm runs on fresh topics (median), as for dedup.

        The first run also pays for the first join in the JVM (operators loaded, code generated).
        """
        first = self._join_run("bench_join", count, seed=7)
        runs = [self._join_run(f"bench_join_steady_{i + 1}", count, seed=8 + i) for i in range(self.cfg.steady_runs)]
        steady = _median_run(runs, "work_seconds")
        return {
            "events": first["events"],
            "seconds": first["seconds"],
            "events_per_s": first["events"] / first["seconds"],
            "events_per_s_excluding_startup": steady["events"] / steady["work_seconds"],
            "first_excluding_startup": first["events"] / first["work_seconds"],
            "startup_s": first["startup_s"],
            "steady": steady,
            "steady_runs_seconds": [round(r["work_seconds"], 3) for r in runs],
            "exact": first["exact"] and all(r["exact"] for r in runs),
            "rows": first["rows"],
            "joined": first["joined"],
            "expected_joined": first["expected_joined"],
            "expected_unmatched": first["expected_unmatched"],
        }

    def freshness(self) -> dict[str, Any]:
        """Continuous mode with a producer at a fixed rate: produce -> visible in ClickHouse.

        The producer runs for `freshness_warmup` + `freshness_seconds` without a pause; the
        percentiles are over the rows produced after the warm-up (a pipeline that runs for
        days is warm), and the warm-up rows' own percentiles are reported beside them.
        """
        from riverhouse.platform.runner import run_continuous
        from riverhouse.platform.state.tables import TableLayout, read_inserts

        topic = "bench_fresh"
        spec = _orders_spec("bench_fresh", topic)
        rate, warmup = self.cfg.freshness_rate, self.cfg.freshness_warmup
        count = int(rate * (warmup + self.cfg.freshness_seconds))
        cfg = GeneratorConfig(count=count, duplicate_rate=0.0, malformed=0, seed=11, users=1000)
        self._produce(topic, iter([(b"warmup", b"{}")]))  # the topic exists before the query
        stop = threading.Event()
        visible: list[tuple[int, float]] = []  # (last silver version loaded, time it became visible)
        loads: list[float] = []  # seconds of each ClickHouse load
        batches: list[BatchMetrics] = []

        def on_log(line: str) -> None:
            if line.startswith("loaded ") and "Delta version" in line:
                version = int(line.split("Delta version ")[1].split(",")[0])
                visible.append((version, time.time()))
                loads.append(float(line.rsplit(" in ", 1)[1].rstrip("s")))

        spark = self.spark
        worker = threading.Thread(
            target=lambda: run_continuous(spec, self.settings, stop, log=on_log, spark=spark, observe=batches.append),
            daemon=True,
        )
        worker.start()
        deadline = time.monotonic() + 120
        while not batches and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.5)  # the query's start-up (its first batch: the one record above) is not freshness
        records, stats = orders(cfg)
        produced_at, producing = time.time(), time.monotonic()
        self._produce(topic, records, rate=rate)
        produce_seconds = time.time() - produced_at
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if visible and _silver_rows(self.settings, spec) >= stats.unique and visible[-1][1] > produced_at:
                time.sleep(3)
                break
            time.sleep(1)
        stop.set()
        worker.join(timeout=120)
        path = TableLayout(self.settings.warehouse, spec.name).silver("orders")
        measured: list[float] = []
        warming: list[float] = []
        previous = -1
        for version, seen_at in visible:  # one load makes versions previous+1 .. version visible
            rows = read_inserts(path, previous + 1, version, ["order_id", "_kafka_timestamp"])
            previous = version
            for ts in rows.column("_kafka_timestamp").to_pylist():
                sent = ts.timestamp()
                (warming if sent < produced_at + warmup else measured).append(seen_at - sent)
        with open_client(self.settings.clickhouse_dsn) as client:
            rows = client.query(f"SELECT uniqExact(order_id), count() FROM {qualified_table(spec)}").result_rows[0]
        steady = _percentiles(measured)
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
            "warmup_percentiles_s": _percentiles(warming),
            "exact": rows[0] == stats.unique and rows[1] == stats.unique,
            "trigger_interval_s": spec.orchestration.trigger_interval.total_seconds(),
            "profile": _freshness_profile(
                [b for b in batches if b.read and b.started_at >= producing + warmup],
                [took for (_, seen_at), took in zip(visible, loads, strict=True) if seen_at >= produced_at + warmup],
            ),
            "warmup_batches": [
                [b.read, round(b.seconds, 3)]
                for b in batches
                if b.read and producing - 1 <= b.started_at < producing + warmup
            ],
        }

    def query_vs_final(self, count: int, seed: int, clean_table: str) -> dict[str, Any]:
        """The raw events as Kafka carried them, in a ReplacingMergeTree (`FINAL`), vs Riverhouse's table.

        The ReplacingMergeTree gets every record produced to the topic (duplicates
        included), in produce order, in inserts of `RMT_INSERT_ROWS` as a Kafka sink
        would flush them, and is queried as a live table is: parts not merged yet.
        Each query's answer is checked against the generator's distinct events.
        """
        records, stats = orders(self._orders_config(count, seed))
        raw = [json.loads(value) for _, value in records if value]
        events = stats.events
        table = pa.table(
            {
                "order_id": [e["order_id"] for e in raw],
                "user_id": [e["user_id"] for e in raw],
                "amount": pa.array([int(e["amount"]) for e in raw], pa.int32()),
            }
        )
        by_user: dict[str, int] = {}
        for e in events:
            by_user[e["user_id"]] = by_user.get(e["user_id"], 0) + int(e["amount"])
        top_users = sorted(by_user.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        expected = {
            "count_sum_uniq": (len(events), sum(int(e["amount"]) for e in events), len(events)),
            "count": (len(events),),
            "sum_amount": (sum(int(e["amount"]) for e in events),),
            "top_users": tuple(top_users),
        }
        return self._versus_final(table, quote(clean_table), expected)

    def query_vs_final_at_scale(self, distinct: int) -> dict[str, Any]:
        """The same comparison on `distinct` generated orders (+10% duplicates), built in ClickHouse directly.

        Kafka's retention and the pipeline's run time keep the main scenario at the bench's
        event count; here the clean table is made with the DDL Riverhouse's loader uses,
        holding what the pipeline would leave in it (one row per order), so only the
        tables' size differs. Expected answers come from the generator's arrays.
        """
        import numpy as np

        rng = np.random.default_rng(distinct)
        ids = np.arange(distinct)
        raw_ids = np.concatenate([ids, rng.choice(ids, size=distinct // 10)])
        raw_ids = raw_ids[rng.permutation(len(raw_ids))]
        users = ids % 5000
        amounts = (ids % 10).astype("int64")

        totals = np.bincount(users, weights=amounts, minlength=5000).astype("int64")
        top = sorted(((f"u{u:06d}", int(t)) for u, t in enumerate(totals)), key=lambda kv: (-kv[1], kv[0]))[:10]
        total = int(amounts.sum())
        expected = {
            "count_sum_uniq": (distinct, total, distinct),
            "count": (distinct,),
            "sum_amount": (total,),
            "top_users": tuple(top),
        }
        spec = _orders_spec(f"bench_final_{distinct}", f"bench_final_{distinct}")
        clean = _generated_orders(ids)
        clean = clean.append_column("_event_date", pa.array([date(2026, 1, 1)] * distinct, pa.date32()))
        with open_client(self.settings.clickhouse_dsn) as client:
            client.command(f"DROP TABLE IF EXISTS {qualified_table(spec)}")
            client.command(create_table_sql(spec))
            for offset in range(0, distinct, CLICKHOUSE_BATCH_ROWS):
                client.insert_arrow(qualified_table(spec), clean.slice(offset, CLICKHOUSE_BATCH_ROWS))
        raw = _generated_orders(raw_ids).select(["order_id", "user_id", "amount"])
        result = self._versus_final(raw, qualified_table(spec), expected)
        result["generated"] = (
            "straight into ClickHouse (the clean table with the loader's DDL, one row per "
            "order): Kafka's retention cannot hold this many events"
        )
        return result

    def _versus_final(self, raw: pa.Table, clean_table: str, expected: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
        """`raw` into a ReplacingMergeTree in `RMT_INSERT_ROWS` inserts; FINAL_QUERIES on it and on `clean_table`."""
        with open_client(self.settings.clickhouse_dsn) as client:
            client.command("DROP TABLE IF EXISTS bench_rmt")
            client.command(
                "CREATE TABLE bench_rmt (order_id String, user_id String, amount Int32) "
                "ENGINE = ReplacingMergeTree ORDER BY order_id"
            )
            for offset in range(0, raw.num_rows, RMT_INSERT_ROWS):
                client.insert_arrow("bench_rmt", raw.slice(offset, RMT_INSERT_ROWS))
            parts = int(client.command("SELECT count() FROM system.parts WHERE active AND table = 'bench_rmt'"))

            def timed(sql: str, one_row: bool) -> tuple[float, tuple[Any, ...]]:
                times, answer = [], ()
                for _ in range(self.cfg.query_runs):
                    started = time.perf_counter()
                    rows = client.query(sql).result_rows
                    times.append(time.perf_counter() - started)
                    answer = tuple(rows[0]) if one_row else tuple(tuple(r) for r in rows)
                return statistics.median(times), answer

            queries: dict[str, Any] = {}
            for name, template in FINAL_QUERIES.items():
                one_row = name != "top_users"
                final_s, final_answer = timed(template.format(t="bench_rmt FINAL"), one_row)
                clean_s, clean_answer = timed(template.format(t=clean_table), one_row)
                want = expected[name]
                queries[name] = {
                    "sql": template.format(t="<table>"),
                    "final_s": round(final_s, 5),
                    "clean_s": round(clean_s, 5),
                    "speedup": round(final_s / clean_s, 3) if clean_s else None,
                    "final_exact": final_answer == want,
                    "clean_exact": clean_answer == want,
                }
            client.command("DROP TABLE IF EXISTS bench_rmt")
        main = queries["count_sum_uniq"]
        return {
            "events": raw.num_rows,
            "seconds": main["final_s"] + main["clean_s"],
            "events_per_s": None,
            "final_s": main["final_s"],
            "clean_s": main["clean_s"],
            "speedup": main["speedup"],
            "final_exact": main["final_exact"],
            "clean_exact": main["clean_exact"],
            "exact": all(q["final_exact"] and q["clean_exact"] for q in queries.values()),
            "runs": self.cfg.query_runs,
            "rmt_parts": parts,
            "rmt_insert_rows": RMT_INSERT_ROWS,
            "expected": list(expected["count_sum_uniq"]),
            "queries": queries,
        }

    def dedup_state(self, keys: int, batch_rows: int = 200_000) -> dict[str, Any]:
        """Memory and Delta size while deduplicating `keys` distinct keys, all inside one window.

        The local Kafka keeps ~5 MB per partition, far less than a million events, so the
        events are generated straight into the dedup stage (the same in-batch dedup and
        window-bounded insert-only MERGE the stream uses, in Spark, batch by batch, 10% duplicates).
        It runs in a process of its own, so its peak RSS (the kernel's high-water mark) is
        the dedup stage's alone, not the bench's idle Spark JVM's ups and downs.
        """
        import multiprocessing

        from riverhouse.platform.state.tables import TableLayout

        spec = _orders_spec(f"bench_state_{keys}", f"bench_state_{keys}")
        path = TableLayout(self.settings.warehouse, spec.name).silver("orders")
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        worker = context.Process(target=_dedup_state_process, args=(path, keys, batch_rows, results))
        worker.start()
        try:
            status, result = results.get(timeout=1800)
        finally:
            worker.join(timeout=60)
        if status != "ok":
            raise RuntimeError(result)
        return result

    # -- the run ----------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        chosen = set(cfg.scenarios)
        results: dict[str, Any] = {}

        def scenario(name: str, action: Callable[[], dict[str, Any]]) -> None:
            if name not in chosen:
                return
            self.log(f"{name} ...")
            try:
                results[name] = _clean(action())
            except Exception as exc:  # one broken scenario must not hide the others' figures
                results[name] = {"error": f"{type(exc).__name__}: {exc}", "exact": False}
            self.log(f"{name}: {_short(results[name])}")

        stats = self.produce_orders("bench_orders", cfg.events)
        messages = stats.messages
        # The broker's produce limit as one Python producer (lz4, acks=all) reaches it, generator included.
        scenario("kafka_produce_limit", lambda: dict(self.produced))
        scenario("kafka_read_limit", lambda: self.kafka_read_limit("bench_orders", messages))
        scenario("clickhouse_insert_limit", lambda: self.clickhouse_insert_limit(stats.unique))
        scenario("baseline_consumer", lambda: self.baseline_consumer("bench_orders", messages, stats.unique))
        scenario("riverhouse_dedup", lambda: self.riverhouse_dedup("bench_orders", messages, stats.unique))
        scenario("riverhouse_dedup_join", lambda: self.riverhouse_dedup_join(cfg.events // 2))
        scenario("query_vs_final", lambda: self.query_vs_final(cfg.events, 1, "bench_dedup"))
        if "query_vs_final" in chosen:
            for distinct in cfg.final_scale:
                chosen.add(f"query_vs_final_{distinct}")
                scenario(f"query_vs_final_{distinct}", lambda n=distinct: self.query_vs_final_at_scale(n))
        scenario("freshness", self.freshness)
        scenario("scale_local", lambda: self.scale_local("bench_orders", messages, stats.unique))
        if "dedup_state" in chosen:
            for keys in cfg.state_keys:
                name = "dedup_state" if keys == cfg.state_keys[0] else f"dedup_state_{keys}"
                chosen.add(name)
                scenario(name, lambda k=keys: self.dedup_state(k))
            _marginal_memory(results)
        return {
            "machine": machine_facts(),
            "config": {
                "events": cfg.events,
                "duplicate_rate": cfg.duplicate_rate,
                "partitions": cfg.partitions,
                "freshness_rate": cfg.freshness_rate,
                "freshness_seconds": cfg.freshness_seconds,
                "freshness_warmup": cfg.freshness_warmup,
                "state_keys": list(cfg.state_keys),
                "final_scale": list(cfg.final_scale),
                "spark_session_s": self.spark_startup_s,
            },
            "started_at": datetime.now(UTC).isoformat(),
            "scenarios": results,
        }


def _marginal_memory(results: dict[str, Any]) -> None:
    """RAM per additional key between the smallest and the largest dedup_state run (on the largest).

    Each run's peak includes a fixed working set (one batch, allocator pools); the slope
    between two key counts is what the state itself costs per key.
    """
    runs = sorted(
        (r for n, r in results.items() if n.startswith("dedup_state") and "keys" in r), key=lambda r: r["keys"]
    )
    if len(runs) >= 2 and runs[-1]["keys"] > runs[0]["keys"]:
        small, large = runs[0], runs[-1]
        large["marginal_bytes_per_key"] = round(
            (large["peak_rss_bytes"] - small["peak_rss_bytes"]) / (large["keys"] - small["keys"]), 2
        )
        large["marginal_from_keys"] = small["keys"]


def _dedup_state_process(path: str, keys: int, batch_rows: int, results: Any) -> None:
    try:
        results.put(("ok", measure_dedup_state(path, keys, batch_rows)))
    except Exception as exc:  # the parent reports it as the scenario's error
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def _own_memory(field: str) -> int:
    """VmRSS (now) or VmHWM (peak so far) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def measure_dedup_state(path: str, keys: int, batch_rows: int) -> dict[str, Any]:
    """The dedup stage over `keys` generated keys (10% duplicates) into the silver table at `path`."""
    from datetime import timedelta

    import numpy as np

    from riverhouse.platform.ingest.dedup import insert_new, lookup_days
    from riverhouse.platform.runtime.spark import get_spark
    from riverhouse.platform.state.tables import ensure_delta_table, silver_schema

    # The engine's own dedup stage: Spark's window functions + the insert-only MERGE. The
    # keys live in the JVM and in Delta, not in the driver's Python heap measured here.
    spark = get_spark()
    src = _orders_spec("bench_state", "bench_state").sources["orders"]
    schema = silver_schema(src)
    ensure_delta_table(spark, path, schema, ["_event_date"], cdf=True)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    window = src.dedup.window if src.dedup else timedelta(hours=1)
    span_us = int(window.total_seconds() * 1e6) // 2  # every key inside one window
    rng = np.random.default_rng(keys)
    baseline = _own_memory("VmRSS")  # Python, pyarrow, delta-rs loaded; no key yet
    started = time.monotonic()
    inserted = events = 0
    for batch_id, lo in enumerate(range(0, keys, batch_rows)):
        ids = np.arange(lo, min(keys, lo + batch_rows))
        dupes = rng.choice(ids, size=max(1, len(ids) // 10))
        all_ids = np.concatenate([ids, dupes])
        n = len(all_ids)
        times = pa.array(base.timestamp() * 1e6 + (all_ids * 7919) % span_us, pa.int64()).cast(
            pa.timestamp("us", tz="UTC")
        )
        orders = _generated_orders(all_ids, created_at=times)
        rows = pa.table(
            {
                **{name: orders.column(name) for name in orders.column_names},
                "_event_time": times,
                "_event_date": pa.array([base.date()] * n, pa.date32()),
                "_topic": pa.array(["bench_state"] * n),
                "_partition": pa.array(np.zeros(n, dtype="int32")),
                "_offset": pa.array(np.arange(events, events + n, dtype="int64")),
                "_kafka_timestamp": times,
                "_batch_id": pa.array(np.full(n, batch_id, dtype="int64")),
            }
        ).cast(schema)
        events += n
        days = lookup_days(base.date(), base.date(), window)
        outcome = insert_new(
            spark, path, spark.createDataFrame(rows), src.dedup_key, window, days, "bench-state", batch_id
        )
        inserted += outcome.inserted
    seconds = time.monotonic() - started
    peak = _own_memory("VmHWM")
    size = sum(f.stat().st_size for f in Path(path).rglob("*.parquet"))
    return {
        "events": events,
        "seconds": seconds,
        "events_per_s": events / seconds,
        "keys": keys,
        "peak_rss_bytes": peak,
        "baseline_rss_bytes": baseline,
        "bytes_per_key": (peak - baseline) / keys,
        "delta_bytes": size,
        "delta_bytes_per_key": size / keys,
        "batch_rows": batch_rows,
        "exact": inserted == keys,
        "generated": "straight into the dedup stage (Kafka retention cannot hold this many events)",
        "note": "the dedup state is the silver Delta table (looked up within the window), not memory; "
        "RSS is the dedup stage's own process (peak = the kernel's high-water mark)",
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    """p50/p95/p99 (nearest rank) of `values`; empty if there are none."""
    ordered = sorted(values)
    n = len(ordered)
    return {f"p{p}": round(ordered[min(n - 1, int(p / 100 * n))], 4) for p in (50, 95, 99)} if n else {}


def _freshness_profile(batches: list[BatchMetrics], loads: list[float]) -> dict[str, Any]:
    """What a row waits for in continuous mode: its batch (records, seconds, stages) and the load."""

    def spread(values: list[float]) -> dict[str, float] | None:
        return {**_percentiles(values), "max": round(max(values), 4)} if values else None

    stages = sorted({name for b in batches for name in b.stage_seconds})
    gaps = [b.started_at - (a.started_at + a.seconds) for a, b in pairwise(batches)]
    return {
        "batches": len(batches),
        "records": spread([float(b.read) for b in batches]),
        "batch_s": spread([b.seconds for b in batches]),
        "between_batches_s": spread(gaps),
        "stage_s": {name: spread([b.stage_seconds.get(name, 0.0) for b in batches]) for name in stages},
        "loads": len(loads),
        "load_s": spread(loads),
        "per_batch": [[b.read, round(b.seconds, 3), round(b.stage_seconds.get("read_parse", 0.0), 3)] for b in batches],
    }


def _median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run with the median `key` (the lower one of an even count)."""
    return sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2]


def _assign_from_start(consumer: Any, topic: str) -> None:
    """Read every partition from its beginning, without a consumer-group rebalance."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])


def _silver_rows(settings: Settings, spec: PipelineSpec) -> int:
    from riverhouse.platform.quality.checks import delta_row_count
    from riverhouse.platform.state.tables import TableLayout

    return delta_row_count(TableLayout(settings.warehouse, spec.name).silver("orders"))


def _load_seconds(summary: dict[str, Any]) -> float:
    return float(summary.get("load_seconds") or 0.0)


def _clean(result: dict[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()}


def _short(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"ERROR {result['error']}"
    parts = []
    for key in (
        "events",
        "seconds",
        "events_per_s",
        "events_per_s_excluding_startup",
        "p95_s",
        "speedup",
        "bytes_per_key",
        "exact",
    ):
        if result.get(key) is not None:
            value = result[key]
            parts.append(f"{key}={value:,.1f}" if isinstance(value, float) else f"{key}={value}")
    return ", ".join(parts)


def run_bench(cfg: BenchConfig, log: Callable[[str], None] = print) -> tuple[dict[str, Any], Path]:
    if problems := cfg.problems():
        raise ValueError("; ".join(problems))
    bench = Bench(cfg, log)
    try:
        result = bench.run()
    finally:
        bench.close()
    path = write_results(result, cfg.results_dir)
    render_docs(result, cfg.docs)
    return result, path
