"""Distributed: the same pipeline on a Spark standalone cluster (master + worker on loopback).

The cluster comes from the pip-installed pyspark (`spark-class ...Master/Worker`).
The Kafka source's read() and the batch logic then run in executor processes
started by the worker, and the result must equal a local-mode run's exactly.
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
import yaml

from riverhouse.platform.generator import GeneratorConfig, orders
from riverhouse.platform.runner import run_once
from riverhouse.platform.settings import Settings
from riverhouse.platform.tables import TableLayout, open_table
from tests.conftest import orders_spec, produce, riverhouse_cmd, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]
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
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
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
                        "2",
                        "--memory",
                        "2g",
                        "--work-dir",
                        str(work),
                        "--webui-port",
                        str(free_port()),
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        wait_for(worker_log, "Successfully registered with master", 90, procs[1])
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


def test_cluster_run_equals_local_run(
    spark: Any, kafka: str, topic: str, tmp_path: Path, standalone_cluster: tuple[str, Path]
) -> None:
    master, work_dir = standalone_cluster
    records, stats = orders(GeneratorConfig(count=3000, duplicate_rate=0.2, malformed=5, seed=11))
    produce(kafka, topic, list(records))
    spec = orders_spec(topic, name="clustered", max_offsets=2000)
    spec_path = tmp_path / "clustered.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))

    cluster_settings = Settings.from_env(tmp_path / "cluster").with_(kafka_bootstrap=kafka)
    proc = subprocess.run(
        [*riverhouse_cmd(), "run", str(spec_path), "--json"],
        env=subprocess_env(cluster_settings, RIVERHOUSE_SPARK_MASTER=master, SPARK_LOCAL_IP="127.0.0.1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cluster_summary = json.loads(proc.stdout)

    local_settings = Settings.from_env(tmp_path / "local").with_(kafka_bootstrap=kafka)
    local_summary = run_once(spec, local_settings, spark=spark, log=lambda m: None)

    assert silver(cluster_settings, spec) == silver(local_settings, spec)
    assert len(silver(cluster_settings, spec)) == stats.expected_unique
    for key in ("read", "inserted", "duplicates_dropped", "quarantined", "clickhouse_rows_loaded"):
        assert cluster_summary[key] == local_summary[key], key
    # The work really ran in executors launched by the worker, not in the driver.
    executor_logs = list(work_dir.glob("app-*/*/stderr"))
    assert executor_logs, "no executor was launched on the worker"
    assert any("Running task" in p.read_text(errors="replace") for p in executor_logs)
