"""Sections of docs/benchmarks.md from Spark's own metrics: stage times, silver's commits, dedup state."""

from __future__ import annotations

from typing import Any

from riverhouse_bench.spark_metrics import COMMIT_METRICS


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
    """Spark's stage times by job kind for each Riverhouse run, then each run's silver commits."""
    runs = _runs_with_spark_metrics(s)
    if not runs:
        return []
    lines = [
        "",
        "## Where Spark's time goes (its event log, and silver's commits from the Delta log)",
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
    commits = [
        (label, run["silver_commits"]) for label, run in runs if (run.get("silver_commits") or {}).get("commits")
    ]
    if commits:
        lines += [
            "",
            "Silver's commits in the same runs (its Delta log; write metrics summed over the WRITE commits):",
            "",
            "| run | commits | by operation | " + " | ".join(COMMIT_METRICS) + " |",
            "|---|---:|---|" + "---:|" * len(COMMIT_METRICS),
        ]
        for label, c in commits:
            ops = ", ".join(f"{op} {n:,}" for op, n in c.get("operations", {}).items())
            lines.append(
                f"| {label} | {c['commits']:,} | {ops} | "
                + " | ".join(f"{c.get(m, 0):,}" for m in COMMIT_METRICS)
                + " |"
            )
    return lines


def state_lines(s: dict[str, Any]) -> list[str]:
    """The dedup state by key count: silver on disk, and the silver step's JVM memory over its baseline."""
    runs = sorted((r for n, r in s.items() if n.startswith("dedup_state") and r.get("keys")), key=lambda r: r["keys"])
    if not runs:
        return []
    lines = [
        "",
        "## dedup_state, where the state lives",
        "",
        "Silver holds N keys (one day, inside one window); one batch goes through the silver step (in-batch "
        "dedup, anti-join with silver's window, append) in a fresh JVM after a warm-up. Memory figures are "
        "per stored key: the JVM's peak RSS during the step over its RSS before (the target's figure), its "
        "peak heap in use over the baseline heap, the heap still live after the step and a GC, and the "
        "whole JVM's peak RSS (baseline included). The batch's duplicates are spread over every stored key "
        "(its key range leaves no file out); a second batch, of keys that grow with time, reads only the "
        "files its key range overlaps.",
        "",
        "| keys | silver bytes/key on disk | batch | silver step s | JVM RSS before | JVM RSS peak | RSS bytes/key "
        "| peak heap bytes/key | live heap bytes/key | whole JVM bytes/key | growing keys: files read, step s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        step_s = r.get("silver_step_s", r.get("merge_s", 0.0))  # merge_s: results of the MERGE engine
        lines.append(
            f"| {r['keys']:,} | {r['delta_bytes_per_key']:,.1f} | {r['batch_events']:,} | {step_s:.1f} | "
            f"{r['jvm_baseline_rss_bytes'] / 2**20:,.0f} MiB | {r['jvm_peak_rss_bytes'] / 2**20:,.0f} MiB | "
            f"{r['bytes_per_key']:,.1f} | {r['heap_bytes_per_key']:,.1f} | {r['live_heap_bytes_per_key']:,.1f} | "
            f"{r['jvm_total_rss_bytes_per_key']:,.1f} | {_growing(r)} |"
        )
    return lines


def _growing(r: dict[str, Any]) -> str:
    if r.get("growing_keys_step_s") is None:  # runs from before the key range
        return "-"
    return f"{r['growing_keys_files_read']} of {r['growing_keys_files_in_window']}, {r['growing_keys_step_s']:.1f}"


def _f(value: Any, spec: str = "{:.2f}") -> str:
    return spec.format(value) if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def engine_notes(name: str, r: dict[str, Any], s: dict[str, Any]) -> list[str]:
    """The scenario table's notes for spark_plain, the join, small_batches, triggered_start and jvm_profile."""
    from riverhouse_bench.results import plain_ratio

    notes: list[str] = []
    if name == "spark_plain":
        ratio = plain_ratio(s)
        notes.append(
            f"the plain Spark job (Kafka -> from_json -> dropDuplicates -> Delta append, availableNow, "
            f"maxOffsetsPerTrigger {r.get('max_offsets_per_trigger', 0):,}); riverhouse_dedup / spark_plain: "
            f"{_f(ratio['warm'])}x warm, {_f(ratio['cold'])}x cold"
        )
    if name == "riverhouse_dedup_join" and (jit := measured_jit(r)) is not None:
        warmup, steady = jit
        notes.append(
            f"JIT compiler threads' CPU s per run: {warmup + ' in the warm-up runs, ' if warmup else ''}"
            f"{steady} in the steady runs"
        )
    if name == "small_batches" and r.get("batch_s"):
        notes.append(
            f"{r['batches']} batches of up to {r['records_per_batch']:,} records: {_f(r['median_batch_s'])} s per "
            f"batch median, p95 {_f(r['p95_batch_s'])} s (engine's, {r.get('batch_s_from', '?')}); run "
            f"{_f(r.get('seconds'), '{:.1f}')} s end to end, load {_f(r.get('load_seconds'), '{:.1f}')} s"
        )
    if name == "triggered_start":
        for which in ("warm", "spawned", "cold", "resident"):
            spread = (r.get(which) or {}).get("spread") or {}
            first, loaded = spread.get("first_batch_s") or {}, spread.get("clickhouse_s") or {}
            covered = spread.get("covered_s") or {}
            if first or covered:
                notes.append(
                    f"{which} ({r[which]['runs']} runs): first batch in silver p50 {_f(first.get('p50'))} s, p95 "
                    f"{_f(first.get('p95'))} s; silver holds the run's records p50 {_f(covered.get('p50'))} s; "
                    f"rows in ClickHouse p50 {_f(loaded.get('p50'))} s, p95 {_f(loaded.get('p95'))} s"
                )
        if r.get("warm_skipped"):
            notes.append(f"warm not measured: {r['warm_skipped']}")
    if name == "jvm_profile" and r.get("attribution"):
        notes.append(
            f"JFR on the engine's JVM: {_f(r['attribution']['us_per_event'], '{:.1f}')} JVM CPU us per event "
            f"(section below; {', '.join(r.get('written') or [])})"
        )
    return notes


def measured_jit(result: dict[str, Any]) -> tuple[str, str] | None:
    """A scenario's JIT compiler threads' CPU seconds per run, (warm-up runs, steady runs) as text;
    None when a run's figure could not be read (an engine on another host) or there is none."""
    jit = result.get("jit_cpu_s") or {}
    warmup, steady = jit.get("warmup", []), jit.get("steady", [])
    if not steady or not all(isinstance(x, int | float) for x in [*warmup, *steady]):
        return None
    return ", ".join(f"{x:.1f}" for x in warmup), ", ".join(f"{x:.1f}" for x in steady)


def jit_lines(runs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The JIT compiler threads' CPU seconds in each job's warm-up and steady runs, when measured."""
    said = []
    for name, r in runs:
        if (jit := measured_jit(r)) is not None:
            warmup, steady = jit
            said.append(f"{name} {warmup + ' in the warm-up runs, ' if warmup else ''}{steady} in the steady runs")
    if not said:
        return []
    return ["", f"The JVM's JIT compiler threads' CPU seconds per run: {'; '.join(said)}."]


def engine_lines(s: dict[str, Any]) -> list[str]:
    """The Spark floor (spark_plain beside riverhouse_dedup) and the fixed cost per batch (small_batches)."""
    from riverhouse_bench.results import plain_ratio

    lines: list[str] = []
    runs = [(n, s[n]) for n in ("riverhouse_dedup", "spark_plain") if (s.get(n) or {}).get("events_per_s")]
    if any(n == "spark_plain" for n, _ in runs):
        ratio = plain_ratio(s)
        lines += [
            "",
            "## Riverhouse beside the plain Spark job (spark_plain)",
            "",
            "The same topic, session settings and maxOffsetsPerTrigger. Warm: the median steady run in the "
            "bench's process, from the first batch to the end (riverhouse_dedup: every row in ClickHouse; "
            "spark_plain: its last Delta commit). Cold: a new Spark session, the query start and the run.",
            "",
            "| run | events | warm events/s | cold events/s | session s | query start s | batches (warm) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in runs:
            lines.append(
                f"| {name} | {r['events']:,} | {_f(r.get('events_per_s_excluding_startup'), '{:,.0f}')} | "
                f"{_f(r.get('events_per_s'), '{:,.0f}')} | {_f(r.get('spark_session_s'), '{:.1f}')} | "
                f"{_f(r.get('query_startup_s'), '{:.1f}')} | {r.get('batches', '-')} |"
            )
        lines += ["", f"riverhouse_dedup / spark_plain: {_f(ratio['warm'])}x warm, {_f(ratio['cold'])}x cold."]
        lines += jit_lines(runs)
    small = s.get("small_batches") or {}
    if small.get("batch_s"):
        batch, cycle = small["batch_s"], small.get("cycle_s") or {}
        lines += [
            "",
            "## Seconds per small batch (small_batches)",
            "",
            f"`Pipeline.run` over {small['events']:,} events with maxOffsetsPerTrigger "
            f"{small['records_per_batch']:,}, warm (after a {small['warmup']['batches']}-batch run in the same "
            f"process). Batch: the engine's own seconds per batch ({small['batch_s_from']}); cycle: the time "
            "between two batches' progress lines, with the work between batches.",
            "",
            "| figure | p50 | p95 | max |",
            "|---|---:|---:|---:|",
            f"| batch s | {_f(batch.get('p50'))} | {_f(batch.get('p95'))} | {_f(batch.get('max'))} |",
            f"| cycle s | {_f(cycle.get('p50'))} | {_f(cycle.get('p95'))} | {_f(cycle.get('max'))} |",
            "",
            f"{small['batches']} batches; the run took {_f(small.get('seconds'), '{:.1f}')} s end to end "
            f"({_f(small.get('query_startup_s'), '{:.1f}')} s of query start), the ClickHouse load "
            f"{_f(small.get('load_seconds'), '{:.1f}')} s of it.",
        ]
    return lines


TRIGGERED_FIGURES = (
    ("launch_s", "Dagster launch: trigger -> run started (run created, process started or forked, definitions)"),
    ("ingest_step_s", "trigger -> ingest step started"),
    ("engine_s", "engine: ingest step -> first batch in silver (session, query start, batch)"),
    ("first_batch_s", "trigger -> first batch committed in silver"),
    ("covered_s", "trigger -> silver holds the run's records (resident: <= 0 when it read them before)"),
    ("clickhouse_s", "trigger -> rows in ClickHouse"),
    ("run_s", "trigger -> run succeeded"),
)


def triggered_lines(s: dict[str, Any]) -> list[str]:
    """triggered_start: each figure's p50/p95, one pair of columns per series."""
    r = s.get("triggered_start") or {}
    if not (r.get("cold") or r.get("warm")):
        return []
    series = [  # cold and warm always (a dash where not measured), the others when measured
        (name, (r.get(name) or {}).get("spread") or {})
        for name in ("cold", "warm", "spawned", "resident")
        if name in ("cold", "warm") or (r.get(name) or {}).get("spread")
    ]
    started = (
        f" (`riverhouse engine start` for these runs took {r['engine_start_s']:.1f} s)"
        if r.get("engine_start_s") is not None
        else ""
    )
    lines = [
        "",
        "## From a trigger to the data (triggered_start)",
        "",
        f"Dagster stream runs of the pipeline's job, {r['events_per_run']:,} new records per run. Cold: no engine, "
        f"each run a new process that starts Spark. Against the engine at {r.get('engine') or '(none)'}{started}, "
        "each series after one unmeasured run (warm and spawned alternated run by run): warm, each run created by a daemon-like process and launched "
        "by Riverhouse's run launcher (forked from a process that has imported Dagster, GX and pyspark); "
        "spawned, each run `dagster job execute` in a new process (Dagster's default launcher's cost); "
        "resident, through the launcher with `orchestration.resident_query` (the runs attach to a query kept "
        "on the engine).",
        "",
        "| figure | " + " | ".join(f"{name} p50 | {name} p95" for name, _ in series) + " |",
        "|---|" + "---:|---:|" * len(series),
    ]
    for key, label in TRIGGERED_FIGURES:
        cells = []
        for _, spread in series:
            figure = spread.get(key) or {}
            cells += [_f(figure.get("p50")), _f(figure.get("p95"))]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if r.get("warm_skipped"):
        lines += ["", f"Warm runs not measured: {r['warm_skipped']}."]
    return lines


def profile_lines(s: dict[str, Any]) -> list[str]:
    """jvm_profile: where the JVM's CPU went, by kind of work (the full profile is in profile-*.md)."""
    from riverhouse_bench.jvm_profile import profile_markdown

    r = s.get("jvm_profile") or {}
    if not r.get("attribution"):
        return []
    return ["", *profile_markdown(r, brief=True)]
