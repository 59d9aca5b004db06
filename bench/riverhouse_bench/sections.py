"""Sections of docs/benchmarks.md from Spark's own metrics: stage times, the MERGE's metrics, dedup state."""

from __future__ import annotations

from typing import Any

from riverhouse_bench.spark_metrics import MERGE_METRICS


def _runs_with_spark_metrics(s: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    runs = []
    steady = (s.get("riverhouse_dedup") or {}).get("steady") or {}
    if steady.get("spark_stages"):
        runs.append(("riverhouse_dedup, median warm run", steady))
    scale = s.get("scale_local") or {}
    for master in ("local[1]", "local[2]"):
        if (scale.get(master) or {}).get("spark_stages"):
            runs.append((f"scale_local, {master}", scale[master]))
    if (s.get("cluster") or {}).get("spark_stages"):
        runs.append(("cluster, 2 workers", s["cluster"]))
    return runs


def spark_lines(s: dict[str, Any]) -> list[str]:
    """Spark's stage times by job kind for each Riverhouse run, then each run's MERGE metrics."""
    runs = _runs_with_spark_metrics(s)
    if not runs:
        return []
    lines = [
        "",
        "## Where Spark's time goes (its event log, and the MERGE's metrics from the Delta history)",
        "",
        "Completed stages from the first batch to the end of each run, by what the job did. `stage s` "
        "sums each stage's wall time (stages of one job can overlap); `executor run s` and `CPU s` sum "
        "the tasks' times (up to cores x wall time).",
        "",
        "| run | job kind | stages | tasks | stage s | executor run s | executor CPU s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, run in runs:
        kinds = sorted(run["spark_stages"].items(), key=lambda kv: -kv[1]["executor_run_s"])
        for kind, row in kinds:
            lines.append(
                f"| {label} | {kind} | {row['stages']:,} | {row['tasks']:,} | {row['stage_s']:.2f} | "
                f"{row['executor_run_s']:.2f} | {row['cpu_s']:.2f} |"
            )
    merges = [(label, run["merge_metrics"]) for label, run in runs if (run.get("merge_metrics") or {}).get("merges")]
    if merges:
        shown = [m for m in MERGE_METRICS if any(m in metrics for _, metrics in merges)]
        lines += [
            "",
            "The silver MERGE commits of the same runs (`DESCRIBE HISTORY` operationMetrics, summed; times in ms):",
            "",
            "| run | MERGE commits | " + " | ".join(shown) + " |",
            "|---|---:|" + "---:|" * len(shown),
        ]
        for label, metrics in merges:
            lines.append(
                f"| {label} | {metrics['merges']:,} | " + " | ".join(f"{metrics.get(m, 0):,}" for m in shown) + " |"
            )
    return lines


def state_lines(s: dict[str, Any]) -> list[str]:
    """The dedup state by key count: silver on disk, and the MERGE's JVM memory over its baseline."""
    runs = sorted((r for n, r in s.items() if n.startswith("dedup_state") and r.get("keys")), key=lambda r: r["keys"])
    if not runs:
        return []
    lines = [
        "",
        "## dedup_state, where the state lives",
        "",
        "Silver holds N keys (one day, inside one window); one batch is merged against it in a fresh "
        "JVM after a warm-up. Memory figures are per stored key: the JVM's peak RSS during the MERGE "
        "over its RSS before (the target's figure), its peak heap in use over the baseline heap, the "
        "heap still live after the MERGE and a GC, and the whole JVM's peak RSS (baseline included).",
        "",
        "| keys | silver bytes/key on disk | batch | MERGE s | JVM RSS before | JVM RSS peak | RSS bytes/key "
        "| peak heap bytes/key | live heap bytes/key | whole JVM bytes/key | MERGE scanTimeMs | rewriteTimeMs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        merge = r.get("merge_metrics") or {}
        lines.append(
            f"| {r['keys']:,} | {r['delta_bytes_per_key']:,.1f} | {r['batch_events']:,} | {r['merge_s']:.1f} | "
            f"{r['jvm_baseline_rss_bytes'] / 2**20:,.0f} MiB | {r['jvm_peak_rss_bytes'] / 2**20:,.0f} MiB | "
            f"{r['bytes_per_key']:,.1f} | {r['heap_bytes_per_key']:,.1f} | {r['live_heap_bytes_per_key']:,.1f} | "
            f"{r['jvm_total_rss_bytes_per_key']:,.1f} | {merge.get('scanTimeMs', 0):,} | "
            f"{merge.get('rewriteTimeMs', 0):,} |"
        )
    return lines
