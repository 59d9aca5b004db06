"""dedup_state: what N keys in the dedup window cost, measured where the state lives (silver + the silver step).

The dedup state is the silver Delta table: each batch's silver step anti-joins the batch with
silver's files of the days within a window of the batch. So the figures are (1) silver's bytes
on disk per key and (2) the memory of the JVM that runs the step (Spark's driver and executor:
one JVM in local mode) while it takes one batch against a silver holding N keys, over N.

The silver table is built by Spark in one process (N keys in one day, so every batch's
anti-join reads all of them). A second, fresh process then starts Spark, warms the step up on a
small table of its own (classes loaded, code generated), collects garbage, takes the
JVM's resident memory and live heap as the baseline, resets the kernel's peak-RSS mark,
and runs one batch (`batch_rows` events: 10% duplicates of stored keys, 90% new) through
the engine's own silver step (ingest/dedup.insert_new: each key's first row, the anti-join,
the append). Peak RSS minus the baseline, over N, is the figure checked against the target;
the heap the step left live after a GC is reported beside it.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverhouse.platform.state.tables import TableLayout
from riverhouse_bench.common import orders_spec

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench

BASE = datetime(2026, 1, 1, tzinfo=UTC)
WARMUP_KEYS = 10_000


def dedup_state(bench: Bench, keys: int, batch_rows: int = 200_000) -> dict[str, Any]:
    """Build a silver of `keys` keys, then measure one batch's silver step against it in a fresh JVM.

    The batch is at most ten times the stored keys (a tenth of it repeats stored keys, each a
    different one), so a small key count measures a small batch.
    """
    batch_rows = min(batch_rows, 10 * keys)
    spec = orders_spec(f"bench_state_{keys}", f"bench_state_{keys}")
    silver = TableLayout(bench.settings.warehouse, spec.name).silver("orders")
    warmup = TableLayout(bench.settings.warehouse, f"{spec.name}_warmup").silver("orders")
    master, conf = bench.settings.spark_master, dict(bench.settings.spark_conf)
    started = time.monotonic()
    built = _in_own_process(build_silver, silver, keys, master, conf)
    build_s = time.monotonic() - started
    measured = _in_own_process(measure_silver_step, silver, warmup, keys, batch_rows, master, conf)
    size = sum(f.stat().st_size for f in Path(silver).rglob("*.parquet"))
    return {
        **measured,
        "keys": keys,
        "events": keys + measured["batch_events"],
        "seconds": build_s + measured["silver_step_s"],
        "events_per_s": None,
        "build_s": round(build_s, 3),
        "build_files": built["files"],
        "delta_bytes": size,
        "delta_bytes_per_key": size / keys,
        "generated": "silver built by Spark from generated keys (Kafka retention cannot hold this many events)",
    }


def _in_own_process(target: Any, *args: Any) -> dict[str, Any]:
    """Run `target(*args)` in a spawned process (its own Spark JVM); its result or its error."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    worker = context.Process(target=_report, args=(results, target, *args))
    worker.start()
    try:
        status, result = results.get(timeout=3600)
    finally:
        worker.join(timeout=120)
    if status != "ok":
        raise RuntimeError(result)
    return result


def _report(results: Any, target: Any, *args: Any) -> None:
    try:
        results.put(("ok", target(*args)))
    except Exception as exc:  # the parent reports it as the scenario's error
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def _silver_rows(spark: Any, ids: Any, batch_id: int, offset_base: int = 0) -> Any:
    """Silver rows for the integer ids of a DataFrame column `id`: order `o-<id>`, all on BASE's day, one window."""
    from pyspark.sql import functions as F

    from riverhouse.platform.state.tables import silver_schema, spark_schema

    src = orders_spec("bench_state", "bench_state").sources["orders"]
    span_us = int(timedelta(minutes=30) / timedelta(microseconds=1))  # every key inside one 1 h window
    base_us = int(BASE.timestamp() * 1_000_000)
    event_time = F.timestamp_micros(F.lit(base_us) + (F.col("id") * 7919) % span_us)
    columns = {
        "order_id": F.format_string("o-%010d", F.col("id")),
        "user_id": F.format_string("u%06d", F.col("id") % 5000),
        "amount": (F.col("id") % 10).cast("int"),
        "price": (F.col("id") % 1000) / 10.0,
        "created_at": event_time,
        "_event_time": event_time,
        "_event_date": F.lit(BASE.date()),
        "_topic": F.lit("bench_state"),
        "_partition": F.lit(0),
        "_offset": F.col("id") + offset_base,
        "_kafka_timestamp": event_time,
        "_batch_id": F.lit(batch_id),
    }
    schema = spark_schema(silver_schema(src))
    return ids.select(*[columns[f.name].cast(f.dataType).alias(f.name) for f in schema.fields])


def _session(master: str, conf: dict[str, str]) -> Any:
    from riverhouse.platform.runtime.spark import get_spark

    return get_spark(master, app_name="riverhouse-bench-state", conf=conf)


def build_silver(path: str, keys: int, master: str, conf: dict[str, str]) -> dict[str, Any]:
    """Silver holding `keys` distinct orders (one day), written by delta-spark like the stream's appends."""
    from riverhouse.platform.state.tables import ensure_delta_table, silver_properties, silver_schema

    spark = _session(master, conf)
    src = orders_spec("bench_state", "bench_state").sources["orders"]
    ensure_delta_table(spark, path, silver_schema(src), ["_event_date"], silver_properties(src))
    # Files of ~1M rows, as compaction leaves a day after many batches.
    rows = _silver_rows(spark, spark.range(0, keys, numPartitions=max(1, keys // 1_000_000)), batch_id=0)
    rows.write.format("delta").mode("append").save(path)
    files = len(spark.read.format("delta").load(path).inputFiles())
    spark.stop()
    return {"files": files}


def _jvm_pid(spark: Any) -> int:
    return int(spark._jvm.java.lang.ProcessHandle.current().pid())


def _status(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (peak since start or the last reset) of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def _live_heap(spark: Any) -> int:
    """The JVM's heap in use right after a full GC: what it keeps, not what it has yet to collect."""
    runtime = spark._jvm.java.lang.Runtime.getRuntime()
    spark._jvm.java.lang.System.gc()
    return int(runtime.totalMemory() - runtime.freeMemory())


def _step_settings() -> tuple[Any, timedelta, tuple[datetime, datetime]]:
    """The bench source, its dedup window, and the event-time bounds of a batch on BASE."""
    src = orders_spec("bench_state", "bench_state").sources["orders"]
    window = src.dedup.window if src.dedup else timedelta(hours=1)
    return src, window, (BASE - window, BASE + window)


def _silver_step(spark: Any, path: str, keys: int, batch_rows: int, batch_id: int) -> Any:
    """One batch through the engine's dedup: 10% duplicates of stored keys, the rest new keys (`keys` and up)."""
    from pyspark.sql import functions as F

    from riverhouse.platform.ingest.dedup import insert_new

    src, window, bounds = _step_settings()
    repeats = max(1, batch_rows // 10)
    stored = spark.range(0, repeats).select((F.col("id") * max(1, keys // repeats)).alias("id"))
    new = spark.range(keys, keys + batch_rows - repeats)
    batch = _silver_rows(spark, stored.unionByName(new), batch_id=batch_id, offset_base=keys)
    # No key_range: the duplicates are spread over every stored key, so the batch's key range
    # (which the stream's batches pass) would leave no silver file out; this is the worst case.
    outcome = insert_new(path, batch, src.dedup_key, window, bounds, "bench-state", batch_id)
    return outcome, batch_rows - repeats


def _growing_keys_step(spark: Any, path: str, stored: int, batch_rows: int, batch_id: int) -> dict[str, Any]:
    """One batch of keys that grow with time (10% duplicates of the newest `stored` keys, the rest
    above them), with its key range as the stream's batches pass it: the files the lookup reads."""
    from riverhouse.platform.ingest.dedup import insert_new
    from riverhouse.platform.state.delta_log import overlapping

    src, window, bounds = _step_settings()
    repeats = max(1, batch_rows // 10)
    ids = spark.range(stored - repeats, stored + batch_rows - repeats)
    batch = _silver_rows(spark, ids, batch_id=batch_id, offset_base=2 * stored)
    key_range = ("order_id", f"o-{stored - repeats:010d}", f"o-{stored + batch_rows - repeats - 1:010d}")
    lo, hi = bounds
    every = overlapping(path, "_event_time", lo, hi, "_event_date").paths
    read = overlapping(path, "_event_time", lo, hi, "_event_date", key_range=key_range).paths
    started = time.monotonic()
    outcome = insert_new(path, batch, src.dedup_key, window, bounds, "bench-state", batch_id, key_range=key_range)
    return {
        "growing_keys_step_s": round(time.monotonic() - started, 3),
        "growing_keys_files_read": len(read),
        "growing_keys_files_in_window": len(every),
        "growing_keys_exact": outcome.rows == batch_rows - repeats,
    }


def measure_silver_step(
    path: str, warmup_path: str, keys: int, batch_rows: int, master: str, conf: dict[str, str]
) -> dict[str, Any]:
    """In a fresh JVM: warm the step up, take the baseline, then take one batch against `keys` stored keys."""
    from riverhouse.platform.state.tables import ensure_delta_table, silver_properties, silver_schema

    spark = _session(master, conf)
    pid = _jvm_pid(spark)
    src = orders_spec("bench_state", "bench_state").sources["orders"]
    ensure_delta_table(spark, warmup_path, silver_schema(src), ["_event_date"], silver_properties(src))
    _silver_rows(spark, spark.range(0, WARMUP_KEYS), batch_id=0).write.format("delta").mode("append").save(warmup_path)
    _silver_step(spark, warmup_path, WARMUP_KEYS, min(batch_rows, WARMUP_KEYS), batch_id=1)
    baseline_heap = _live_heap(spark)
    time.sleep(1)  # let the JVM return what the GC freed before the baseline is read
    baseline_rss = _status(pid, "VmRSS")
    reset = True
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the kernel's peak-RSS mark starts again here
    except OSError:
        reset = False  # then VmRSS sampled below is the peak
    sampled = [baseline_rss]
    heap_peak = [baseline_heap]
    stop = threading.Event()
    runtime = spark._jvm.java.lang.Runtime.getRuntime()

    def sample() -> None:
        while not stop.wait(0.05):
            sampled.append(_status(pid, "VmRSS"))
            heap_peak.append(int(runtime.totalMemory() - runtime.freeMemory()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        outcome, new_keys = _silver_step(spark, path, keys, batch_rows, batch_id=1)
    finally:
        stop.set()
        sampler.join()
    step_s = time.monotonic() - started
    peak_rss = max(_status(pid, "VmHWM") if reset else 0, max(sampled))
    live_after = _live_heap(spark)
    from riverhouse_bench.spark_metrics import commit_history

    growing = _growing_keys_step(spark, path, keys + new_keys, batch_rows, batch_id=2)
    history = commit_history(path)
    spark.stop()
    return {
        **growing,
        "batch_events": batch_rows,
        "silver_step_s": round(step_s, 3),
        "jvm_baseline_rss_bytes": baseline_rss,
        "jvm_peak_rss_bytes": peak_rss,
        "bytes_per_key": (peak_rss - baseline_rss) / keys,
        "jvm_baseline_heap_bytes": baseline_heap,
        "jvm_peak_heap_used_bytes": max(heap_peak),
        "heap_bytes_per_key": (max(heap_peak) - baseline_heap) / keys,
        "live_heap_after_bytes": live_after,
        "live_heap_bytes_per_key": (live_after - baseline_heap) / keys,
        "jvm_total_rss_bytes_per_key": peak_rss / keys,
        "peak_reset_by_kernel": reset,
        "silver_commits": history,
        "inserted": outcome.rows,
        "exact": outcome.rows == new_keys and growing["growing_keys_exact"],
        "note": "the dedup state is the silver Delta table; memory is the JVM that runs the batch's silver "
        "step (in-batch dedup, anti-join with silver's window, append; driver + executor in local mode), "
        "peak during one batch minus its baseline before",
    }


def marginal_memory(results: dict[str, Any]) -> None:
    """The silver step's peak RSS per additional stored key between the smallest and the largest dedup_state run.

    Each run's peak includes a working set that follows the batch, not the keys; the slope
    between two key counts is what each stored key adds.
    """
    runs = sorted(
        (r for n, r in results.items() if n.startswith("dedup_state") and "keys" in r), key=lambda r: r["keys"]
    )
    if len(runs) >= 2 and runs[-1]["keys"] > runs[0]["keys"]:
        small, large = runs[0], runs[-1]
        large["marginal_bytes_per_key"] = round(
            (large["jvm_peak_rss_bytes"] - small["jvm_peak_rss_bytes"]) / (large["keys"] - small["keys"]), 2
        )
        large["marginal_from_keys"] = small["keys"]
