"""The production topology, as separate processes on one machine (no Docker engine here):

PostgreSQL (Debian's package, installed if missing) holds the Dagster instance written by
`riverhouse deploy-config`; a code server, `dagster-daemon` and `dagster-webserver` run as
three processes on it; the real Kafka broker (`local_kafka`); a Spark standalone master with
two workers, whose driver is a Spark Connect engine (`riverhouse engine start --master`, as
compose runs it), runs every pipeline run: the run workers attach to it. Events are produced, the daemon ticks the Kafka-lag
sensor, the run goes through the queue, and ClickHouse ends with exactly the unique events.
Then the daemon and the run worker are SIGKILLed mid-run: the run shows as failed in the run
history (also through the webserver), and after the restart nothing is lost or doubled.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from riverhouse.platform.kafka.generator import GeneratorConfig, orders
from riverhouse.platform.runtime import engine
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import parse_spec
from tests.conftest import orders_spec_data, produce, riverhouse_cmd
from tests.production.services import (
    Postgres,
    Service,
    dagster_bin,
    descendants,
    free_port,
    postgres_bin,
    spark_cluster,
)

pytestmark = [pytest.mark.production, pytest.mark.slow]

PIPELINE = "prod_orders"
JOB = f"{PIPELINE}_job"
SENSOR = f"{PIPELINE}_kafka_lag_sensor"


@dataclass
class Stack:
    env: dict[str, str]
    folder: Path
    topic: str
    kafka: str
    daemon: Service
    webserver_url: str
    spec: Any

    @functools.cached_property
    def _instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.get()  # DAGSTER_HOME and the database variables are set for the test

    def instance(self) -> dg.DagsterInstance:
        return self._instance

    def restart_daemon(self) -> None:
        self.daemon.start("Instance is configured with the following daemons", 120)


def _spec_dict(topic: str) -> dict[str, Any]:
    data = orders_spec_data(topic, name=PIPELINE, max_offsets=1500, batch_size=5000)
    data["orchestration"] = {"sensor": {"enabled": True, "min_lag": 1, "interval": "1s", "max_delay": "1s"}}
    return data


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, kafka: str) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("production")
    topic = f"prod_{os.getpid()}_{int(time.time())}"
    pipelines = folder / "pipelines"
    pipelines.mkdir()
    (pipelines / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(_spec_dict(topic)))
    dagster_home = folder / "dagster"
    started: list[Service] = []
    engines: list[Path] = []
    postgres = Postgres(postgres_bin())
    saved_env = dict(os.environ)
    try:
        postgres.start()
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RIVERHOUSE_", "DAGSTER_"))}
        spark_url, cluster = spark_cluster(folder, base)
        started.extend(cluster)
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        # The engine's spark-defaults.conf, as compose gives it (docker/spark-conf): shuffles sized
        # to the cluster's cores, not Spark's 200 tasks per shuffle of every micro-batch.
        conf_dir = folder / "spark-conf"
        conf_dir.mkdir()
        (conf_dir / "spark-defaults.conf").write_text("spark.sql.shuffle.partitions 4\n")
        os.environ["SPARK_CONF_DIR"] = str(conf_dir)
        driver = engine.start(folder / "engine", master=spark_url, memory="1g")
        engines.append(folder / "engine")
        env = {
            **base,
            **postgres.env(),
            "DAGSTER_HOME": str(dagster_home),
            "RIVERHOUSE_CODE_SERVER_HOST": "127.0.0.1",
            "RIVERHOUSE_CODE_SERVER_PORT": str(free_port()),
            "RIVERHOUSE_HOME": str(folder / "riverhouse"),
            "RIVERHOUSE_PIPELINES": str(pipelines),
            "RIVERHOUSE_KAFKA_BOOTSTRAP": kafka,
            "RIVERHOUSE_SPARK_MASTER": spark_url,
            "RIVERHOUSE_SPARK_REMOTE": driver.url,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        written = subprocess.run(
            [*riverhouse_cmd(), "deploy-config", "--out", str(dagster_home)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert written.returncode == 0, written.stderr
        code = Service(
            "code-server",
            [
                dagster_bin("dagster"),
                "code-server",
                "start",
                "-h",
                "127.0.0.1",
                "-p",
                env["RIVERHOUSE_CODE_SERVER_PORT"],
                "-m",
                "riverhouse.definitions",
            ],
            env,
            folder / "code-server.log",
            cwd=folder,
        )
        started.append(code.start("Started Dagster code proxy server", 300))
        workspace = str(dagster_home / "workspace.yaml")
        web_port = free_port()
        webserver = Service(
            "webserver",
            [dagster_bin("dagster-webserver"), "-h", "127.0.0.1", "-p", str(web_port), "-w", workspace],
            env,
            folder / "webserver.log",
            cwd=folder,
        )
        started.append(webserver.start("Serving dagster-webserver", 300))
        daemon = Service("daemon", [dagster_bin("dagster-daemon"), "run", "-w", workspace], env, folder / "daemon.log")
        started.append(daemon.start("Instance is configured with the following daemons", 300))
        os.environ.update({k: v for k, v in env.items() if k.startswith(("DAGSTER_", "RIVERHOUSE_"))})
        yield Stack(env, folder, topic, kafka, daemon, f"http://127.0.0.1:{web_port}", parse_spec(_spec_dict(topic)))
    finally:
        for service in reversed(started):
            service.stop()
        for state_dir in engines:
            engine.stop(state_dir)
        postgres.stop()
        os.environ.clear()
        os.environ.update(saved_env)


def produce_orders(stack: Stack, seed: int, count: int) -> set[str]:
    records, stats = orders(GeneratorConfig(count=count, duplicate_rate=0.2, malformed=6, seed=seed))
    produce(stack.kafka, stack.topic, list(records))
    return {event["order_id"] for event in stats.events}


def sensor_runs(stack: Stack) -> list[dg.DagsterRun]:
    """Runs of the pipeline's job that the lag sensor requested, oldest first."""
    records = stack.instance().get_run_records(
        filters=dg.RunsFilter(job_name=JOB, tags={"dagster/sensor_name": SENSOR}), ascending=True
    )
    return [record.dagster_run for record in records]


def wait_for_run(stack: Stack, known: set[str], timeout_s: float = 420) -> dg.DagsterRun:
    """The first sensor run not in `known` that has started (any status past the queue)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for run in sensor_runs(stack):
            if run.run_id not in known:
                return run
        time.sleep(1)
    raise AssertionError(f"the daemon requested no new run of {JOB} in {timeout_s:.0f}s:\n{tail(stack, 'daemon.log')}")


def wait_for_status(stack: Stack, run_id: str, statuses: set[dg.DagsterRunStatus], timeout_s: float = 600) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = stack.instance().get_run_by_id(run_id)
        if run is not None and run.status in statuses:
            return run
        time.sleep(1)
    raise AssertionError(f"run {run_id} never reached {statuses}:\n{last_messages(stack, run_id)}")


def last_messages(stack: Stack, run_id: str) -> str:
    """A failed assertion's message: the run's last 40 messages, one per line (pytest cuts a list short)."""
    return "\n".join(run_messages(stack, run_id)[-40:])


def run_messages(stack: Stack, run_id: str) -> list[str]:
    return [entry.message for entry in stack.instance().all_logs(run_id)]


def tail(stack: Stack, name: str) -> str:
    return (stack.folder / name).read_text(errors="replace")[-3000:]


def clickhouse_order_ids(stack: Stack) -> list[str]:
    dsn = f"chdb://{Path(stack.env['RIVERHOUSE_HOME']) / 'clickhouse'}"
    with open_client(dsn) as client:
        return [row[0] for row in client.query(f"SELECT order_id FROM {qualified_table(stack.spec)}").result_rows]


def test_daemon_sensor_run_lands_unique_events_and_survives_a_kill(stack: Stack) -> None:
    started = time.monotonic()
    # The instance the daemon and webserver run on is the PostgreSQL one deploy-config wrote.
    instance = stack.instance()
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"

    # 1. Events -> the daemon's sensor tick -> a queued run on the cluster -> ClickHouse.
    first_ids = produce_orders(stack, seed=101, count=3000)
    first = wait_for_run(stack, set())
    done = wait_for_status(stack, first.run_id, {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE})
    assert done.status == dg.DagsterRunStatus.SUCCESS, last_messages(stack, first.run_id)
    events = {entry.dagster_event_type for entry in instance.all_logs(first.run_id) if entry.is_dagster_event}
    assert dg.DagsterEventType.RUN_ENQUEUED in events  # it went through the run queue
    assert done.tags["riverhouse/pipeline"] == PIPELINE
    ids = clickhouse_order_ids(stack)
    assert len(ids) == len(set(ids)) and set(ids) == first_ids
    # The run went through the engine: the cluster ran one Spark application (the engine's), not
    # one per run; and its Spark work ran in executors on both workers.
    apps = {app.name for worker in ("worker-1", "worker-2") for app in (stack.folder / worker).glob("app-*")}
    assert len(apps) == 1, apps
    for worker in ("worker-1", "worker-2"):
        logs = list((stack.folder / worker).glob("app-*/*/stderr"))
        assert any("Running task" in log.read_text(errors="replace") for log in logs), f"no task ran on {worker}"

    # 2. A backlog of several batches (1,500 records each); SIGKILL the daemon and the run worker
    # while it is ingesting: after its first batch, with at least two more to go.
    second_ids = produce_orders(stack, seed=202, count=5000)
    victim = wait_for_run(stack, {first.run_id})
    deadline = time.monotonic() + 420
    worker_pid = None
    while time.monotonic() < deadline:
        messages = run_messages(stack, victim.run_id)
        pids = [int(m) for text in messages for m in re.findall(r"Started process for run \(pid: (\d+)\)", text)]
        if pids and any(re.match(r"batch \d+: read", text) for text in messages):
            worker_pid = pids[0]
            break
        assert stack.instance().get_run_by_id(victim.run_id).status != dg.DagsterRunStatus.SUCCESS, (
            "the run finished before a batch was seen: produce more events"
        )
        time.sleep(0.2)
    assert worker_pid is not None, last_messages(stack, victim.run_id)
    stack.daemon.kill()
    doomed = [worker_pid, *descendants(worker_pid)]  # the run worker (its Spark work is on the engine)
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    # The code server that launched the worker records its death: the run fails in the history.
    failed = wait_for_status(stack, victim.run_id, {dg.DagsterRunStatus.FAILURE}, timeout_s=120)
    assert failed.status == dg.DagsterRunStatus.FAILURE
    assert any("SIGKILL" in text for text in run_messages(stack, victim.run_id))
    failure_seen_s = time.monotonic() - killed_at

    # 3. Restart the daemon; the stream keeps flowing. The next sensor run finishes the rest.
    # (New events are needed: the lag sensor's run key is the topics' end offsets, which the
    # killed run already used, and Dagster never launches a run key twice.)
    stack.restart_daemon()
    third_ids = produce_orders(stack, seed=303, count=500)
    recovery = wait_for_run(stack, {first.run_id, victim.run_id})
    done = wait_for_status(stack, recovery.run_id, {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE})
    assert done.status == dg.DagsterRunStatus.SUCCESS, last_messages(stack, recovery.run_id)
    # A sensor run covers everything in Kafka when it starts; wait for the lag to reach zero.
    expected = first_ids | second_ids | third_ids
    deadline = time.monotonic() + 420
    known = {first.run_id, victim.run_id, recovery.run_id}
    while True:
        ids = clickhouse_order_ids(stack)
        if set(ids) == expected or time.monotonic() > deadline:
            break
        more = [r for r in sensor_runs(stack) if r.run_id not in known]
        for run in more:
            wait_for_status(stack, run.run_id, {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE})
            known.add(run.run_id)
        time.sleep(2)
    assert len(ids) == len(set(ids)), "ClickHouse holds a duplicate"
    assert set(ids) == expected, f"{len(expected - set(ids))} events missing"

    # The failure is in the run history the webserver serves.
    query = "{ runsOrError(filter: {statuses: [FAILURE]}) { ... on Runs { results { runId status jobName } } } }"
    request = urllib.request.Request(
        f"{stack.webserver_url}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        history = json.loads(response.read())["data"]["runsOrError"]["results"]
    assert {"runId": victim.run_id, "status": "FAILURE", "jobName": JOB} in history
    print(
        f"\nproduction tier: {len(expected):,} unique events in ClickHouse, 0 duplicates; run {victim.run_id} "
        f"killed mid-run, marked FAILURE {failure_seen_s:.1f}s later; {len(known)} sensor runs; "
        f"{time.monotonic() - started:.0f}s",
        file=sys.stderr,
    )
