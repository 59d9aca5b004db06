"""Riverhouse's own runs: dedup and dedup + join (cold, then warm), local[1] vs local[2], a standalone cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from riverhouse.platform.kafka.generator import expected_join, orders, user_events
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse_bench.common import join_spec, median_run, orders_spec
from riverhouse_bench.jvm_profile import jit_cpu_s, jit_used
from riverhouse_bench.metering import CpuMeter
from riverhouse_bench.spark_metrics import commit_history, read_events, stage_times

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench


def _dedup_run(
    bench: Bench, name: str, topic: str, messages: int, expected_unique: int, avro: bool = False
) -> dict[str, Any]:
    from riverhouse.platform.pipeline import Pipeline
    from riverhouse.platform.state.tables import TableLayout

    spec = orders_spec(name, topic, registry=bench.registry if avro else None)
    spark = bench.spark
    jit_before = jit_cpu_s()
    with CpuMeter() as cpu:
        started, began_at = time.monotonic(), time.time()
        summary = Pipeline(spec, bench.settings, spark=spark, log=lambda m: None).run()
        seconds = time.monotonic() - started
    jit = jit_used(jit_before)
    with open_client(bench.settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT count(), uniqExact(order_id) FROM {qualified_table(spec)}").result_rows[0]
    silver = TableLayout(bench.settings.warehouse, spec.name).silver("orders")
    first_batch_at = began_at + summary["query_startup_s"]
    return {
        "events": summary["read"],
        "seconds": seconds,
        "query_startup_s": summary["query_startup_s"],
        "batches": summary["batches"],
        "stage_seconds": {**summary["stage_seconds"], "clickhouse_load": float(summary.get("load_seconds") or 0.0)},
        "exact": tuple(rows) == (expected_unique, expected_unique) and summary["read"] == messages,
        "rows": rows[0],
        "expected_unique": expected_unique,
        "table": spec.sink.table,
        "jit_cpu_s": jit,
        # From the first batch to every row in ClickHouse (the steady part of the run).
        "cpu": cpu.window(started + summary["query_startup_s"], started + seconds),
        # Spark's own account of the same stretch, and silver's commits (a fresh table: all are this run's).
        "spark_stages": stage_times(read_events(bench.spark_events), first_batch_at, began_at + seconds),
        "silver_commits": commit_history(silver),
    }


def cli_run(
    bench: Bench, name: str, topic: str, master: str, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """`riverhouse run --json` of a dedup pipeline in a process of its own, on Spark `master`.

    Its Spark event log goes to <home>/spark-events (spark-defaults.conf in its own
    SPARK_CONF_DIR), so the page can say where its time went.
    """
    import yaml

    home = bench.home / name
    conf_dir, events = home / "spark-conf", home / "spark-events"
    for folder in (conf_dir, events):
        folder.mkdir(parents=True, exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir {events.as_uri()}\nspark.eventLog.compress false\n"
        + "".join(f"{k} {v}\n" for k, v in (extra_env or {}).items() if k.startswith("spark."))
    )
    spec_file = home / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(orders_spec(name, topic).model_dump(mode="json", by_alias=True)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERHOUSE_")}
    env.update(
        RIVERHOUSE_HOME=str(home),
        RIVERHOUSE_KAFKA_BOOTSTRAP=bench.state.bootstrap,
        RIVERHOUSE_SPARK_MASTER=master,
        SPARK_CONF_DIR=str(conf_dir),
        **{k: v for k, v in (extra_env or {}).items() if not k.startswith("spark.")},
    )
    began_at = time.time()
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
    return {
        "seconds": summary["seconds"],
        "steady_seconds": steady,
        "events_per_s": summary["read"] / steady if steady > 0 else None,
        "read": summary["read"],
        "inserted": summary["inserted"],
        "stage_seconds": summary["stage_seconds"],
        "spark_stages": stage_times(read_events(events), began_at + summary["query_startup_s"]),
    }


def scale_local(bench: Bench, topic: str, messages: int, expected_unique: int) -> dict[str, Any]:
    """The same run (`riverhouse run`, a process each) with Spark on `local[1]` and on `local[2]`.

    The ratio of their times from the first batch to every row in ClickHouse says whether
    the work uses both cores (the executors read, parse, dedup and write; the driver plans).
    """
    out: dict[str, Any] = {"events": messages}
    for master in ("local[1]", "local[2]"):
        out[master] = cli_run(bench, f"bench_scale_{master[6]}", topic, master)
    out["ratio"] = out["local[1]"]["steady_seconds"] / out["local[2]"]["steady_seconds"]
    out["exact"] = all(
        out[m]["inserted"] == expected_unique and out[m]["read"] == messages for m in ("local[1]", "local[2]")
    )
    return out


def riverhouse_dedup_avro(bench: Bench) -> dict[str, Any]:
    """riverhouse_dedup on the same orders as Avro (Confluent wire format, the local schema registry):
    the decoding's cost beside JSON's parse, in the same run and the same warm process."""
    stats = bench.produce_orders("bench_orders_avro", bench.cfg.events, avro=True)
    out = riverhouse_dedup(bench, "bench_orders_avro", stats.messages, stats.unique, avro=True)
    out["registry"] = bench.registry
    return out


def riverhouse_dedup(
    bench: Bench,
    topic: str,
    messages: int,
    expected_unique: int,
    avro: bool = False,
    beside: Callable[[bool], None] | None = None,
) -> dict[str, Any]:
    """A cold run (Spark session, query start, JVM warm-up) and steady runs of the same size.

    Steady state is what a running pipeline sustains: more pipelines, each on a fresh topic
    in the now warm process, each timed from its first batch to all rows visible in
    ClickHouse; the median run is reported (the JIT is still warming during the first ones).
    `beside`: a run of another job made once per warm-up and steady run, before it in even rounds
    and after it in odd ones (spark_plain's, so both jobs meet the JVM at the same age); it is
    given whether this round is measured.
    """
    bench.spark  # noqa: B018 - start the session inside this scenario's time
    prefix = "bench_dedup_avro" if avro else "bench_dedup"
    cold = _dedup_run(bench, prefix, topic, messages, expected_unique, avro)
    # The Avro runs come after the JSON ones, in the same (warm) process: no session start-up of their own.
    total = cold["seconds"] + (0.0 if avro else bench.spark_startup_s or 0.0)

    def series(kind: str, count: int, seed: int, measured: bool) -> list[dict[str, Any]]:
        runs = []
        for i in range(count):
            name = f"{prefix}_{kind}_{i + 1}"
            stats = bench.produce_orders(name, bench.cfg.events, seed=seed + i, avro=avro)
            if beside is not None and i % 2 == 0:
                beside(measured)
            run = _dedup_run(bench, name, name, stats.messages, stats.unique, avro)
            run["steady_seconds"] = run["seconds"] - run["query_startup_s"]
            runs.append(run)
            if beside is not None and i % 2 == 1:
                beside(measured)
        return runs

    # Warm-up runs first, unmeasured: the JIT compiles through the first several warm runs (its
    # threads used 4-5 CPU s in the first, ~1-2 s from the sixth on: bench/analysis.md). Their
    # times are kept in the JSON beside the steady ones.
    warmup = series("warmup", bench.cfg.warmup_runs, 100, measured=False)
    runs = series("steady", bench.cfg.steady_runs, 2, measured=True)
    steady = median_run(runs, "steady_seconds")
    steady_seconds = steady["steady_seconds"]
    return {
        "events": cold["events"],
        "seconds": total,
        "events_per_s": cold["events"] / total,
        "events_per_s_excluding_startup": steady["events"] / steady_seconds,
        "startup_s": (bench.spark_startup_s or 0.0) + cold["query_startup_s"],
        "spark_session_s": bench.spark_startup_s,
        "query_startup_s": cold["query_startup_s"],
        "batches": steady["batches"],
        "stage_seconds": steady["stage_seconds"],
        "steady": steady,
        "steady_runs_seconds": [round(r["steady_seconds"], 3) for r in runs],
        "warmup_runs_seconds": [round(r["steady_seconds"], 3) for r in warmup],
        "jit_cpu_s": {"warmup": [r["jit_cpu_s"] for r in warmup], "steady": [r["jit_cpu_s"] for r in runs]},
        "exact": cold["exact"] and all(r["exact"] for r in [*warmup, *runs]),
        "rows": cold["rows"],
        "expected_unique": expected_unique,
        "table": cold["table"],
    }


def _join_run(bench: Bench, name: str, count: int, seed: int) -> dict[str, Any]:
    from riverhouse.platform.pipeline import Pipeline

    cfg = bench.orders_config(count, seed)
    records, order_stats = orders(cfg)
    bench.produce(f"{name}_orders", records)
    user_records, user_stats = user_events(replace(cfg, count=max(10, count // 10)))
    bench.produce(f"{name}_users", user_records)
    spec = join_spec(name, f"{name}_orders", f"{name}_users")
    reference = expected_join(order_stats, user_stats, spec.join.window)
    spark = bench.spark
    jit_before = jit_cpu_s()
    with CpuMeter() as cpu:
        started = time.monotonic()
        summary = Pipeline(spec, bench.settings, spark=spark, log=lambda m: None).run(drain=True)
        seconds = time.monotonic() - started
    jit = jit_used(jit_before)
    with open_client(bench.settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT count(), countIf(user_name IS NOT NULL) FROM {qualified_table(spec)}").result_rows[
            0
        ]
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
        "jit_cpu_s": jit,
        # The whole run: the two queries start side by side, then the join and the load.
        "cpu_whole_run": cpu.window(started, started + seconds),
    }


def riverhouse_dedup_join(bench: Bench, count: int) -> dict[str, Any]:
    """The first join pipeline in the process, then warm runs on fresh topics (median), as for dedup.

    The first run also pays for the first join in the JVM (operators loaded, code generated).
    """
    first = _join_run(bench, "bench_join", count, seed=7)
    # Unmeasured warm-up runs, as for riverhouse_dedup: the join's own code (gold) warms up too.
    warmup = [_join_run(bench, f"bench_join_warmup_{i + 1}", count, seed=100 + i) for i in range(bench.cfg.warmup_runs)]
    runs = [_join_run(bench, f"bench_join_steady_{i + 1}", count, seed=8 + i) for i in range(bench.cfg.steady_runs)]
    steady = median_run(runs, "work_seconds")
    return {
        "events": first["events"],
        "seconds": first["seconds"],
        "events_per_s": first["events"] / first["seconds"],
        "events_per_s_excluding_startup": steady["events"] / steady["work_seconds"],
        "first_excluding_startup": first["events"] / first["work_seconds"],
        "startup_s": first["startup_s"],
        "steady": steady,
        "steady_runs_seconds": [round(r["work_seconds"], 3) for r in runs],
        "warmup_runs_seconds": [round(r["work_seconds"], 3) for r in warmup],
        "jit_cpu_s": {"warmup": [r["jit_cpu_s"] for r in warmup], "steady": [r["jit_cpu_s"] for r in runs]},
        "exact": first["exact"] and all(r["exact"] for r in [*warmup, *runs]),
        "rows": first["rows"],
        "joined": first["joined"],
        "expected_joined": first["expected_joined"],
        "expected_unmatched": first["expected_unmatched"],
    }
