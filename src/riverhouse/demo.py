"""`riverhouse demo`: the main job on the embedded defaults, run through Dagster.

Resets its own state folder, starts a fresh local Kafka, generates orders with
duplicates and malformed records, materializes the pipeline's assets and checks
with `dg.materialize` on the Dagster instance under the demo's home (what
`riverhouse ui --home` shows), and compares ClickHouse with the generator's own count.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import dagster as dg

from riverhouse.assets import build_pipeline_assets
from riverhouse.assets.pipelines import MODE_TAG, live_partition_key
from riverhouse.deploy import local_dagster_home
from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.kafka.generator import (
    GeneratorConfig,
    expected_join,
    orders,
    produce,
    user_events,
)
from riverhouse.platform.pipeline import Pipeline, PipelineError
from riverhouse.platform.runtime import engine
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.settings import Settings
from riverhouse.resources import resources_from_settings


def reset_state(home: Path) -> None:
    """Stop the state folder's local Kafka and engine; delete its tables, checkpoints and ClickHouse."""
    local_kafka.stop(home / "kafka")
    engine.stop(home / "engine")
    if home.exists():
        shutil.rmtree(home)


def materialize_pipeline(
    spec: PipelineSpec,
    settings: Settings,
    log_level: str = "WARNING",
    drain: bool = False,
    partition_key: str | None = None,
    instance: dg.DagsterInstance | None = None,
) -> dg.ExecuteInProcessResult:
    """A stream run of every asset (`partition_key`: a rebuild run of that partition instead).

    `instance`: where the run, its materializations and check results are recorded (an
    ephemeral instance when None).
    """
    assets = build_pipeline_assets(spec, settings)
    run_config: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    if spec.is_join and drain:
        gold_op = "__".join(["gold", spec.name, spec.sink.table])
        run_config["ops"] = {gold_op: {"config": {"drain": True}}}
    return dg.materialize(
        assets,
        resources=resources_from_settings(settings),
        run_config=run_config,
        partition_key=partition_key or live_partition_key(spec),
        tags={MODE_TAG: "rebuild" if partition_key else "stream"},
        raise_on_error=False,
        instance=instance,
    )


class StepReporter:
    """Prints each step of the demo's Dagster runs as it ends (a run is otherwise silent for
    seconds on end): a thread reads the runs' step events from the instance's storage."""

    EVERY_S = 0.5

    def __init__(self, dagster_home: Path, log: Callable[[str], None]):
        self.dagster_home = dagster_home
        self.log = log
        self._stop = threading.Event()
        self._printed: set[tuple[str, str]] = set()

    def __enter__(self) -> StepReporter:
        # An instance of its own: this thread only reads what the runs' thread writes.
        self.instance = dg.DagsterInstance.from_config(str(self.dagster_home))
        self._before = {run.run_id for run in self.instance.get_runs(limit=10)}
        self._thread = threading.Thread(target=self._follow, name="riverhouse-demo-steps", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # the run's last steps, before the demo prints on
        self.instance.dispose()

    def _follow(self) -> None:
        while not self._stop.wait(self.EVERY_S):
            self.poll()

    def poll(self) -> None:
        ended = {dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE}
        try:
            runs = [r for r in self.instance.get_runs(limit=3, ascending=False) if r.run_id not in self._before]
            for run in reversed(runs):
                for entry in self.instance.all_logs(run.run_id, of_type=ended):
                    event = entry.dagster_event
                    if event is None or (run.run_id, event.step_key or "") in self._printed:
                        continue
                    self._printed.add((run.run_id, event.step_key or ""))
                    took = getattr(event.event_specific_data, "duration_ms", None)
                    outcome = "done" if event.event_type == dg.DagsterEventType.STEP_SUCCESS else "FAILED"
                    self.log(f"  step {event.step_key} {outcome}" + (f" in {took / 1000:.1f}s" if took else ""))
        except Exception:  # the progress lines are a courtesy: a busy SQLite file must not fail the demo
            return


def _require_success(result: dg.ExecuteInProcessResult, what: str) -> None:
    if not result.success:
        failures = [e.message for e in result.all_events if e.is_failure and e.message]
        raise PipelineError(f"the demo's {what} run failed: " + (failures[-1] if failures else "see the Dagster logs"))


def _produce(bootstrap: str, topic: str, records: Any, total: int, progress_console: Any) -> None:
    if progress_console is None:
        produce(bootstrap, topic, records)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn(f"producing to {topic}"), BarColumn(), MofNCompleteColumn(), console=progress_console
    ) as progress:
        task = progress.add_task("produce", total=total)
        produce(bootstrap, topic, records, on_progress=lambda n: progress.advance(task, n))


def materialization_metadata(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization  # type: ignore[union-attr]
        assert mat is not None
        out[mat.asset_key.to_user_string()] = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    return out


def check_results(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def run_demo(
    spec: PipelineSpec,
    home: Path,
    count: int = 10_000,
    duplicate_rate: float = 0.10,
    malformed: int = 12,
    log: Callable[[str], None] = print,
    progress_console: Any = None,
    join_spec: PipelineSpec | None = None,
    engine_url: Callable[[], str | None] = lambda: None,
) -> dict[str, Any]:
    """`engine_url`: waits for the Spark Connect engine the runs attach to (None: as the home's settings say).

    Called once the topics are produced, so an engine may start while Kafka does.
    """
    started = time.monotonic()
    home = home.resolve()
    log(f"resetting demo state in {home}")
    reset_state(home)
    settings = Settings.from_env(home).with_(kafka_bootstrap=None)
    # The demo's broker lives for this command only: C1 alone, like the demo's engine (4-5 of its
    # ~11 CPU seconds were C2's compilations; bench/analysis.md).
    state = local_kafka.start(settings.kafka_state_dir, java_options=engine.SHORT_LIVED_JAVA_OPTIONS)
    log(f"local Kafka started at {state.bootstrap}")
    # The runs go to the Dagster instance `riverhouse ui --home <home>` opens, so the UI shows
    # the demo's runs, materializations, check results and plots.
    dagster_home = local_dagster_home(settings.home / "dagster")
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    try:
        cfg = GeneratorConfig(
            count=count, duplicate_rate=duplicate_rate, malformed=malformed, users=max(10, count // 10)
        )
        records, stats = orders(cfg)
        total = count + round(count * duplicate_rate) + malformed
        _produce(state.bootstrap, spec.sink_source.topic, records, total, progress_console)
        log(
            f"produced {stats.messages:,} orders: {stats.unique:,} distinct, "
            f"{stats.duplicates:,} duplicates, {stats.malformed} malformed"
        )
        user_stats = None
        if join_spec is not None:
            user_records, user_stats = user_events(replace(cfg, malformed=2))
            _produce(
                state.bootstrap,
                join_spec.sources[join_spec.plan.steps[0].source].topic,
                user_records,
                None,
                progress_console,
            )
            log(
                f"produced {user_stats.messages:,} user events: {user_stats.unique:,} distinct, "
                f"{user_stats.duplicates:,} duplicates, {user_stats.malformed} malformed"
            )
        if spark_remote := engine_url():
            settings = settings.with_(spark_conf={**settings.spark_conf, "spark.remote": spark_remote})
        log("materializing the dedup pipeline's assets through Dagster...")
        pipeline_started = time.monotonic()
        with StepReporter(dagster_home, log):
            result = materialize_pipeline(spec, settings, instance=instance)
        pipeline_seconds = time.monotonic() - pipeline_started
        _require_success(result, spec.name)
        meta = materialization_metadata(result)
        checks = check_results(result)
        bronze_key = f"bronze/{spec.name}/{spec.sink_source_name}"
        pipeline = Pipeline(spec, settings, log=log)
        ch = pipeline.clickhouse_stats()
        summary: dict[str, Any] = {
            "read": int(meta[bronze_key]["records_in"]),
            "duplicates_dropped": int(meta[bronze_key]["duplicates_dropped"]),
            "quarantined": int(meta[bronze_key]["quarantined"]),
            "silver_rows": pipeline.silver_rows(),
            "clickhouse_rows": ch["rows"],
            "clickhouse_duplicate_keys": ch["duplicate_keys"],
            "expected_unique": stats.expected_unique,
        }
        runs_seconds = pipeline_seconds
        if join_spec is not None and user_stats is not None:
            log(f"materializing the join pipeline {join_spec.name} (windows drained: the input is complete)...")
            join_started = time.monotonic()
            with StepReporter(dagster_home, log):
                join_result = materialize_pipeline(join_spec, settings, drain=True, instance=instance)
            runs_seconds += time.monotonic() - join_started
            _require_success(join_result, join_spec.name)
            checks.update({f"{join_spec.name}: {k}": v for k, v in check_results(join_result).items()})
            window = join_spec.plan.steps[0].window
            assert window is not None
            reference = expected_join(stats, user_stats, window)
            summary.update(Pipeline(join_spec, settings, log=log).join_stats("user_name"))
            summary["expected_joined"] = reference["expected_joined"]
            summary["expected_unmatched"] = reference["expected_unmatched"]
            gold_meta = materialization_metadata(join_result)[f"gold/{join_spec.name}/{join_spec.sink.table}"]
            summary["join_late_matches"] = int(gold_meta["late_matches"])
        return {
            "summary": summary,
            "sample": Pipeline(join_spec or spec, settings, log=log).sample_rows(5),
            "checks": checks,
            "seconds": time.monotonic() - started,
            "runs_seconds": runs_seconds,  # the Dagster runs of the pipelines, from the first one's start
            "records_per_second": summary["read"] / max(pipeline_seconds, 1e-6),
        }
    finally:
        instance.dispose()
        local_kafka.stop(settings.kafka_state_dir)
