"""Spark's own account of a run: stage times from its event log, and the commits of silver's Delta log.

The bench's timings say how long a run took; these say where Spark spent it. Stage times
come from the event log (`spark.eventLog.enabled`, JSON lines): each completed stage's
wall time and its tasks' executor run and CPU time, grouped by what the job did (each of a
batch's writes names its observed metrics in its plan; Delta names its log replay in the job
description). What the run committed comes from silver's Delta log, read as JSON without Spark
(the engine's `DeltaLog`): the commits by operation and their write metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Delta's operationMetrics of a write commit that the page reports, summed over a run's commits.
COMMIT_METRICS = ("numFiles", "numOutputRows", "numOutputBytes")


KAFKA_READ = "Kafka read + parse + batch counts"
LOG_REPLAY = "Delta log replay (snapshot, files to read)"


# The engine names the observation of each of a batch's writes after its table
# (state/delta_spark.append_once) and the in-batch dedup's (ingest/dedup.py); the executed
# plan shows the name in its CollectMetrics node.
OBSERVED_STEPS = (
    ("rh_append_bronze", "bronze append (+ Kafka read + parse into the batch's cache)"),
    ("rh_append_quarantine", "quarantine append"),
    ("rh_dedup", "in-batch dedup (count of long keys; with a lookup, the window pass into its cache)"),
    ("rh_append_silver", "silver append (+ anti-join with silver's window)"),
)


def plan_kind(plan: str) -> str | None:
    """What a SQL execution did, from its physical plan; None when the plan does not say.

    Under Spark Connect a job's description is the client's plan message, and this engine's
    batch runs no MERGE; the plan of a Delta write's data is the query it writes, whose
    observation is named after the table.
    """
    for name, kind in OBSERVED_STEPS:
        if name in plan:
            return kind
    return None


def job_kind(description: str, stage_name: str = "", plan: str = "") -> str:
    """What a stage did, from its SQL execution's plan, its job's description (Delta names its
    operations there) and the stage's name.

    A streaming batch's jobs all carry the batch's description (`... batch = N`); Delta adds
    its operation to it, and the stage name says where the driver asked for the job.
    """
    text, name = description.upper(), stage_name.upper()
    if "COMPUTE SNAPSHOT" in text or "FILTERING FILES" in text:
        return LOG_REPLAY
    if plan and (kind := plan_kind(plan)) is not None:
        return kind
    if "MERGE" in text:  # results of the engine before issue 25
        return "silver MERGE (dedup + insert-only merge)"
    if "OPTIMIZE" in text or "COMPACT" in text:
        return "silver compaction (OPTIMIZE)"
    if "CLICKHOUSE" in name or "TOARROW" in name:
        return "ClickHouse load (change data feed read)"
    if name.startswith("SAVE AT"):
        return "Delta appends (bronze, quarantine)"
    if "GETHISTORY" in name:
        return "Delta history (table versions)"
    if "BATCH = " in text:
        return KAFKA_READ
    return "other"


def _accumulated(stage_info: dict[str, Any], name: str) -> float:
    for acc in stage_info.get("Accumulables") or []:
        if acc.get("Name") == name:
            try:
                return float(acc.get("Value") or 0)
            except (TypeError, ValueError):
                return 0.0
    return 0.0


def read_events(events_dir: Path) -> list[dict[str, Any]]:
    """Every event of every application logged under `events_dir`.

    A rolling log is a folder per application of `events_<n>_<app id>` files; a plain one is
    one file named after the application (`local-...` in local mode, `app-...` on a cluster).
    """
    events: list[dict[str, Any]] = []
    logs = (p for p in events_dir.rglob("*") if p.is_file() and p.name.startswith(("events_", "app-", "local-")))
    for log in sorted(logs):
        for line in log.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:  # the last line of a log still being written
                continue
    return events


def stage_times(events: list[dict[str, Any]], since_s: float = 0.0, until_s: float = float("inf")) -> dict[str, Any]:
    """Completed stages submitted in [since_s, until_s] (epoch seconds), grouped by job kind.

    Per kind: stages, tasks, the stages' wall time (submission to completion; stages of one
    job can overlap, so this may exceed the job's time), and the tasks' executor run and
    CPU time (summed over tasks: with two cores it can reach twice the wall time).
    """
    description_of_stage: dict[int, str] = {}
    plan_of_stage: dict[int, str] = {}
    plans: dict[str, str] = {}
    for event in events:
        if str(event.get("Event", "")).endswith("SQLExecutionStart"):
            plans[str(event.get("executionId"))] = event.get("physicalPlanDescription") or ""
        elif event.get("Event") == "SparkListenerJobStart":
            properties = event.get("Properties") or {}
            description = properties.get("spark.job.description") or ""
            execution = str(properties.get("spark.sql.execution.id") or "")
            for stage in event.get("Stage IDs") or []:
                description_of_stage[stage] = description
                plan_of_stage[stage] = plans.get(execution, "")
    out: dict[str, dict[str, float]] = {}
    for event in events:
        if event.get("Event") != "SparkListenerStageCompleted":
            continue
        info = event.get("Stage Info") or {}
        submitted, completed = info.get("Submission Time"), info.get("Completion Time")
        if submitted is None or completed is None or not since_s * 1000 <= submitted <= until_s * 1000:
            continue
        stage_id = info.get("Stage ID")
        kind = job_kind(
            description_of_stage.get(stage_id, ""), info.get("Stage Name") or "", plan_of_stage.get(stage_id, "")
        )
        row = out.setdefault(kind, {"stages": 0, "tasks": 0, "stage_s": 0.0, "executor_run_s": 0.0, "cpu_s": 0.0})
        row["stages"] += 1
        row["tasks"] += int(info.get("Number of Tasks") or 0)
        row["stage_s"] += (completed - submitted) / 1000
        row["executor_run_s"] += _accumulated(info, "internal.metrics.executorRunTime") / 1000
        row["cpu_s"] += _accumulated(info, "internal.metrics.executorCpuTime") / 1e9
    return {kind: {k: round(v, 3) for k, v in row.items()} for kind, row in out.items()}


def commit_history(path: str | Path, since_version: int = -1) -> dict[str, Any]:
    """The commits of the Delta table at `path` after `since_version`: how many, by operation, and
    the write commits' operationMetrics summed by name (read from the log, no Spark job)."""
    from riverhouse.platform.state.delta_log import DeltaLog

    log = DeltaLog(str(path))
    newest = log.latest_version()
    operations: dict[str, int] = {}
    totals: dict[str, int] = {}
    if newest is None:
        return {"commits": 0, "operations": operations}
    for commit in log.commits_back(newest, since_version + 1):
        operation = str(commit.info.get("operation") or "?")
        operations[operation] = operations.get(operation, 0) + 1
        if operation != "WRITE":
            continue
        for name, value in (commit.info.get("operationMetrics") or {}).items():
            if str(value).lstrip("-").isdigit():
                totals[name] = totals.get(name, 0) + int(value)
    return {
        "commits": sum(operations.values()),
        "operations": dict(sorted(operations.items())),
        **dict(sorted(totals.items())),
    }


def tasks_by_executor(events: list[dict[str, Any]]) -> dict[str, int]:
    """Tasks each executor ran ("driver" in local mode): on a cluster, which workers did the work."""
    out: dict[str, int] = {}
    for event in events:
        if event.get("Event") == "SparkListenerTaskEnd":
            executor = str((event.get("Task Info") or {}).get("Executor ID"))
            out[executor] = out.get(executor, 0) + 1
    return dict(sorted(out.items()))
