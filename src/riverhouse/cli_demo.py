"""`riverhouse demo`: the main job on the embedded defaults, local Kafka -> Spark -> Delta -> ClickHouse via Dagster."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from riverhouse.cli_support import (
    EngineOption,
    HomeOption,
    err,
    fail,
    guarded,
    load_spec_or_fail,
    out,
    print_summary,
    settings_for,
    start_local_engine,
)
from riverhouse.platform.runtime import engine, processes
from riverhouse.platform.runtime.spark import REMOTE_ENV
from riverhouse.platform.runtime.threads import in_background

DEMO_SPEC = Path("pipelines/orders_dedup.yaml")
DEMO_JOIN_SPEC = Path("pipelines/orders_enriched.yaml")


def demo(
    count: Annotated[int, typer.Option(help="Distinct orders to generate")] = 10_000,
    duplicate_rate: Annotated[float, typer.Option(help="Duplicates, fraction of count")] = 0.10,
    malformed: Annotated[int, typer.Option(help="Malformed records")] = 12,
    spec_file: Annotated[Path, typer.Option("--spec", help="Dedup pipeline spec")] = DEMO_SPEC,
    join_spec_file: Annotated[Path, typer.Option("--join-spec", help="Join pipeline spec")] = DEMO_JOIN_SPEC,
    skip_join: Annotated[bool, typer.Option("--skip-join", help="Only the dedup pipeline")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object")] = False,
    use_engine: EngineOption = True,
    home: HomeOption = None,
) -> None:
    """The whole thing on the embedded defaults: local Kafka -> Spark -> Delta -> ClickHouse via Dagster.

    Each run resets its own state under <home>/demo, so every run prints the same figures.
    """
    spec = load_spec_or_fail(spec_file)
    join_spec = None if skip_join else load_spec_or_fail(join_spec_file)
    base = settings_for(home)
    log = (lambda m: None) if as_json else (lambda m: err.print(m, highlight=False))
    # The engine of the base home (kept running if it was): the demo's own home is reset each run.
    # It starts in the background before anything else: Dagster's import, Kafka's start and the
    # produce overlap its JVM's start, and the runs wait for it.
    # pyspark first (0.1 s), here: the engine's thread imports it too, and two threads importing
    # one package at once can leave one of them a half-initialised module.
    import pyspark  # noqa: F401

    starting = in_background("engine-start", start_local_engine, base, use_engine, True)
    from riverhouse.demo import run_demo  # Dagster's import (~1 s): after the engine's start began
    from riverhouse.platform.runtime.spark import close_connect_sessions

    def engine_url() -> str | None:
        if not starting.done():
            log("waiting for the engine to answer...")
        where, _ = starting.result()
        log(f"engine: {where}")
        running = engine.status(base.engine_state_dir)
        return running.url if running and not os.environ.get(REMOTE_ENV) else None

    try:
        result = guarded(
            lambda: run_demo(
                spec,
                base.home / "demo",
                count=count,
                duplicate_rate=duplicate_rate,
                malformed=malformed,
                log=log,
                progress_console=None if as_json else err,
                join_spec=join_spec,
                engine_url=engine_url,
            )
        )
        # The result is printed before the engine the demo started stops (~0.5 s): the reader
        # need not wait for Spark's shutdown.
        if as_json:
            print(json.dumps({**result["summary"], "demo_run": _run_figures(result, starting)}), flush=True)
        else:
            _print_result(result, base.home / "demo", None if join_spec is None else join_spec.sink.table, starting)
    finally:
        engine_started = starting.exception() is None and starting.result()[1]  # waits for a start under way
        if engine_started:
            log("stopping the engine started for the demo...")
            close_connect_sessions()  # before their engine goes: pyspark's exit hook would wait for it
            engine.stop(base.engine_state_dir)
    if not _exact(result["summary"]):
        fail("the demo's ClickHouse tables do not match the generator's expected rows")


def _print_result(
    result: dict[str, Any], home: Path, join_table: str | None, starting: Future[tuple[str, bool]]
) -> None:
    print_summary("Riverhouse demo: deduplicated (and joined) into ClickHouse", result["summary"])
    columns, rows = result["sample"]
    sample = Table(title="sample rows in ClickHouse" + (f" ({join_table})" if join_table else ""), header_style="bold")
    for col in columns:
        sample.add_column(col)
    for row in rows:
        sample.add_row(*[str(v) for v in row])
    out.print(sample)
    checks = ", ".join(f"{name}: {'passed' if ok else 'FAILED'}" for name, ok in result["checks"].items())
    out.print(f"asset checks: {checks}", highlight=False)
    run = _run_figures(result, starting)
    out.print(
        f"wall time {run['wall_seconds']:.1f}s from the command's start, of which {run['dagster_runs_seconds']:.1f}s "
        f"in the pipelines' Dagster runs; {run['records_per_second']:,.0f} records/s through the dedup "
        "pipeline (Kafka -> Delta -> ClickHouse, including the first batch's warm-up)",
        highlight=False,
    )
    started = " (started for the demo: it stops as the demo ends)" if run["engine_started_for_demo"] else ""
    out.print(f"engine: {run['engine']}{started}", highlight=False)
    out.print(f"state kept in {home}; look at it in the UI with `riverhouse ui --home {home}`", highlight=False)


def _run_figures(result: dict[str, Any], starting: Future[tuple[str, bool]]) -> dict[str, Any]:
    """How the demo ran, for both outputs: its wall time, the Dagster runs' share, where Spark ran."""
    where, started = starting.result()
    return {
        "wall_seconds": round(seconds_since_start(), 1),
        "dagster_runs_seconds": round(result["runs_seconds"], 1),
        "records_per_second": round(result["records_per_second"]),
        "engine": where,
        "engine_started_for_demo": started,
    }


def seconds_since_start() -> float:
    """Wall seconds since this process started (its interpreter's start and imports included)."""
    ticks = processes.start_ticks("self")
    if ticks is None or not hasattr(time, "CLOCK_BOOTTIME"):  # not Linux: since this module's import
        return time.monotonic() - _IMPORTED
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


_IMPORTED = time.monotonic()


def _exact(summary: dict[str, Any]) -> bool:
    """ClickHouse holds what the generator says it should: every distinct order once (and the join's rows)."""
    ok = summary["clickhouse_duplicate_keys"] == 0 and summary["clickhouse_rows"] == summary["expected_unique"]
    if "expected_joined" in summary:
        ok = ok and summary["join_duplicate_keys"] == 0 and summary["joined_rows"] == summary["expected_joined"]
        ok = ok and summary["unmatched_left"] == summary["expected_unmatched"]
    return bool(ok)
