"""`riverhouse demo`: the main job on the embedded defaults, run through Dagster.

Resets its own state folder, starts a fresh local Kafka, generates orders with
duplicates and malformed records, materializes the pipeline's assets and checks
with `dg.materialize`, and compares ClickHouse with the generator's own count.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from riverhouse.assets import build_pipeline_assets
from riverhouse.platform import local_kafka
from riverhouse.platform.clickhouse import sample_rows, table_stats
from riverhouse.platform.generator import GeneratorConfig, orders, produce
from riverhouse.platform.pipeline import PipelineError
from riverhouse.platform.quality import delta_row_count
from riverhouse.platform.settings import Settings
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.tables import TableLayout
from riverhouse.resources import resources_from_settings

QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def reset_state(home: Path) -> None:
    """Stop the state folder's local Kafka and delete its tables, checkpoints and ClickHouse."""
    local_kafka.stop(home / "kafka")
    if home.exists():
        shutil.rmtree(home)


def materialize_pipeline(spec: PipelineSpec, settings: Settings, log_level: str = "WARNING") -> dg.ExecuteInProcessResult:
    assets, checks = build_pipeline_assets(spec)
    return dg.materialize(
        [*assets, *checks],
        resources=resources_from_settings(settings),
        run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
        raise_on_error=False,
    )


def materialization_metadata(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization  # type: ignore[union-attr]
        assert mat is not None
        out[mat.asset_key.to_user_string()] = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    return out


def check_results(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def run_demo(spec: PipelineSpec, home: Path, count: int = 10_000, duplicate_rate: float = 0.10,
             malformed: int = 12, log: Callable[[str], None] = print, progress_console: Any = None) -> dict[str, Any]:
    started = time.monotonic()
    home = home.resolve()
    log(f"resetting demo state in {home}")
    reset_state(home)
    settings = Settings.from_env(home).with_(kafka_bootstrap=None)
    state = local_kafka.start(settings.kafka_state_dir)
    log(f"local Kafka started at {state.bootstrap}")
    try:
        cfg = GeneratorConfig(count=count, duplicate_rate=duplicate_rate, malformed=malformed)
        records, stats = orders(cfg)
        topic = spec.sink_source.topic
        total = count + round(count * duplicate_rate) + malformed
        if progress_console is not None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            with Progress(TextColumn(f"producing to {topic}"), BarColumn(), MofNCompleteColumn(),
                          console=progress_console) as progress:
                task = progress.add_task("produce", total=total)
                produce(state.bootstrap, topic, records, on_progress=lambda n: progress.advance(task, n))
        else:
            produce(state.bootstrap, topic, records)
        log(f"produced {stats.messages:,} messages: {stats.unique:,} distinct orders, "
            f"{stats.duplicates:,} duplicates, {stats.malformed} malformed")
        log("materializing the pipeline's assets through Dagster (Spark start-up takes a few seconds)...")
        pipeline_started = time.monotonic()
        result = materialize_pipeline(spec, settings)
        pipeline_seconds = time.monotonic() - pipeline_started
        if not result.success:
            failures = [e.message for e in result.all_events if e.is_failure and e.message]
            raise PipelineError("the demo run failed: " + (failures[-1] if failures else "see the Dagster logs"))
        meta = materialization_metadata(result)
        silver_key = f"silver/{spec.name}/{spec.sink_source_name}"
        layout = TableLayout(settings.warehouse, spec.name)
        ch = table_stats(settings.clickhouse_dsn, spec)
        summary = {
            "read": int(meta[silver_key]["records_in"]),
            "duplicates_dropped": int(meta[silver_key]["duplicates_dropped"]),
            "quarantined": int(meta[silver_key]["quarantined"]),
            "silver_rows": delta_row_count(layout.silver(spec.sink_source_name)),
            "clickhouse_rows": ch["rows"],
            "clickhouse_duplicate_keys": ch["duplicate_keys"],
            "expected_unique": stats.expected_unique,
        }
        return {
            "summary": summary,
            "sample": sample_rows(settings.clickhouse_dsn, spec, 5),
            "checks": check_results(result),
            "seconds": time.monotonic() - started,
            "records_per_second": summary["read"] / max(pipeline_seconds, 1e-6),
        }
    finally:
        local_kafka.stop(settings.kafka_state_dir)
