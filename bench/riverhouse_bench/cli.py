"""The bench's command line: `python -m riverhouse_bench [--events N --scenarios ...]` (= `make bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from riverhouse.cli_support import HomeOption, err, fail, out, settings_for
from riverhouse_bench.common import OPTIONAL_SCENARIOS, REPO, SCENARIOS, BenchConfig

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def bench(
    events: Annotated[int, typer.Option(help="Distinct orders per throughput scenario", min=1000)] = 2_000_000,
    duplicate_rate: Annotated[float, typer.Option(help="Extra duplicate copies, fraction of events", min=0.0)] = 0.1,
    partitions: Annotated[int, typer.Option(help="Partitions of every topic the bench creates (1-32)", min=1)] = 8,
    scenarios: Annotated[str, typer.Option(help="Comma-separated scenarios, or all")] = "all",
    freshness_rate: Annotated[float, typer.Option(help="freshness: events/s produced")] = 20_000.0,
    freshness_seconds: Annotated[float, typer.Option(help="freshness: seconds of production measured")] = 60.0,
    freshness_warmup: Annotated[
        float, typer.Option(help="freshness: seconds of production before the measured ones (not counted)", min=0)
    ] = 15.0,
    state_keys: Annotated[
        str, typer.Option(help="dedup_state: keys held in silver, comma-separated")
    ] = "1000000,10000000",
    final_scale: Annotated[
        str, typer.Option(help="query_vs_final: also on this many generated orders, comma-separated ('none': skip)")
    ] = "2000000",
    steady_runs: Annotated[
        int,
        typer.Option(help="riverhouse_dedup / _join: warm runs after the first; the median is the steady state", min=1),
    ] = 5,
    warmup_runs: Annotated[
        int,
        typer.Option(
            help="riverhouse_dedup (with spark_plain beside it) / _join: unmeasured warm runs before the steady "
            "ones, while the JIT still compiles",
            min=0,
        ),
    ] = 5,
    small_batches: Annotated[
        int, typer.Option(help="small_batches: batches measured (after a warm-up run of 5)", min=2)
    ] = 20,
    small_batch_records: Annotated[
        int, typer.Option(help="small_batches: records per batch (maxOffsetsPerTrigger)", min=100)
    ] = 7000,
    triggered_runs: Annotated[
        int, typer.Option(help="triggered_start: Dagster runs with the engine warm (RIVERHOUSE_SPARK_REMOTE)", min=1)
    ] = 10,
    triggered_cold_runs: Annotated[
        int, typer.Option(help="triggered_start: Dagster runs without an engine (each starts its own Spark)", min=0)
    ] = 2,
    triggered_events: Annotated[
        int, typer.Option(help="triggered_start: records produced before each run", min=1)
    ] = 7000,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="avro: also run riverhouse_dedup on the same orders as Avro through the local schema "
            "registry (riverhouse_dedup_avro), beside JSON's",
        ),
    ] = "json",
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Also run jvm_profile: a warm riverhouse_dedup run with Java Flight Recorder on the engine's "
            "JVM; writes profile-<time>.json/.md next to the results",
        ),
    ] = False,
    results: Annotated[Path, typer.Option(help="Folder for <timestamp>.json and latest.json")] = REPO
    / "bench"
    / "results",
    docs: Annotated[Path, typer.Option(help="Markdown page to render (a PNG goes next to it)")] = REPO
    / "docs"
    / "benchmarks.md",
    home: HomeOption = None,
) -> None:
    """Benchmark every scenario in one run; write bench/results/*.json and docs/benchmarks.md."""
    chosen = SCENARIOS if scenarios.strip() == "all" else tuple(x.strip() for x in scenarios.split(",") if x.strip())
    if profile and "jvm_profile" not in chosen:
        chosen = (*chosen, "jvm_profile")
    if fmt not in ("json", "avro"):
        fail(f"--format must be json or avro, got {fmt!r}")
    if fmt == "avro" and "riverhouse_dedup_avro" not in chosen:
        chosen = (*chosen, "riverhouse_dedup_avro")
    unknown = [x for x in chosen if x not in SCENARIOS + OPTIONAL_SCENARIOS]
    if unknown:
        fail(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS + OPTIONAL_SCENARIOS)}")
    try:
        keys = tuple(int(k) for k in state_keys.split(",") if k.strip())
    except ValueError:
        fail(f"--state-keys takes whole numbers separated by commas (e.g. 1000000,10000000), got {state_keys!r}")
    if not keys or min(keys) < 1000:
        fail("--state-keys needs at least one count of 1,000 keys or more")
    scale_text = "" if final_scale.strip().lower() == "none" else final_scale
    try:
        scales = tuple(int(n) for n in scale_text.split(",") if n.strip())
    except ValueError:
        fail(f"--final-scale takes whole numbers separated by commas, or none, got {final_scale!r}")
    if scales and min(scales) < 1000:
        fail("--final-scale needs counts of 1,000 orders or more")
    cfg = BenchConfig(
        events=events,
        duplicate_rate=duplicate_rate,
        partitions=partitions,
        scenarios=chosen,
        freshness_rate=freshness_rate,
        freshness_seconds=freshness_seconds,
        freshness_warmup=freshness_warmup,
        state_keys=keys,
        final_scale=scales,
        steady_runs=steady_runs,
        warmup_runs=warmup_runs,
        small_batches=small_batches,
        small_batch_records=small_batch_records,
        triggered_runs=triggered_runs,
        triggered_cold_runs=triggered_cold_runs,
        triggered_events=triggered_events,
        home=settings_for(home).home / "bench",
        results_dir=results,
        docs=docs,
    )
    if problems := cfg.problems():
        fail("; ".join(problems))
    # The product's own handling of the errors a user can hit (no Kafka, no Java, ...): one message, exit 1.
    from riverhouse.cli_support import guarded
    from riverhouse_bench.harness import run_bench
    from riverhouse_bench.results import targets

    result, path = guarded(lambda: run_bench(cfg, log=lambda m: err.print(m, highlight=False)))
    table = Table(title="riverhouse bench", show_header=True, header_style="bold")
    for column in ("scenario", "events", "seconds", "events/s", "excl. start-up", "exact"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    for name, r in result["scenarios"].items():

        def num(value: Any, spec: str = "{:,.0f}") -> str:
            return spec.format(value) if isinstance(value, int | float) else "-"

        table.add_row(
            name,
            num(r.get("events")),
            num(r.get("seconds"), "{:,.1f}"),
            num(r.get("events_per_s")),
            num(r.get("events_per_s_excluding_startup")),
            "yes" if r.get("exact") else "NO",
        )
    out.print(table)
    for name, measured, verdict, _ in targets(result):
        out.print(f"  {name}: {measured} {verdict}", highlight=False)
    out.print(f"results: {path} (and {path.parent / 'latest.json'}); page: {docs}")


def main() -> None:
    app(prog_name="python -m riverhouse_bench")
