"""spark_plain: the plain Spark job Riverhouse is compared with (issue 25), in the same run.

The job the Spark documentation shows, and nothing of Riverhouse's: `readStream.format("kafka")`
-> `from_json` (the bench's order fields) -> `dropDuplicates(order_id)` inside `foreachBatch` ->
one delta-spark append per batch, `trigger(availableNow=True)`, the same `maxOffsetsPerTrigger`
as the riverhouse_dedup pipeline, on the same topic. It drops duplicates within a batch only
(no window, no state, no exactly-once marker): it is the floor, not an equivalent product.
It reads Kafka with the client settings Riverhouse changes for speed (`SPEED_OPTIONS`,
kafka/client.py: `fetch.max.wait.ms`, with whose Java default every task waited 0.5 s, and
`max.poll.records`, with whose default every task fetched each 1 MB of records again and again),
so the ratio measures the work Riverhouse adds, not a client setting: with Java's default wait
this job ran 28,000 events/s warm where it runs 48,000 with it (110,000 events, bench/analysis.md).

Warm runs use the bench's own session (the same settings as riverhouse_dedup's); the cold run
is a process of its own (`python -m riverhouse_bench.plain`) with a new JVM and the same
settings, since the bench's JVM is warm by then. Timings come from the query's own progress
reports (`recentProgress`: each trigger's start and duration), which Spark gives in-process
and through Spark Connect alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverhouse.platform.kafka.client import SPEED_OPTIONS
from riverhouse_bench.common import ORDER_FIELDS, median_run, orders_spec
from riverhouse_bench.jvm_profile import jit_cpu_s, jit_used
from riverhouse_bench.metering import CpuMeter
from riverhouse_bench.spark_metrics import read_events, stage_times

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench

# ORDER_FIELDS' types as Spark SQL types, for the plain job's `from_json` schema.
SQL_TYPES = {"string": "STRING", "int": "INT", "long": "BIGINT", "double": "DOUBLE", "timestamp": "TIMESTAMP"}


def plain_schema() -> str:
    """The plain job's `from_json` schema (DDL): the bench's order fields with their own types."""
    return ", ".join(f"{name} {SQL_TYPES[kind]}" for name, kind in ORDER_FIELDS.items())


def progress_figures(progress: list[dict[str, Any]], started_at: float, ended_at: float) -> dict[str, Any]:
    """A query's progress reports -> its start-up, its batches and its time from the first batch to the end.

    `started_at`/`ended_at`: epoch seconds when `start()` was called and the query ended.
    A report's `timestamp` is when its trigger began; triggers that read nothing are not batches.
    """
    batches = [p for p in progress if int(p.get("numInputRows") or 0) > 0]
    if not batches:
        return {"read": 0, "batches": 0, "query_startup_s": None, "steady_seconds": None, "batch_s": []}
    first = min(_epoch(p["timestamp"]) for p in batches)
    return {
        "read": sum(int(p["numInputRows"]) for p in batches),
        "batches": len(batches),
        "query_startup_s": round(first - started_at, 3),
        "steady_seconds": round(ended_at - first, 3),
        "first_batch_at": first,
        "batch_s": [round(float((p.get("durationMs") or {}).get("triggerExecution", 0)) / 1000, 3) for p in batches],
    }


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def run_plain_job(spark: Any, bootstrap: str, topic: str, folder: Path, max_offsets: int) -> dict[str, Any]:
    """The plain job over `topic` from its beginning into a new Delta table under `folder`."""
    from pyspark.sql import functions as F

    table, checkpoint = str(folder / "table"), str(folder / "checkpoint")
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets)
        .options(**SPEED_OPTIONS)
        .load()
    )
    orders = stream.select(F.from_json(F.col("value").cast("string"), plain_schema()).alias("o")).select("o.*")

    def append(batch: Any, batch_id: int) -> None:
        batch.dropDuplicates(["order_id"]).write.format("delta").mode("append").save(table)

    started_at = time.time()
    query = orders.writeStream.foreachBatch(append).trigger(availableNow=True)
    query = query.option("checkpointLocation", checkpoint).start()
    query.awaitTermination()
    ended_at = time.time()
    progress = [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in query.recentProgress]
    return {**progress_figures(progress, started_at, ended_at), "seconds": round(ended_at - started_at, 3)}


def table_keys(folder: Path) -> tuple[int, int]:
    """(rows, distinct order ids) of the plain job's table, read with delta-rs (not through Spark)."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    ids = DeltaTable(str(folder / "table")).to_pyarrow_table(columns=["order_id"])["order_id"]
    return len(ids), int(pc.count_distinct(ids).as_py())


def _checked(run: dict[str, Any], folder: Path, messages: int, expected_unique: int) -> dict[str, Any]:
    rows, distinct = table_keys(folder)
    # Duplicates whose copies fell into different batches stay (the job dedups within a batch).
    return {**run, "rows": rows, "distinct": distinct, "exact": run["read"] == messages and distinct == expected_unique}


def _cold(bench: Bench, topic: str, max_offsets: int) -> dict[str, Any]:
    """The plain job in a process of its own: a new JVM and session with the bench's settings."""
    folder = bench.home / "spark_plain_cold"
    args = {
        "bootstrap": bench.state.bootstrap,
        "topic": topic,
        "folder": str(folder),
        "max_offsets": max_offsets,
        "master": bench.settings.spark_master,
        # A plain Spark application runs its own session: no engine, whatever the bench attaches to.
        "conf": {k: v for k, v in bench.spark_conf(folder / "spark-events").items() if k != "spark.remote"},
    }
    # The bench folder on the path however this process found it (make bench, riverhouse bench, bench/).
    path = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p)
    ran = subprocess.run(
        [sys.executable, "-m", "riverhouse_bench.plain", json.dumps(args)],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != "RIVERHOUSE_SPARK_REMOTE"}, "PYTHONPATH": path},
        timeout=3600,
    )
    if ran.returncode != 0:
        raise RuntimeError(f"the cold plain job failed: {ran.stderr.strip()[-800:]}")
    return json.loads(ran.stdout.strip().splitlines()[-1])


def _warm(bench: Bench, topic: str, name: str, max_offsets: int) -> dict[str, Any]:
    folder = bench.home / name
    began_at = time.time()
    jit_before = jit_cpu_s()
    with CpuMeter() as cpu:
        started = time.monotonic()
        run = run_plain_job(bench.spark, bench.state.bootstrap, topic, folder, max_offsets)
    run["jit_cpu_s"] = jit_used(jit_before)
    if run["batches"]:
        first = started + run["query_startup_s"]
        run["cpu"] = cpu.window(first, started + run["seconds"])
        run["spark_stages"] = stage_times(
            read_events(bench.spark_events), run["first_batch_at"], began_at + run["seconds"]
        )
    return run


class WarmRuns:
    """spark_plain's warm runs in the bench's session, one at a time: the bench alternates them with
    riverhouse_dedup's steady runs, so both jobs meet the JVM at the same age (its JIT keeps
    compiling through both jobs' first runs: bench/analysis.md)."""

    def __init__(self, bench: Bench, topic: str, messages: int, expected_unique: int) -> None:
        self.bench, self.topic = bench, topic
        self.messages, self.expected_unique = messages, expected_unique
        self.max_offsets = orders_spec("bench_dedup", topic).kafka.max_offsets_per_trigger
        self.runs: list[dict[str, Any]] = []
        self.warmup: list[dict[str, Any]] = []

    def run_one(self, measured: bool = True) -> None:
        """A warm run; kept among the steady runs when `measured` (else a warm-up, checked only)."""
        bench = self.bench
        if not bench.spark_started:  # a first run in a new JVM is not warm: run one unmeasured
            _warm(bench, self.topic, "spark_plain_warmup", self.max_offsets)
        name = f"spark_plain_{'steady' if measured else 'warmup'}_{len(self.runs) + len(self.warmup) + 1}"
        run = _checked(
            _warm(bench, self.topic, name, self.max_offsets), bench.home / name, self.messages, self.expected_unique
        )
        (self.runs if measured else self.warmup).append(run)


def spark_plain(
    bench: Bench, topic: str, messages: int, expected_unique: int, warm: WarmRuns | None = None
) -> dict[str, Any]:
    """The plain job cold (its own process) and warm (the bench's session, median of the steady
    runs); `warm`: the steady runs already made (alternated with riverhouse_dedup's), topped up."""
    warm = warm or WarmRuns(bench, topic, messages, expected_unique)
    max_offsets = warm.max_offsets
    cold = _checked(_cold(bench, topic, max_offsets), bench.home / "spark_plain_cold", messages, expected_unique)
    if not warm.runs:  # not alternated with riverhouse_dedup's runs: warm up on its own first
        while len(warm.warmup) < bench.cfg.warmup_runs:
            warm.run_one(measured=False)
    while len(warm.runs) < bench.cfg.steady_runs:
        warm.run_one()
    runs = warm.runs
    steady = median_run(runs, "steady_seconds")
    cold_total = cold["session_s"] + cold["seconds"]
    return {
        "events": cold["read"],
        "seconds": cold_total,
        "events_per_s": cold["read"] / cold_total,
        "events_per_s_excluding_startup": steady["read"] / steady["steady_seconds"],
        "startup_s": cold["session_s"] + cold["query_startup_s"],
        "spark_session_s": cold["session_s"],
        "query_startup_s": cold["query_startup_s"],
        "max_offsets_per_trigger": max_offsets,
        "batches": steady["batches"],
        "cold": cold,
        "steady": {**steady, "events": steady["read"]},
        "steady_runs_seconds": [r["steady_seconds"] for r in runs],
        "warmup_runs_seconds": [r["steady_seconds"] for r in warm.warmup],
        "jit_cpu_s": {
            "warmup": [r.get("jit_cpu_s") for r in warm.warmup],
            "steady": [r.get("jit_cpu_s") for r in runs],
        },
        "exact": cold["exact"] and all(r["exact"] for r in [*warm.warmup, *runs]),
        "rows": steady["rows"],
        "expected_unique": expected_unique,
    }


def main() -> None:
    """The cold run's process: start a session with the given settings, run the job, print JSON."""
    parser = argparse.ArgumentParser(description="spark_plain's cold run (used by the bench)")
    parser.add_argument("args", help="JSON: bootstrap, topic, folder, max_offsets, master, conf")
    args = json.loads(parser.parse_args().args)
    from riverhouse.platform.runtime.spark import get_spark

    started = time.monotonic()
    spark = get_spark(args["master"], app_name="riverhouse-bench-plain", conf=args["conf"])
    session_s = time.monotonic() - started
    run = run_plain_job(spark, args["bootstrap"], args["topic"], Path(args["folder"]), int(args["max_offsets"]))
    print(json.dumps({**run, "session_s": round(session_s, 3)}))


if __name__ == "__main__":
    main()
