"""The bench's run: one local Kafka broker and one ClickHouse engine for every scenario, in one process.

Each scenario verifies its own output against the generator's bookkeeping (a fast
wrong answer does not count: `exact` is false and the table says so) and records
its raw inputs. Results go to bench/results/<timestamp>.json and latest.json, and
docs/benchmarks.md (+ a PNG plot) is rendered from the latest result.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.kafka.generator import GeneratorConfig, orders, produce
from riverhouse.platform.state.settings import Settings
from riverhouse_bench import batches, cluster, final, freshness, jvm_profile, limits, pipelines, plain, state, triggered
from riverhouse_bench.common import BenchConfig, machine_facts
from riverhouse_bench.report import render_docs
from riverhouse_bench.results import write_results


class Bench:
    """The shared parts: the broker, the settings, the (lazily started) Spark session, producing orders."""

    def __init__(self, cfg: BenchConfig, log: Callable[[str], None] = print):
        self.cfg = cfg
        self.log = log
        self.home = cfg.home.resolve()
        if self.home.exists():
            local_kafka.stop(self.home / "kafka")
            shutil.rmtree(self.home)
        self.state = local_kafka.start(self.home / "kafka")
        self.settings = Settings.from_env(self.home).with_(kafka_bootstrap=self.state.bootstrap)
        # Spark's own metrics: its event log (stage and task times per job) is read back per run.
        self.spark_events = self.home / "spark-events"
        self._spark: Any = None
        self.spark_startup_s: float | None = None
        self.produced: dict[str, Any] = {}
        self._registry: Any = None

    def spark_conf(self, events_dir: Path | None = None) -> dict[str, str]:
        """The bench's session settings (the product's, and Spark's event log into `events_dir`)."""
        if self.settings.spark_remote:
            # A Spark Connect engine: the event log is a setting of its JVM (given at its start), not
            # of a session; Spark's stage tables stay empty unless the engine logs into spark-events.
            return dict(self.settings.spark_conf)
        events_dir = events_dir or self.spark_events
        events_dir.mkdir(parents=True, exist_ok=True)
        return {
            **self.settings.spark_conf,
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events_dir.as_uri(),
            "spark.eventLog.compress": "false",  # read back as JSON lines (Spark 4 compresses by default)
        }

    @property
    def spark_started(self) -> bool:
        """Whether this process's session exists already (its JVM has run work: not cold)."""
        return self._spark is not None

    @property
    def spark(self) -> Any:
        # In-process, like `riverhouse run` without an engine; with RIVERHOUSE_SPARK_REMOTE (or a
        # running engine of the bench's home) the product's session attaches to that engine.
        if self._spark is None:
            from riverhouse.platform.runtime.spark import get_spark

            conf = self.spark_conf()
            if "jvm_profile" in self.cfg.scenarios and not self.settings.spark_remote:
                # Java Flight Recorder from the JVM's start: started later by jcmd, it doubled the
                # JVM's CPU (its JIT included) for the recorded run; running from the start it did not.
                conf.update(jvm_profile.recorder_conf(self.home / "profile"))
            started = time.monotonic()
            self._spark = get_spark(self.settings.spark_master, app_name="riverhouse-bench", conf=conf)
            self.spark_startup_s = time.monotonic() - started
        return self._spark

    @property
    def registry(self) -> str:
        """The local schema registry's API (started on first use): Avro scenarios produce through it."""
        if self._registry is None:
            from riverhouse.platform.avro import local_registry

            self._registry = local_registry.start(self.home / "registry")
        return str(self._registry.api)

    def close(self) -> None:
        local_kafka.stop(self.home / "kafka")
        if self._registry is not None:
            from riverhouse.platform.avro import local_registry

            local_registry.stop(self.home / "registry")

    # -- data -------------------------------------------------------------------
    def orders_config(self, count: int, seed: int) -> GeneratorConfig:
        return GeneratorConfig(
            count=count, duplicate_rate=self.cfg.duplicate_rate, malformed=0, seed=seed, users=max(10, count // 20)
        )

    def produce(self, topic: str, records: Iterator[Any], rate: float | None = None) -> int:
        """Produce to a topic of `--partitions` partitions (created here when it does not exist)."""
        local_kafka.create_topic(self.state.bootstrap, topic, self.cfg.partitions)
        return produce(self.state.bootstrap, topic, records, rate=rate)

    def produce_orders(self, topic: str, count: int, seed: int = 1, avro: bool = False) -> Any:
        records, stats = orders(self.orders_config(count, seed))
        if avro:  # the same orders in the Confluent wire format, the schema registered under <topic>-value
            from riverhouse.platform.avro.produce import SCHEMAS, as_avro, register

            schema = SCHEMAS["orders"]
            records = as_avro(records, schema, register(self.registry, f"{topic}-value", schema))
        started = time.monotonic()
        acknowledged = self.produce(topic, records)
        seconds = time.monotonic() - started
        self.log(f"  produced {stats.messages:,} orders to {topic} in {seconds:.1f}s")
        self.produced = {"events": acknowledged, "seconds": seconds, "events_per_s": acknowledged / seconds}
        self.produced["exact"] = acknowledged == stats.messages
        return stats

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
        scenario("kafka_read_limit", lambda: limits.kafka_read_limit(self, "bench_orders", messages))
        scenario("clickhouse_insert_limit", lambda: limits.clickhouse_insert_limit(self, stats.unique))
        scenario("baseline_consumer", lambda: limits.baseline_consumer(self, "bench_orders", messages, stats.unique))
        # With both chosen, the plain job's warm runs alternate with Riverhouse's steady runs.
        plain_runs = plain.WarmRuns(self, "bench_orders", messages, stats.unique)
        beside = plain_runs.run_one if "spark_plain" in chosen else None
        scenario(
            "riverhouse_dedup",
            lambda: pipelines.riverhouse_dedup(self, "bench_orders", messages, stats.unique, beside=beside),
        )
        scenario("riverhouse_dedup_avro", lambda: pipelines.riverhouse_dedup_avro(self))
        scenario("spark_plain", lambda: plain.spark_plain(self, "bench_orders", messages, stats.unique, plain_runs))
        scenario("small_batches", lambda: batches.small_batches(self))
        scenario("riverhouse_dedup_join", lambda: pipelines.riverhouse_dedup_join(self, cfg.events // 2))
        scenario("query_vs_final", lambda: final.query_vs_final(self, cfg.events, 1, "bench_dedup"))
        if "query_vs_final" in chosen:
            for distinct in cfg.final_scale:
                chosen.add(f"query_vs_final_{distinct}")
                scenario(f"query_vs_final_{distinct}", lambda n=distinct: final.query_vs_final_at_scale(self, n))
        scenario("freshness", lambda: freshness.freshness(self))
        scenario("scale_local", lambda: pipelines.scale_local(self, "bench_orders", messages, stats.unique))
        scenario("cluster", lambda: cluster.cluster(self, "bench_orders", messages, stats.unique))
        scenario("topic_sink", lambda: _topic_sink(self))
        if "dedup_state" in chosen:
            for keys in cfg.state_keys:
                name = "dedup_state" if keys == cfg.state_keys[0] else f"dedup_state_{keys}"
                chosen.add(name)
                scenario(name, lambda k=keys: state.dedup_state(self, k))
            state.marginal_memory(results)
        scenario("triggered_start", lambda: triggered.triggered_start(self))
        # Last: the engine's JVM is as warm as the run can make it.
        scenario("jvm_profile", lambda: jvm_profile.profile_dedup(self))
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
                "small_batches": cfg.small_batches,
                "small_batch_records": cfg.small_batch_records,
                "triggered_runs": cfg.triggered_runs,
                "triggered_cold_runs": cfg.triggered_cold_runs,
                "triggered_events": cfg.triggered_events,
                "spark_session_s": self.spark_startup_s,
            },
            "started_at": datetime.now(UTC).isoformat(),
            "scenarios": results,
        }


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
        "median_batch_s",
        "p95_batch_s",
        "speedup",
        "ratio",
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


def _topic_sink(bench: Bench) -> dict[str, Any]:
    """The Kafka sink next to the ClickHouse loader (bench/riverhouse_bench/topic_sink.py), on riverhouse_dedup's silver."""
    from riverhouse_bench.topic_sink import topic_sink

    return topic_sink(bench)
