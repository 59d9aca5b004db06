"""small_batches: many small batches through `Pipeline.run`, seconds per batch (issue 25).

A pipeline's fixed cost per batch (planning, commits, log reads, job start-ups) decides its
throughput at small batch sizes and its freshness. This scenario runs `small_batches` batches
of `small_batch_records` records (maxOffsetsPerTrigger) through `Pipeline.run`, warm: a
first, unmeasured run of a few batches in the same process and engine comes before it.

Per batch, two figures: the engine's own seconds per batch (`BatchMetrics.seconds`, from the
run's summary when it carries them, else from its progress lines, which round to 0.1 s), and
the cycle the bench sees: the time between one batch's line and the next one's, which also
holds the work between batches (offsets, Spark's commit log, the next trigger's planning).
"""

from __future__ import annotations

import re
import time
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse_bench.common import orders_spec
from riverhouse_bench.freshness import percentiles
from riverhouse_bench.metering import CpuMeter

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench

WARMUP_BATCHES = 5
# The progress line Pipeline.run logs per batch (pipeline.batch_line): "batch 3: read 7,000, ... (1.2s)".
BATCH_LINE = re.compile(r"(?:^|\s)batch (\d+): read ([\d,]+),.*\((\d+(?:\.\d+)?)s\)\s*$")


def batch_lines(lines: list[tuple[float, str]]) -> list[dict[str, Any]]:
    """The batches in a run's progress lines: (arrival time, line) -> batch id, records, seconds, arrival."""
    out = []
    for arrived, line in lines:
        match = BATCH_LINE.search(line)
        if match:
            batch, read, seconds = match.groups()
            out.append({"batch_id": int(batch), "read": int(read.replace(",", "")), "s": float(seconds), "at": arrived})
    return out


def spread(values: list[float]) -> dict[str, float] | None:
    return {**percentiles(values), "max": round(max(values), 4)} if values else None


def batch_figures(summary: dict[str, Any], lines: list[tuple[float, str]]) -> dict[str, Any]:
    """Per-batch seconds of one run: the engine's (summary or log) and the cycles the bench saw.

    Batches that read nothing (an availableNow query's last, empty trigger) are left out.
    Cycles are only kept when the lines arrived while the run went on, not all at its end
    (their sum must cover at least half of the engine's batch seconds).
    """
    seen = [b for b in batch_lines(lines) if b["read"] > 0]
    detail = summary.get("batch_seconds")
    if isinstance(detail, list) and detail:
        seconds, origin = [float(s) for s in detail], "summary"
    else:
        seconds, origin = [b["s"] for b in seen], "log (0.1 s resolution)"
    cycles = [round(b["at"] - a["at"], 4) for a, b in pairwise(seen)]
    if cycles and sum(cycles) < 0.5 * sum(seconds[1:]):
        cycles = []
    return {
        "batches": len(seconds),
        "records": spread([float(b["read"]) for b in seen]),
        "batch_s": spread(seconds),
        "batch_s_from": origin,
        "cycle_s": spread(cycles),
        "per_batch_s": seconds,
    }


def _run(bench: Bench, name: str, count: int, records_per_batch: int, seed: int) -> dict[str, Any]:
    from riverhouse.platform.pipeline import Pipeline

    stats = bench.produce_orders(name, count, seed=seed)
    spec = orders_spec(name, name, max_offsets_per_trigger=records_per_batch)
    lines: list[tuple[float, str]] = []
    with CpuMeter() as cpu:
        started = time.monotonic()
        summary = Pipeline(
            spec, bench.settings, spark=bench.spark, log=lambda m: lines.append((time.monotonic(), m))
        ).run()
        seconds = time.monotonic() - started
    figures = batch_figures(summary, lines)
    with open_client(bench.settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT count(), uniqExact(order_id) FROM {qualified_table(spec)}").result_rows[0]
    startup = float(summary.get("query_startup_s") or 0.0)
    return {
        "events": summary["read"],
        "messages": stats.messages,
        "seconds": round(seconds, 3),
        "query_startup_s": startup,
        "steady_seconds": round(seconds - startup, 3),
        "load_seconds": summary.get("load_seconds"),
        "stage_seconds": summary.get("stage_seconds") or {},
        "rows": rows[0],
        "expected_unique": stats.unique,
        "exact": summary["read"] == stats.messages and tuple(rows) == (stats.unique, stats.unique),
        "cpu": cpu.window(started + startup, started + seconds),
        **figures,
    }


def small_batches(bench: Bench) -> dict[str, Any]:
    """A warm-up run, then `small_batches` batches of `small_batch_records` records, timed per batch."""
    cfg = bench.cfg
    per, batches = cfg.small_batch_records, cfg.small_batches
    distinct = round(per * batches / (1 + cfg.duplicate_rate))  # the generator adds the duplicate copies
    warmup = _run(bench, "bench_small_warmup", round(per * WARMUP_BATCHES / (1 + cfg.duplicate_rate)), per, seed=21)
    run = _run(bench, "bench_small", distinct, per, seed=22)
    steady = run["steady_seconds"]
    return {
        **run,
        "events_per_s": run["events"] / run["seconds"],
        "events_per_s_excluding_startup": run["events"] / steady if steady > 0 else None,
        "records_per_batch": per,
        "median_batch_s": (run["batch_s"] or {}).get("p50"),
        "p95_batch_s": (run["batch_s"] or {}).get("p95"),
        "warmup": {k: warmup[k] for k in ("events", "seconds", "batches", "batch_s", "exact")},
        "exact": run["exact"] and warmup["exact"],
    }
