"""Spark's event log read back by the bench: stage times grouped by what the job did, tasks by executor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from riverhouse_bench.spark_metrics import job_kind, read_events, stage_times, tasks_by_executor

pytestmark = pytest.mark.unit


def _stage(stage_id: int, submitted_ms: int, completed_ms: int, tasks: int, run_ms: int, cpu_ns: int) -> dict:
    return {
        "Event": "SparkListenerStageCompleted",
        "Stage Info": {
            "Stage ID": stage_id,
            "Number of Tasks": tasks,
            "Submission Time": submitted_ms,
            "Completion Time": completed_ms,
            "Accumulables": [
                {"ID": 1, "Name": "internal.metrics.executorRunTime", "Value": run_ms},
                {"ID": 2, "Name": "internal.metrics.executorCpuTime", "Value": cpu_ns},
            ],
        },
    }


def _job(stage_ids: list[int], description: str) -> dict:
    return {
        "Event": "SparkListenerJobStart",
        "Stage IDs": stage_ids,
        "Properties": {"spark.job.description": description},
    }


BATCH = "riverhouse_x_orders\nid = 1\nrunId = 2\nbatch = 0"


def test_job_kinds_follow_deltas_operation_names_and_the_stage_names() -> None:
    """Descriptions and stage names as Spark 4.2 + Delta 4.4 log them for a streaming batch."""
    merge = f"{BATCH} - MERGE operation - writing new files for only inserts"
    assert job_kind(merge, "$anonfun$recordDeltaOperationInternal$1 at DatabricksLogging.scala:128").startswith(
        "silver MERGE"
    )
    assert job_kind(f"Delta: {BATCH}: Compute snapshot for version: 0", "x at CompletableFuture.java:1768") == (
        "Delta log replay (snapshot, files to read)"
    )
    assert job_kind(f"Delta: {BATCH}: Filtering files for query", "").startswith("Delta log replay")
    assert job_kind(BATCH, "save at NativeMethodAccessorImpl.java:0").startswith("Delta appends")
    assert job_kind(BATCH, "call at py4j/clientserver.py:644") == "Kafka read + parse + batch counts"
    assert job_kind("", "toArrow at riverhouse/platform/sink/clickhouse.py:511").startswith("ClickHouse load")
    assert job_kind("Delta: OPTIMIZE: Compacting files").startswith("silver compaction")
    assert job_kind("", "getHistory at DeltaTableOperations.scala:60").startswith("Delta history")
    assert job_kind("") == "other"


def test_stage_times_sum_by_kind_within_the_window(tmp_path: Path) -> None:
    events = [
        _job([1, 2], f"{BATCH} - MERGE operation - writing new files for only inserts"),
        _job([3], BATCH),
        _stage(1, 10_000, 12_500, tasks=4, run_ms=4_000, cpu_ns=3_000_000_000),
        _stage(2, 12_500, 13_000, tasks=1, run_ms=500, cpu_ns=250_000_000),
        _stage(3, 9_000, 9_800, tasks=8, run_ms=1_200, cpu_ns=1_000_000_000),
        _stage(4, 20_000, 21_000, tasks=2, run_ms=100, cpu_ns=0),  # after the window
    ]
    folder = tmp_path / "eventlog_v2_app-1"
    folder.mkdir()
    (folder / "events_1_app-1").write_text("\n".join(json.dumps(e) for e in events) + "\n{truncated")
    read = read_events(tmp_path)
    assert len(read) == len(events)  # the half-written last line is skipped
    times = stage_times(read, since_s=9.0, until_s=15.0)
    merge = times["silver MERGE (dedup + insert-only merge)"]
    assert merge == {"stages": 2, "tasks": 5, "stage_s": 3.0, "executor_run_s": 4.5, "cpu_s": 3.25}
    assert times["Kafka read + parse + batch counts"]["stage_s"] == 0.8
    assert set(times) == {"silver MERGE (dedup + insert-only merge)", "Kafka read + parse + batch counts"}
    assert stage_times(read, since_s=9.5, until_s=15.0).keys() == {"silver MERGE (dedup + insert-only merge)"}


def test_tasks_by_executor_counts_each_task_once() -> None:
    events = [{"Event": "SparkListenerTaskEnd", "Task Info": {"Executor ID": e}} for e in ("0", "1", "1", "driver")]
    assert tasks_by_executor(events) == {"0": 1, "1": 2, "driver": 1}


def test_a_batchs_steps_are_told_apart_by_their_observations_in_the_plan() -> None:
    """The physical plans as Spark 4.2 logs them for this engine's batch (abridged from a real event log)."""
    from riverhouse_bench.spark_metrics import job_kind, plan_kind

    bronze = "== Physical Plan ==\nCollectMetrics (6)\n+- * Project (5)\n(6) CollectMetrics\nArguments: rh_append_bronze, [count(1) AS _rows#1L]"
    silver = "AdaptiveSparkPlan (40)\n+- CollectMetrics (39)\n   +- BroadcastHashJoin LeftAnti BuildRight\nArguments: rh_append_silver, [count(1)]"
    dedup = "AdaptiveSparkPlan (20)\n+- CollectMetrics (19)\nArguments: rh_dedup, [sum(CASE WHEN (_span#3L > 3600000000) THEN 1 ELSE 0 END)]"
    assert plan_kind(bronze).startswith("bronze append")
    assert plan_kind(silver).startswith("silver append")
    assert plan_kind(dedup).startswith("in-batch dedup")
    assert plan_kind("Scan parquet") is None
    # Delta's own log replay is named in the job's description, whatever the plan.
    assert job_kind("batch = 3: Compute snapshot for version: 7", "", silver).startswith("Delta log replay")
