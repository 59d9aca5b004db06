"""Distributed: the same pipeline on a Spark standalone cluster (a master + two workers on loopback).

The cluster comes from the pip-installed pyspark (`spark-class ...Master/Worker`); its driver
is a Spark Connect engine (`riverhouse engine start` with the cluster's master), as in
production, and `riverhouse run` attaches to it. Spark's Kafka source, the parse, the in-batch
dedup, the anti-join with silver and the Delta appends then run as tasks of executors the
workers launched (Spark's event log says which executor ran each task of each SQL execution),
and the rows must equal a local-mode run's.
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

from riverhouse.platform.kafka.generator import GeneratorConfig, orders
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
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


def test_cluster_run_equals_local_run(
    spark: Any,
    kafka: str,
    topic: str,
    tmp_path: Path,
    standalone_cluster: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    master, work_dir = standalone_cluster
    records, stats = orders(GeneratorConfig(count=3000, duplicate_rate=0.2, malformed=5, seed=11))
    produce(kafka, topic, list(records))
    spec = orders_spec(topic, name="clustered", max_offsets=2000)
    spec_path = tmp_path / "clustered.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))

    cluster_settings = Settings.from_env(tmp_path / "cluster").with_(kafka_bootstrap=kafka)
    # Spark's event log of the driver (spark-submit reads spark-defaults.conf from SPARK_CONF_DIR).
    conf_dir, events_dir = tmp_path / "spark-conf", tmp_path / "events"
    conf_dir.mkdir()
    events_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        # Uncompressed: Spark 4 compresses event logs with zstd by default.
        f"spark.eventLog.enabled true\nspark.eventLog.compress false\nspark.eventLog.dir file://{events_dir}\n"
        "spark.cores.max 2\n"
    )
    from riverhouse.platform.runtime import engine

    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))  # the engine's spark-submit reads spark-defaults.conf
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    engine_dir = tmp_path / "engine"
    driver = engine.start(engine_dir, master=master, memory="1g")
    try:
        assert driver.master == master
        proc = subprocess.run(
            [*riverhouse_cmd(), "run", str(spec_path), "--json"],
            env=subprocess_env(cluster_settings, RIVERHOUSE_SPARK_REMOTE=driver.url),
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        engine.stop(engine_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cluster_summary = json.loads(proc.stdout)

    local_settings = Settings.from_env(tmp_path / "local").with_(kafka_bootstrap=kafka)
    local_summary = Pipeline(spec, local_settings, spark=spark, log=lambda m: None).run()

    assert silver(cluster_settings, spec) == silver(local_settings, spec)
    assert len(silver(cluster_settings, spec)) == stats.expected_unique
    for key in ("read", "inserted", "duplicates_dropped", "quarantined", "clickhouse_rows_loaded"):
        assert cluster_summary[key] == local_summary[key], key
    # The work really ran in executors launched by the two workers, not in the driver.
    for worker in ("worker1", "worker2"):
        assert list((work_dir / worker).glob("app-*/*/stderr")), f"no executor was launched on {worker}"
    executors_of = tasks_by_execution(events_dir)
    anti_joins = [e for plan, e in executors_of.items() if "LeftAnti" in plan]
    # A Delta write's tasks run the plan of the data it writes, which carries the write's observed
    # metrics (state/delta_spark.append_once names them rh_append_<table>_<digest>).
    writes = [e for plan, e in executors_of.items() if "rh_append_" in plan]
    assert anti_joins and writes, sorted(p.splitlines()[0] for p in executors_of)
    dedup_executors, write_executors = set().union(*anti_joins), set().union(*writes)
    assert "driver" not in dedup_executors | write_executors, (dedup_executors, write_executors)
    assert len(set().union(*executors_of.values()) - {"driver"}) == 2  # both workers' executors had tasks


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
