"""docs/benchmarks.md with its plot, rendered from a run's results.

Rendering only: the scenario modules measure, `results` keeps the figures and the
targets' verdicts, this module (and `sections`) writes up what was measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from riverhouse.platform.spec import KafkaSpec
from riverhouse_bench.common import REPO
from riverhouse_bench.freshness import fell_behind
from riverhouse_bench.metering import CPU_ROLES
from riverhouse_bench.results import THROUGHPUT, targets
from riverhouse_bench.sections import (
    engine_lines,
    engine_notes,
    measured_jit,
    profile_lines,
    spark_lines,
    state_lines,
    triggered_lines,
)

ANALYSIS = REPO / "bench" / "analysis.md"


def _plot(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["scenarios"]
    names = [n for n in THROUGHPUT if isinstance(s.get(n, {}).get("events_per_s"), int | float)]
    fig, ax = plt.subplots(figsize=(9, 4))
    values = [s[n]["events_per_s"] for n in names]
    steady = [s[n].get("events_per_s_excluding_startup") or 0 for n in names]
    positions = range(len(names))
    ax.barh([p + 0.2 for p in positions], values, height=0.4, label="end to end (incl. start-up)")
    ax.barh([p - 0.2 for p in positions], steady, height=0.4, label="excluding start-up")
    ax.set_yticks(list(positions), names)
    ax.set_xscale("log")
    ax.set_xlabel("events per second (log scale)")
    ax.set_title(f"Riverhouse benchmarks, {result['machine']['cores']} cores, {result['started_at'][:10]}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _fmt(value: Any, spec: str = "{:,.0f}") -> str:
    return spec.format(value) if isinstance(value, int | float) else ""


def _scenario_lines(s: dict[str, Any]) -> list[str]:
    lines = [
        "| scenario | events | seconds | events/s | excl. start-up | exact | notes |",
        "|---|---:|---:|---:|---:|:---:|---|",
    ]
    for name, r in s.items():
        if "error" in r:
            lines.append(f"| {name} | | | | | no | error: {r['error']} |")
            continue
        notes = []
        if name == "freshness":
            notes.append(
                f"p50 {r['p50_s']:.2f} s, p95 {r['p95_s']:.2f} s, p99 {r['p99_s']:.2f} s at {r['rate']:,.0f} events/s"
                if r.get("p95_s") is not None
                else "no rows measured"
            )
            warm, profile = r.get("warmup_percentiles_s") or {}, r.get("profile") or {}
            if warm:
                notes.append(
                    f"after {r['warmup_s']:g} s of warm-up traffic (its rows: p50 {warm['p50']:.2f} s, "
                    f"p95 {warm['p95']:.2f} s)"
                )
            if profile.get("batch_s") and profile.get("load_s"):
                # One measured batch has no gap to the next one.
                gap = (profile.get("between_batches_s") or {}).get("p50")
                notes.append(
                    f"batches of {profile['records']['p50']:,.0f} records took {profile['batch_s']['p50']:.2f} s "
                    f"(p95 {profile['batch_s']['p95']:.2f} s), "
                    + (f"{gap:.2f} s between batches, " if gap is not None else "")
                    + f"loads {profile['load_s']['p50']:.2f} s"
                )
            if grew := fell_behind(profile):
                notes.append(
                    f"the pipeline fell behind the producer (batches grew from {grew[0]:,} to {grew[1]:,} records "
                    "on average, first to last quarter): these percentiles are a backlog's age"
                )
        if name.startswith("query_vs_final") and r.get("final_s") is not None:
            notes.append(
                f"FINAL {r['final_s'] * 1000:.1f} ms (exact: {r['final_exact']}), clean "
                f"{r['clean_s'] * 1000:.1f} ms (exact: {r['clean_exact']}): {r['speedup']:.1f}x; "
                f"{r.get('rmt_parts', '?')} unmerged parts"
            )
        if name.startswith("dedup_state") and r.get("keys"):
            notes.append(
                f"{r['keys']:,} keys in silver ({r['delta_bytes_per_key']:,.1f} bytes/key on disk); one "
                f"{r['batch_events']:,}-event batch's silver step took {r.get('silver_step_s', r.get('merge_s', 0)):.1f} s: "
                f"the JVM peaked at "
                f"{r['jvm_peak_rss_bytes'] / 2**20:,.0f} MiB RSS, {r['jvm_baseline_rss_bytes'] / 2**20:,.0f} MiB "
                f"before, so {r['bytes_per_key']:,.1f} bytes/key (live heap after: "
                f"{r['live_heap_bytes_per_key']:,.1f} bytes/key)"
            )
            if r.get("growing_keys_step_s") is not None:
                notes.append(
                    f"a batch of keys that grow with time read {r['growing_keys_files_read']} of the window's "
                    f"{r['growing_keys_files_in_window']} silver files and took {r['growing_keys_step_s']:.1f} s"
                )
            if r.get("marginal_bytes_per_key") is not None:
                notes.append(
                    f"{r['marginal_bytes_per_key']:,.1f} bytes of the silver step's peak RSS per key added since the "
                    f"{r['marginal_from_keys']:,}-key run"
                )
        if name == "scale_local" and r.get("ratio") is not None:
            one, two = r["local[1]"], r["local[2]"]
            notes.append(
                f"local[1] {one['steady_seconds']:.1f} s, local[2] {two['steady_seconds']:.1f} s from the first "
                f"batch to every row in ClickHouse: {r['ratio']:.2f}x"
            )
        if name == "cluster" and r.get("tasks_by_executor"):
            tasks = ", ".join(f"{e}: {n:,}" for e, n in r["tasks_by_executor"].items())
            notes.append(f"{r.get('workers', 2)} workers of 1 core; tasks by executor: {tasks}")
        notes += engine_notes(name, r, s)
        if r.get("startup_s") is not None:
            notes.append(f"start-up {r['startup_s']:.1f} s")
        lines.append(
            f"| {name} | {_fmt(r.get('events'))} | {_fmt(r.get('seconds'), '{:,.1f}')} | "
            f"{_fmt(r.get('events_per_s'))} | {_fmt(r.get('events_per_s_excluding_startup'))} | "
            f"{'yes' if r.get('exact') else 'no'} | {'; '.join(notes)} |"
        )
    return lines


def _cpu_lines(s: dict[str, Any]) -> list[str]:
    """CPU microseconds per event by process role: the baseline next to Riverhouse's warm runs."""
    rows = []
    for label, name, path, key in (
        ("baseline_consumer", "baseline_consumer", (), "cpu"),
        (
            "riverhouse_dedup (median warm run, first batch to rows in ClickHouse)",
            "riverhouse_dedup",
            ("steady",),
            "cpu",
        ),
        ("spark_plain (median warm run, first batch to last commit)", "spark_plain", ("steady",), "cpu"),
        ("small_batches (first batch to rows in ClickHouse)", "small_batches", (), "cpu"),
        ("riverhouse_dedup_join (median warm run, whole run)", "riverhouse_dedup_join", ("steady",), "cpu_whole_run"),
    ):
        r = s.get(name, {})
        for step in path:
            r = r.get(step) or {}
        cpu = r.get(key)
        if cpu and r.get("events"):
            rows.append((label, r["events"], cpu))
    if not rows:
        return []
    lines = [
        "",
        "## Where the CPU goes",
        "",
        "CPU microseconds per event, by process (user + system time read from /proc every 0.1 s): "
        "`driver` is the Python process (it plans through py4j and runs the embedded ClickHouse engine "
        "and its inserts), `jvm` is Spark's driver and executors: Spark's Kafka source, the parse, the "
        "Delta writes, the dedup and the anti-join (including its JIT and GC threads); `spark_python` Spark's Python "
        "workers (the in-batch dedup's walk of keys that span more than a window), `kafka` the local broker. "
        "`use of cores` is CPU time over wall time x cores.",
        "",
        f"| run | events | wall s | {' | '.join(CPU_ROLES)} | total | use of cores |",
        "|---|---:|---:|" + "---:|" * (len(CPU_ROLES) + 2),
    ]
    for label, events, cpu in rows:
        per_event = [cpu["by_role"].get(role, 0.0) * 1e6 / events for role in CPU_ROLES]
        lines.append(
            f"| {label} | {events:,} | {cpu['wall_s']:.2f} | "
            + " | ".join(f"{v:.1f}" for v in per_event)
            + f" | {cpu['total'] * 1e6 / events:.1f} | {cpu['utilization']:.0%} |"
        )
    return lines


def _warmup_text(dedup: dict[str, Any]) -> str:
    """What the warm-up runs took, and the JIT compiler threads' CPU then and in the steady runs."""
    warmup = dedup.get("warmup_runs_seconds") or []
    if not warmup:
        return ""
    text = f": {len(warmup)} unmeasured warm-up run{'s' if len(warmup) != 1 else ''} took {', '.join(f'{x:.2f}' for x in warmup)} s"
    if (jit := measured_jit(dedup)) is not None:
        text += f", while the JIT compiler threads used {jit[0]} CPU s (in the steady runs: {jit[1]})"
    return text


def _stage_lines(dedup: dict[str, Any]) -> list[str]:
    stages = dict(dedup.get("stage_seconds") or {})
    steady = dedup.get("steady") or {}
    if not stages or not steady:
        return []
    wall = steady["steady_seconds"]
    other = max(0.0, wall - sum(stages.values()))
    lines = [
        "",
        "## Where the time goes (riverhouse_dedup, this run)",
        "",
        f"Start-up of the cold run: {dedup.get('spark_session_s') or 0:.1f} s for the Spark session and "
        f"{dedup.get('query_startup_s') or 0:.1f} s to start the streaming query (the checkpoint, the "
        "Kafka connector's first offsets); the JVM also warms up (JIT) during the first batches"
        f"{_warmup_text(dedup)}. The median warm run "
        f"(of {', '.join(f'{x:.2f}' for x in dedup.get('steady_runs_seconds') or [wall])} s) of "
        f"{steady.get('events', 0):,} events took {wall:.2f} s from its first batch to every row "
        f"in ClickHouse, in {steady.get('batches')} batch(es) of up to "
        f"{KafkaSpec.model_fields['max_offsets_per_trigger'].default:,} records:",
        "",
        "| stage | seconds | share |",
        "|---|---:|---:|",
    ]
    for stage, seconds in sorted(stages.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {stage} | {seconds:.2f} | {seconds / wall:.0%} |")
    lines.append(f"| between batches (offsets, commit log), not overlapped | {other:.2f} | {other / wall:.0%} |")
    lines += [
        "",
        "`bronze` is the bronze append, which also reads the batch from Kafka (Spark's connector), "
        "parses and validates it in the plan and caches it on the executors (its observed metrics "
        "give the batch's counts, no extra job); `quarantine` the quarantine append (on a thread of its "
        "own, beside silver); `silver` the in-batch dedup (each key's first row), the anti-join with "
        "the silver files of the batch's window and the append. `clickhouse_load` inserts the Parquet "
        "files the batch's commits added, a token per file slice; it overlaps the next batch, so the "
        "shares can add up to more than the wall time.",
    ]
    return lines


def _final_lines(s: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for name, r in s.items():
        queries = r.get("queries") or {}
        if not name.startswith("query_vs_final") or not queries:
            continue
        clean = (
            "Riverhouse's clean table"
            if name == "query_vs_final"
            else "a clean table with the loader's DDL holding one row per order (both generated straight into "
            "ClickHouse)"
        )
        lines += [
            "",
            f"## {name}, query by query",
            "",
            f"{r['events']:,} raw events (duplicates included) in a ReplacingMergeTree, inserted "
            f"{r.get('rmt_insert_rows', 0):,} rows at a time as a Kafka sink flushes them "
            f"({r.get('rmt_parts', '?')} parts, not merged yet), queried with `FINAL`, against {clean}; "
            f"median of {r.get('runs')} runs each. The first query is the target's.",
            "",
            "| query | FINAL ms | clean ms | speedup | FINAL exact | clean exact |",
            "|---|---:|---:|---:|:---:|:---:|",
        ]
        for q in queries.values():
            lines.append(
                f"| `{q['sql']}` | {q['final_s'] * 1000:.1f} | {q['clean_s'] * 1000:.1f} | "
                f"{_fmt(q.get('speedup'), '{:.1f}x')} | {'yes' if q['final_exact'] else 'no'} | "
                f"{'yes' if q['clean_exact'] else 'no'} |"
            )
    return lines


def _machine_lines(result: dict[str, Any]) -> list[str]:
    m = result["machine"]
    lines = [
        f"Machine: {m['cores']} cores, {m['ram_bytes'] / 2**30:.0f} GiB RAM, {m['platform']}; Python {m['python']}, "
        f"PySpark {m['pyspark']}, deltalake {m['deltalake']}, chDB {m['chdb']}, librdkafka {m['librdkafka']}."
    ]
    cal = m.get("calibration") or {}
    if cal:
        text = (
            f"Calibration (fixed work, best of 3): a 2M-step Python loop {cal['python_loop_2m_s']:.3f} s, "
            f"an Arrow sort of 1M strings {cal['arrow_sort_1m_strings_s']:.3f} s."
        )
        before = (result.get("previous") or {}).get("calibration") or {}
        if before.get("python_loop_2m_s"):
            ratio = cal["python_loop_2m_s"] / before["python_loop_2m_s"]
            text += (
                f" The previous run ({str(result['previous'].get('started_at'))[:16]}) took "
                f"{before['python_loop_2m_s']:.3f} s for the loop: this machine was {ratio:.2f}x as slow. "
                "Shared machines of one kind differ, so compare ratios within one run, and absolute "
                "figures only between runs with similar calibration."
            )
        lines += ["", text]
    return lines


def _config_lines(result: dict[str, Any]) -> list[str]:
    c = result.get("config") or {}
    if not c.get("events"):
        return []
    return [
        "",
        f"Run with {c['events']:,} distinct orders per throughput scenario and {c['duplicate_rate']:.0%} "
        f"duplicate copies, every topic created with {c.get('partitions', 4)} partitions "
        "(`riverhouse bench --events --duplicate-rate --partitions --scenarios`, `--help` for the rest).",
    ]


def render_docs(
    result: dict[str, Any], docs: Path, source: str = "bench/results/latest.json", analysis: Path = ANALYSIS
) -> Path:
    """docs/benchmarks.md: this run's figures, tables and plot, then the maintained analysis (bench/analysis.md)."""
    s = result["scenarios"]
    docs.parent.mkdir(parents=True, exist_ok=True)
    _plot(result, docs.with_suffix(".png"))
    lines = [
        "# Benchmarks",
        "",
        "Measured by `make bench` (the `riverhouse_bench` package in `bench/`, `python -m riverhouse_bench`):",
        "every scenario in one run against the same local",
        "Apache Kafka broker (KRaft, one node, on the same 2 cores) and the same embedded ClickHouse engine",
        "(chDB), so ratios are fair.",
        f"Rendered from `{source}` (run of {result['started_at'][:16]} UTC); each run's raw figures are in "
        "`bench/results/<timestamp>.json`.",
        "",
        *_machine_lines(result),
        *_config_lines(result),
        "",
        *_scenario_lines(s),
        "",
        "![throughput](benchmarks.png)",
        "",
        "## Targets",
        "",
        "| target | measured | verdict |",
        "|---|---:|---|",
    ]
    for name, measured, verdict, _ in targets(result):
        lines.append(f"| {name} | {measured} | {verdict} |")
    lines += _cpu_lines(s)
    lines += _stage_lines(s.get("riverhouse_dedup", {}))
    lines += engine_lines(s)
    lines += profile_lines(s)
    lines += triggered_lines(s)
    lines += spark_lines(s)
    lines += state_lines(s)
    lines += _final_lines(s)
    if analysis.exists():
        lines += ["", analysis.read_text().strip()]
    lines += method_lines()
    docs.write_text("\n".join(lines))
    return docs


def method_lines() -> list[str]:
    """How each figure is measured: the end of the page."""
    return [
        "",
        "## How each figure is measured",
        "",
        "- `kafka_produce_limit`: producing the bench's orders (generator included) with one "
        "librdkafka producer (lz4, acks=all) to the local broker: the broker's produce limit as one "
        "Python client reaches it.",
        "- `kafka_read_limit`: one librdkafka consumer reading the topic from the broker, with a deep "
        "prefetch (`queued.min.messages` 1,000,000): the broker's read limit as one Python client reaches "
        "it. Riverhouse reads with Spark's Kafka connector (the Java client; a batch's partitions are read in at most as many tasks as Spark runs at once).",
        "- `clickhouse_insert_limit`: the same number of rows inserted from prebuilt Arrow batches "
        "of 100,000 (the sink's limit).",
        "- `baseline_consumer`: confluent-kafka (the same prefetch) -> `json.loads` -> an in-memory "
        "set for dedup -> clickhouse-connect inserts of 50,000 rows, offsets committed after each "
        "insert (at-least-once, no window, no persistence).",
        "- `riverhouse_dedup`: `Pipeline.run` of a dedup pipeline, Kafka -> bronze/silver Delta -> "
        "ClickHouse. `events/s` is the cold run: a new Spark session, the query start and the JVM "
        "warm-up included. `excl. start-up` is the steady state: after unmeasured warm-up pipelines "
        "(`--warmup-runs`, five by default since 2026-12-07, none in earlier results: the JVM's JIT "
        "compiles through the first warm runs), five more "
        "of the same size, each on a fresh topic in the now warm process, each timed from its first "
        "batch until every row is visible in ClickHouse (batches, the time between them, and the "
        "load); the median run is reported and all are in the JSON (`steady_runs_seconds`, "
        "`warmup_runs_seconds`, and each run's JIT compiler threads' CPU in `jit_cpu_s`). Every run "
        "must be exact.",
        "- `riverhouse_dedup_avro` (`--format avro`): the same runs on the same orders as Avro in the Confluent "
        "wire format, produced through the local schema registry (Apicurio) and decoded on the executors by "
        "`from_avro` with each record's writer schema; after `riverhouse_dedup` in the same process, so its "
        "first run is not cold. Compare its `excl. start-up` with `riverhouse_dedup`'s.",
        "- `spark_plain`: the plain Spark job Riverhouse is compared with, on the same topic with the same "
        'session settings and maxOffsetsPerTrigger: `readStream.format("kafka")` -> `from_json` (the '
        "orders' fields) -> `dropDuplicates(order_id)` in `foreachBatch` -> one delta-spark append per batch, "
        "`availableNow`. It dedups within a batch only (no window, no bronze, no exactly-once marker, no "
        "ClickHouse): the floor, not an equivalent. `events/s` is its cold run in a process of its own (a new "
        "JVM and session, the query start, the run); `excl. start-up` the median of the steady runs in the "
        "bench's session (alternated with riverhouse_dedup's warm-up and steady runs when both run, so both "
        "meet the JVM at the same age), from the first trigger (Spark's progress reports) to the query's end. Exact when "
        "every record was read and every order is in the table (copies that fell into different batches "
        "stay: `rows` in the JSON).",
        "- `small_batches`: `Pipeline.run` of the dedup pipeline over 20 batches of 7,000 records "
        "(`--small-batches`, `--small-batch-records`: maxOffsetsPerTrigger), after an unmeasured 5-batch run "
        "in the same process. Per batch: the engine's seconds (`BatchMetrics.seconds`: from the run's summary "
        "when it carries them, else from its progress lines, which round to 0.1 s) and the cycle between two "
        "batches' progress lines; median and p95 (nearest rank). Also the run's seconds end to end and its "
        "ClickHouse load. Exact when ClickHouse holds every order once.",
        "- `triggered_start`: the pipeline's stream job (the one its lag sensor requests) run by Dagster after "
        "new records are produced; timed from the trigger to the run's start (Dagster's launch), to the "
        "ingest step's start, to silver's first commit after the trigger (its Delta log), to the ClickHouse "
        "asset's materialization (the load returned), to the run's success. Cold: no engine, each run "
        "`dagster job execute` in a new process that starts its own Spark. Against the engine "
        "RIVERHOUSE_SPARK_REMOTE names, or else one `riverhouse engine start` starts for the runs' home (its "
        "start timed, stopped after), three series after one unmeasured run each (warm and spawned alternated "
        "run by run: the engine's JIT keeps warming through its first dozens of runs). Warm: a long-lived process "
        "plays the daemon (it has loaded the code location and the instance): per trigger it creates the run "
        "and hands it to the instance's run launcher, `riverhouse.launcher.WarmRunLauncher` (what `riverhouse "
        "ui` configures); the trigger is the moment the request reaches it. Spawned: each run `dagster job "
        "execute` in a new process, timed from the process's start (a new interpreter per run, as Dagster's "
        "default launcher starts them). Resident: warm, with `orchestration.resident_query`. p50/p95 nearest "
        "rank. The sensor's own tick interval and the daemon's queue are not in the figures. Exact when every "
        "run succeeded with its checks and silver and ClickHouse hold every order once.",
        "- `jvm_profile` (`--profile`): a warm dedup run on a fresh topic with Java Flight Recorder on the "
        "engine's JVM, recording only a stack sample of each running Java thread every 10 ms, GC pauses and "
        "compilations over 100 ms. The bench's own session starts the recorder with its JVM "
        "(`spark.driver.defaultJavaOptions`) and the run's window is read from a `jcmd JFR.dump`; a JVM the "
        "bench did not start (a Spark Connect server) gets it by `jcmd JFR.start`, which made the recorded "
        "run cost about twice the JVM CPU in a test, so the same run without the recorder comes right before "
        "and is shown. The JVM's threads' CPU from /proc: JIT compiler, GC and VM threads by name; the Java "
        "threads' CPU shared out by their samples, each sample put in one bucket by the first recognized frame "
        "from the top of its stack (`jfr.py` holds the rules). Spark's task CPU from its event log.",
        "- `riverhouse_dedup_join`: orders + user events, LEFT temporal join, windows drained, in the "
        "warm process. The two sources' streaming queries start and run side by side. `events/s` "
        "is the first join pipeline of the process, start included; `excl. start-up` is the median of "
        "five more on fresh topics (after the unmeasured warm-up ones), timed from the first batch of either query (the rest of the other "
        "query's start counts as work), through the join, to every row in ClickHouse. The first join "
        "also pays for loading and compiling the join's operators in the JVM "
        "(`first_excluding_startup` in the JSON). Every run must be exact.",
        "- `freshness`: continuous mode (1 s trigger; the join and the load run as soon as a batch "
        "lands) and a producer at a fixed rate; latency = when the ClickHouse load of a row's Delta "
        "version returned minus the row's Kafka timestamp. The percentiles cover the rows produced after "
        "the first `freshness_warmup` seconds of traffic: the first data batches of a new process run "
        "cold (JIT) and build a backlog that takes a few batches to drain; those rows' percentiles are "
        "reported beside them (`warmup_percentiles_s`, `warmup_batches` in the JSON). When the "
        "measured batches' last quarter holds over 1.5 times the records of their first, the producer "
        "outran the pipeline and the notes say so: the percentiles are then a growing backlog's age.",
        "- `query_vs_final`: the records produced to the topic, in produce order, in a "
        "ReplacingMergeTree (`FINAL`) vs Riverhouse's table; each query's answer is checked against "
        "the generator's distinct events; median of runs. `query_vs_final_<N>`: the same on N "
        "generated orders (+10% duplicates) built straight into ClickHouse, the clean table with the "
        "loader's DDL and one row per order, to show how the ratio moves with the table's size.",
        "- `scale_local`: the dedup pipeline on the bench's topic, `riverhouse run` in a process of its "
        "own, once with Spark on `local[1]` and once on `local[2]`; the ratio of their times from the "
        "first batch to every row in ClickHouse (start-up excluded) says whether the work uses both "
        "cores. Both runs must load exactly the generator's distinct orders.",
        "- `cluster`: the same run against a Spark standalone cluster started from pip's pyspark (a "
        "master and two workers of one core each, `spark.cores.max` 2, on loopback). Exact only if the "
        "rows are the generator's and both workers' executors ran tasks (Spark's event log). On this "
        "machine the workers share the same two cores with the driver and the broker: the figure is the "
        "distributed plan's cost next to `local[2]`, not a speed-up.",
        "- `dedup_state`: silver built by Spark with N distinct keys in one day (inside one dedup "
        "window, so every batch's anti-join reads all of them); then a fresh process starts Spark, warms the step up "
        "on a small table, collects garbage and reads the JVM's RSS (driver and executor are one JVM in "
        "local mode), resets the kernel's peak-RSS mark (`/proc/<pid>/clear_refs`), and runs one batch "
        "(10% duplicates of stored keys, 90% new) through the engine's silver step (one aggregate per "
        "key, the anti-join with silver's window, the append). bytes/key = (the JVM's peak RSS during the step - its RSS "
        "before) / N. Beside it: the heap in use at its peak and after a GC, the whole JVM's peak RSS / N, "
        "and silver's Parquet bytes on disk / N. That batch's duplicates are spread over every stored key, the "
        "worst case; then a batch of keys that grow with time (duplicates of the newest keys, the rest above "
        "them) goes through the same step with its key range, as the stream's batches do: the silver files "
        "it read of those in the window, and its time.",
        "- Spark's own metrics: the bench's Spark sessions write Spark's event log; each completed "
        "stage's wall time and its tasks' executor run and CPU time are summed by what the job did "
        "(each batch write names its observed metrics in its plan; Delta names its log replay in the "
        "job description). Silver's commits come from its Delta log (read as JSON, no Spark job): the "
        "commits by operation and the write commits' operationMetrics, summed.",
        "- CPU: user + system seconds of each process below the bench (read from /proc), sampled "
        "every 0.1 s; a process that ends counts up to its last sample.",
        "",
    ]
