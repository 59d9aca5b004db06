"""Jobs, the Kafka-lag sensor, the optional schedule and the continuous-mode job of a pipeline."""

import json
import threading
import time
from typing import Any

import dagster as dg

from riverhouse.assets.pipelines import MODE_TAG, live_partition_key
from riverhouse.platform.spec import PipelineSpec
from riverhouse.resources import Riverhouse

PIPELINE_TAG = "riverhouse/pipeline"
ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def job_name(spec: PipelineSpec) -> str:
    return f"{spec.name}_job"


def pipeline_job(spec: PipelineSpec) -> Any:
    # In-process: one Spark session per run, and the embedded ClickHouse (chDB) can be
    # open in one process at a time.
    return dg.define_asset_job(
        name=job_name(spec),
        selection=dg.AssetSelection.groups(spec.name),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: spec.name, MODE_TAG: "stream"},
        description=(
            f"Stream run of pipeline {spec.name}: Kafka -> Delta -> ClickHouse, everything now in Kafka. "
            "The partition only labels the run; data of every day is published."
        ),
    )


def _run_key(spec: PipelineSpec, end_offsets: dict[str, dict[str, int]]) -> str:
    """Same Kafka end offsets, same key: a tick that sees nothing new cannot request a second run."""
    parts = [
        f"{topic}/{p}={off}"
        for topic in sorted(end_offsets)
        for p, off in sorted(end_offsets[topic].items(), key=lambda kv: int(kv[0]))
    ]
    return f"{spec.name}@" + ",".join(parts)


def _retries_after_failure(context: dg.SensorEvaluationContext, cursor: dict[str, Any], base_key: str) -> int:
    """How many times to have retried the run for these end offsets.

    Dagster launches a run key once. When the run for these offsets failed (a killed run
    worker, a broker outage), nothing new may arrive to change the offsets, so the retry
    gets a key of its own: `<key>#retry<n>`. Replaying it is safe: runs are exactly once.
    """
    retries = int(cursor.get("retries") or 0)
    if cursor.get("base_run_key") != base_key:
        return 0
    last = cursor.get("last_run_key")
    if context.instance is None or not last:
        return retries
    runs = context.instance.get_runs(filters=dg.RunsFilter(tags={"dagster/run_key": last}), limit=1)
    if runs and runs[0].status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
        return retries + 1
    return retries


def lag_sensor(spec: PipelineSpec) -> dg.SensorDefinition:
    cfg = spec.orchestration.sensor
    min_lag, max_delay = cfg.min_lag, cfg.max_delay.total_seconds()

    @dg.sensor(
        name=f"{spec.name}_kafka_lag_sensor",
        job_name=job_name(spec),
        minimum_interval_seconds=max(1, int(cfg.interval.total_seconds())),
        default_status=dg.DefaultSensorStatus.RUNNING if cfg.enabled else dg.DefaultSensorStatus.STOPPED,
        description=(
            f"Requests a stream run of {spec.name} when {min_lag:,} records wait in Kafka, or when "
            f"a record has waited {cfg.max_delay} (orchestration.sensor in the spec)."
        ),
    )
    def kafka_lag(context: dg.SensorEvaluationContext, riverhouse: Riverhouse) -> Any:
        cursor: dict[str, Any] = json.loads(context.cursor) if context.cursor else {}
        now = time.time()
        try:
            # A broker whose port is closed skips the tick in ~2 s, not the metadata timeout's
            # 15 s (a sensor's tick has 60): the next tick asks again.
            lag = riverhouse.pipeline(spec, context.log.info).lag(closed_is_final=True)
        except Exception as exc:  # the daemon must keep running whatever Kafka does
            return dg.SkipReason(f"Kafka is unreachable for pipeline {spec.name}: {exc}")
        waiting = lag.total
        if waiting == 0:
            context.update_cursor(json.dumps({**cursor, "pending_since": None, "lag": 0}))
            return dg.SkipReason(f"no new records in {', '.join(s.topic for s in lag.sources)}")
        pending_since = cursor.get("pending_since") or now
        age = now - pending_since
        if context.instance is not None and context.instance.get_runs(
            filters=dg.RunsFilter(job_name=job_name(spec), statuses=ACTIVE), limit=1
        ):
            context.update_cursor(json.dumps({**cursor, "pending_since": pending_since, "lag": waiting}))
            return dg.SkipReason(f"{waiting:,} records waiting; a run of {job_name(spec)} is already in progress")
        if waiting < min_lag and age < max_delay:
            context.update_cursor(json.dumps({**cursor, "pending_since": pending_since, "lag": waiting}))
            return dg.SkipReason(
                f"{waiting:,} records waiting (below min_lag {min_lag:,}) for {age:.0f}s (below max_delay "
                f"{max_delay:.0f}s)"
            )
        base_key = _run_key(spec, lag.end_offsets)
        retries = _retries_after_failure(context, cursor, base_key)
        run_key = base_key if retries == 0 else f"{base_key}#retry{retries}"
        context.update_cursor(
            json.dumps(
                {
                    "pending_since": None,
                    "lag": waiting,
                    "last_run_key": run_key,
                    "base_run_key": base_key,
                    "retries": retries,
                    "requested_end_offsets": lag.end_offsets,
                }
            )
        )
        reason = "min_lag" if waiting >= min_lag else "max_delay"
        return dg.RunRequest(
            run_key=run_key,
            partition_key=live_partition_key(spec),
            tags={
                PIPELINE_TAG: spec.name,
                MODE_TAG: "stream",
                "riverhouse/lag": str(waiting),
                "riverhouse/trigger": reason,
            },
        )

    return kafka_lag


def pipeline_schedule(spec: PipelineSpec) -> dg.ScheduleDefinition | None:
    cron = spec.orchestration.schedule
    if cron is None:
        return None

    @dg.schedule(
        name=f"{spec.name}_schedule",
        cron_schedule=cron,
        job_name=job_name(spec),
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Stream run of {spec.name} on `{cron}` (UTC), whatever the lag.",
    )
    def scheduled(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        tick = context.scheduled_execution_time
        return dg.RunRequest(
            run_key=f"{spec.name}@{tick.isoformat()}",
            partition_key=live_partition_key(spec, tick),
            tags={PIPELINE_TAG: spec.name, MODE_TAG: "stream", "riverhouse/trigger": "schedule"},
        )

    return scheduled


class ContinuousConfig(dg.Config):
    # 0 = until the run is terminated from the UI; otherwise stop cleanly after this long.
    run_for_seconds: float = 0.0


def continuous_job(spec: PipelineSpec) -> dg.JobDefinition:
    @dg.op(
        name=f"{spec.name}_continuous",
        description=(
            f"Keeps {spec.name}'s streaming queries running (a micro-batch every "
            f"{spec.orchestration.trigger_interval}) until the run is terminated; a terminate "
            "finishes the current batch and publishes it."
        ),
    )
    def run_stream(context: dg.OpExecutionContext, config: ContinuousConfig, riverhouse: Riverhouse) -> None:
        pipeline = riverhouse.pipeline(spec, context.log.info)
        stop = threading.Event()
        outcome: dict[str, Any] = {}

        def body() -> None:
            try:
                outcome["summary"] = pipeline.continuous(stop)
            except BaseException as exc:
                outcome["error"] = exc

        worker = threading.Thread(target=body, name=f"riverhouse-continuous-{spec.name}", daemon=True)
        worker.start()
        deadline = time.monotonic() + config.run_for_seconds if config.run_for_seconds > 0 else None
        try:
            while worker.is_alive():
                worker.join(timeout=1.0)
                if deadline is not None and time.monotonic() >= deadline:
                    stop.set()
        except BaseException:
            # Terminated from the UI: stop cleanly (finish the batch in flight), then report.
            context.log.info("termination requested: finishing the current batch")
            stop.set()
            worker.join()
            raise
        if "error" in outcome:
            raise outcome["error"]
        context.log.info(f"continuous run finished: {outcome.get('summary')}")
        context.add_output_metadata(
            {k: v for k, v in (outcome.get("summary") or {}).items() if isinstance(v, int | float | str)}
        )

    @dg.job(
        name=f"{spec.name}_continuous_job",
        tags={PIPELINE_TAG: spec.name, MODE_TAG: "stream"},
        executor_def=dg.in_process_executor,
        description=f"Continuous mode of {spec.name} (`riverhouse run --continuous` inside a Dagster run).",
    )
    def continuous() -> None:
        run_stream()

    return continuous


def build_orchestration(spec: PipelineSpec) -> tuple[list[Any], list[Any], list[Any]]:
    """(jobs, sensors, schedules) of one pipeline."""
    schedule = pipeline_schedule(spec)
    return [pipeline_job(spec), continuous_job(spec)], [lag_sensor(spec)], ([schedule] if schedule else [])
