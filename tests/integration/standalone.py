"""A Spark standalone cluster for the tests (a master + two workers on loopback), and what Spark's
event log says ran where.

The cluster comes from the pip-installed pyspark (`spark-class ...Master/Worker`); its driver
is a Spark Connect engine (`riverhouse engine start` with the cluster's master), as in
production. The test that runs a pipeline on it is in test_object_storage.py (a cluster with
an object-store warehouse is the production shape).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.production.services import spark_cluster


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(the master's URL, the folder of its logs and its workers' work folders `worker-1`, `worker-2`).

    The production tier's cluster (tests/production/services.spark_cluster): one way to start it.
    """
    folder = tmp_path / "cluster"
    folder.mkdir()
    url, services = spark_cluster(folder, dict(os.environ))
    try:
        yield url, folder
    finally:
        for service in reversed(services):
            service.stop()


def silver(settings: Settings, spec: Any) -> list[tuple[Any, ...]]:
    table = (
        open_table(TableLayout(settings.warehouse, spec.name).silver("orders"))
        .to_pyarrow_dataset()
        .to_table(columns=["order_id", "user_id", "amount", "price", "created_at", "_topic", "_partition", "_offset"])
    )
    return sorted(tuple(r.values()) for r in table.to_pylist())


def tasks_by_execution(events_dir: Path) -> dict[str, frozenset[str]]:
    """From Spark's event log: each SQL execution's physical plan -> executors of its jobs' tasks.

    Under Spark Connect, job descriptions are the client's plan messages; the executed physical
    plan says what a job did (a Delta write, the anti-join with silver...).
    """
    plans: dict[str, str] = {}
    stage_execution: dict[int, str] = {}
    executors: dict[str, set[str]] = {}
    # Spark 4 writes a rolling event log: a folder per application holding the event files.
    for log in sorted(p for p in events_dir.rglob("events_*") if p.is_file()):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            kind = event["Event"]
            if kind.endswith("SQLExecutionStart"):
                plans[str(event["executionId"])] = event.get("physicalPlanDescription") or ""
            elif kind == "SparkListenerJobStart":
                execution = (event.get("Properties") or {}).get("spark.sql.execution.id") or ""
                for stage in event["Stage IDs"]:
                    stage_execution[stage] = execution
            elif kind == "SparkListenerTaskEnd":
                plan = plans.get(stage_execution.get(event["Stage ID"], ""), "")
                executors.setdefault(plan, set()).add(event["Task Info"]["Executor ID"])
    return {plan: frozenset(e) for plan, e in executors.items()}
