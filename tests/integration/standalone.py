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
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table

SPARK_HOME = Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path: Path, text: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited early: {path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"{text!r} not seen in {path} within {timeout_s}s")


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    port = free_port()
    work = tmp_path / "worker-work"
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    master_log = tmp_path / "master.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(master_log, "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        spark_class,
                        "org.apache.spark.deploy.master.Master",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--webui-port",
                        str(free_port()),
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        wait_for(master_log, "I have been elected leader", 90, procs[0])
        url = f"spark://127.0.0.1:{port}"
        for worker in (1, 2):
            worker_log = tmp_path / f"worker{worker}.log"
            with open(worker_log, "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            spark_class,
                            "org.apache.spark.deploy.worker.Worker",
                            url,
                            "--host",
                            "127.0.0.1",
                            "--cores",
                            "1",
                            "--memory",
                            "1g",
                            "--work-dir",
                            str(work / f"worker{worker}"),
                            "--webui-port",
                            str(free_port()),
                        ],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            wait_for(worker_log, "Successfully registered with master", 90, procs[-1])
        yield url, work
    finally:
        for proc in reversed(procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)


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
