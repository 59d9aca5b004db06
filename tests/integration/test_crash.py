"""Exactly once under crashes: SIGKILL the pipeline at each stage boundary, re-run, compare.

The expected rows come from the generator's own bookkeeping (which order ids it
produced), not from the pipeline, and every scenario must end with exactly those
rows in silver and in ClickHouse: no duplicate, no loss.

The crashed run is a `riverhouse run` process; the crash point SIGKILLs whatever runs that
step. With Spark in-process that is the run itself. With the shared test engine (Spark
Connect, RIVERHOUSE_TEST_ENGINE=connect) the batch body runs in a Python worker beside the
engine: the worker is killed mid-batch and the run fails; the loader's points still kill the
run. `test_the_engine_killed_mid_batch_then_restarted` SIGKILLs a private engine's JVM itself.
The re-run is the same `Pipeline.run` in the test's own (warm) Spark session. CLI re-runs are
covered by the continuous-mode test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.kafka.generator import GeneratorConfig, orders
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.sink.clickhouse import last_loaded_version, open_client, qualified_table
from riverhouse.platform.spec import load_spec
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import orders_spec, produce, riverhouse_cmd, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def write_spec(tmp_path: Path, topic: str) -> tuple[Path, Any]:
    # Small batches and chunks so there are several of each to crash between.
    spec = orders_spec(topic, name="crashy", max_offsets=150, batch_size=60)
    path = tmp_path / "crashy.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    return path, spec


# A crashed run normally ends in well under a minute; the margin is for a loaded 2-core machine.
RUN_TIMEOUT_S = 420


def run_cli(spec_path: Path, settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [*riverhouse_cmd(), "run", str(spec_path), "--json", *args],
        env=subprocess_env(settings, PYTHONFAULTHANDLER="1", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # A hung run: SIGABRT makes Python's fault handler print every thread's stack.
        proc.send_signal(signal.SIGABRT)
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"the run hung for {RUN_TIMEOUT_S} s; its threads:\n{stderr[-6000:]}\n{engine_log_tail()}")
    finally:
        # The driver's JVM must not outlive it: PySpark's gateway exits when its stdin closes.
        survivors = _group_alive_after(proc.pid, timeout_s=20)
        if survivors:
            os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    result.survivors = survivors  # type: ignore[attr-defined]
    return result


def engine_log_tail() -> str:
    from tests.conftest import ENGINE_DIR

    logs = [path for folder in ENGINE_DIR for path in folder.glob("logs/*")]
    return "\n".join(f"--- {path}:\n" + path.read_text(errors="replace")[-6000:] for path in logs)


# Crash points inside the streaming batch body (ingest/writer.py); the others run in the run's process.
BATCH_BODY_POINTS = ("after_bronze_commit", "after_silver_commit")


def assert_crashed(crashed: subprocess.CompletedProcess[str], point: str) -> None:
    """The run was killed at `point` (or, beside an engine, failed because its batch body was)."""
    if point in BATCH_BODY_POINTS and os.environ.get("RIVERHOUSE_SPARK_REMOTE"):
        assert crashed.returncode == 1, crashed.stderr[-2000:]
        assert "error:" in crashed.stderr and "Traceback" not in crashed.stderr, crashed.stderr[-2000:]
    else:
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert not crashed.survivors, "a process of the killed run outlived it"  # type: ignore[attr-defined]


def rerun(spec_path: Path, settings: Settings, spark: Any, drain: bool = False) -> dict[str, Any]:
    """What `riverhouse run <spec>` does after the crash, in this process's Spark session."""
    return Pipeline(load_spec(spec_path), settings, spark=spark, log=lambda message: None).run(drain=drain)


def _group_alive_after(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.2)
    return True


def clickhouse_ids(settings: Settings, spec: Any) -> list[str]:
    with open_client(settings.clickhouse_dsn) as client:
        return sorted(r[0] for r in client.query(f"SELECT order_id FROM {qualified_table(spec)}").result_rows)


def silver_ids(settings: Settings, spec: Any) -> list[str]:
    table = open_table(TableLayout(settings.warehouse, spec.name).silver("orders"))
    return sorted(table.to_pyarrow_dataset().to_table(columns=["order_id"]).column("order_id").to_pylist())


@pytest.mark.parametrize(
    ("point", "visit"),
    [
        ("after_bronze_commit", "1"),
        ("after_silver_commit", "1"),  # silver committed, Spark's checkpoint not yet
        ("after_silver_commit", "3"),  # a later micro-batch
        ("during_clickhouse_insert", "2"),  # some chunks of a version inserted, not all
        ("before_ledger_write", "1"),  # a whole version inserted, ledger not written
    ],
)
def test_sigkill_then_rerun_gives_exactly_the_expected_rows(
    tmp_path: Path, kafka: str, topic: str, settings: Settings, spark: Any, point: str, visit: str
) -> None:
    cfg = GeneratorConfig(count=400, duplicate_rate=0.25, malformed=6, out_of_order=0.1, seed=7)
    records, stats = orders(cfg)
    records = list(records)
    produce(kafka, topic, records)
    expected = sorted(json.loads(v)["order_id"] for _, v in records[:] if v and v.startswith(b'{"order_id":"o-'))
    expected = sorted(set(expected))
    assert len(expected) == stats.expected_unique == 400

    spec_path, spec = write_spec(tmp_path, topic)
    crashed = run_cli(spec_path, settings, RIVERHOUSE_CRASH_AT=point, RIVERHOUSE_CRASH_ON=visit)
    assert_crashed(crashed, point)

    summary = rerun(spec_path, settings, spark)

    assert silver_ids(settings, spec) == expected
    assert clickhouse_ids(settings, spec) == expected
    # Nothing is left over: the ledger has reached the last silver version, and the
    # re-run's counts reconcile with what the crashed run had not finished.
    silver = open_table(TableLayout(settings.warehouse, spec.name).silver("orders"))
    with open_client(settings.clickhouse_dsn) as client:
        assert last_loaded_version(client, spec, silver.metadata().id) == silver.version()
    assert (
        summary["read"]
        == summary["inserted"] + summary["duplicates_dropped"] + summary["quarantined"] + summary["replayed"]
    )


def test_the_engine_killed_mid_batch_then_restarted_gives_exactly_the_expected_rows(
    tmp_path: Path, kafka: str, topic: str, settings: Settings
) -> None:
    """A private Spark Connect engine's JVM is SIGKILLed after silver's commit of a batch, before
    Spark's: the run fails naming the engine, `riverhouse engine start` brings it back on its port,
    and the next run (through it) ends with exactly the expected rows."""
    from riverhouse.platform.runtime import engine

    cfg = GeneratorConfig(count=400, duplicate_rate=0.25, malformed=6, out_of_order=0.1, seed=11)
    records, stats = orders(cfg)
    records = list(records)
    produce(kafka, topic, records)
    spec_path, spec = write_spec(tmp_path, topic)
    state_dir = tmp_path / "engine"
    state = engine.start(state_dir)
    try:
        remote = {"RIVERHOUSE_SPARK_REMOTE": state.url}
        crashed = run_cli(
            spec_path,
            settings,
            RIVERHOUSE_CRASH_AT="after_silver_commit",
            RIVERHOUSE_CRASH_ON="2",
            RIVERHOUSE_CRASH_KILL_PIDS=str(state.pid),
            **remote,
        )
        assert crashed.returncode == 1, crashed.stderr[-2000:]
        assert not engine.status(state_dir)  # the JVM is gone
        assert "riverhouse engine start" in crashed.stderr, crashed.stderr[-2000:]
        restarted = engine.start(state_dir)
        assert restarted.url == state.url and restarted.pid != state.pid
        again = run_cli(spec_path, settings, **remote)
        assert again.returncode == 0, again.stderr[-2000:]
    finally:
        engine.stop(state_dir)
    expected = sorted({json.loads(v)["order_id"] for _, v in records if v and v.startswith(b'{"order_id":"o-')})
    assert len(expected) == stats.expected_unique
    assert silver_ids(settings, spec) == expected
    assert clickhouse_ids(settings, spec) == expected
    summary = json.loads(again.stdout)
    assert summary["replayed"] > 0  # the killed batch had reached silver: its replay was recognised


def test_a_client_killed_mid_batch_lets_its_batch_finish_before_the_rerun_takes_over(
    tmp_path: Path, kafka: str, topic: str, settings: Settings, spark: Any, test_engine: str | None
) -> None:
    """The run's client is SIGKILLed while its first batch is being written beside the engine
    (stalled after bronze's commit). The engine keeps that query; the next run must not replace
    it mid-batch (the body's process would die but not the write it asked the engine for, which
    could then commit after the rerun looked for it: the batch twice). It waits for that batch,
    then takes over, and ends with exactly the expected rows."""
    if test_engine is None:
        pytest.skip("in-process Spark dies with its client: only an engine keeps a killed client's query")
    from riverhouse.platform.state.checkpoints import checkpoint_dir, read_json
    from riverhouse.platform.state.delta_log import DeltaLog

    records, _ = orders(GeneratorConfig(count=400, duplicate_rate=0.25, malformed=6, out_of_order=0.1, seed=13))
    records = list(records)
    produce(kafka, topic, records)
    spec_path, spec = write_spec(tmp_path, topic)
    checkpoint = checkpoint_dir(settings, spec.name, "orders")
    bronze = DeltaLog(TableLayout(settings.warehouse, spec.name).bronze("orders"))
    proc = subprocess.Popen(
        [*riverhouse_cmd(), "run", str(spec_path), "--json"],
        env=subprocess_env(settings, RIVERHOUSE_STALL_AT="after_bronze_commit", RIVERHOUSE_STALL_S="8"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        # Batch 0 is in flight (its marker is there) and past bronze's commit: the body stalls.
        while not (list((checkpoint / "writing").glob("*.json")) and (bronze.latest_version() or 0) >= 1):
            assert proc.poll() is None, "the run ended before its first batch stalled"
            assert time.monotonic() < deadline, "the first batch never reached bronze"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_at = time.time()

    messages: list[str] = []
    summary = Pipeline(load_spec(spec_path), settings, spark=spark, log=messages.append).run()

    expected = sorted({json.loads(v)["order_id"] for _, v in records if v and v.startswith(b'{"order_id":"o-')})
    assert silver_ids(settings, spec) == expected
    assert clickhouse_ids(settings, spec) == expected
    assert any("an earlier run's query is still active on the engine" in m for m in messages), messages
    # The takeover let Spark stop the old query from a session of its own: the run's session is
    # shared with other processes, whose starts must never stop a query mid-batch.
    assert spark.conf.get("spark.sql.streaming.stopActiveRunOnRestart") == "false"
    # Batch 0's silver rows were written by the killed client's body, which finished its batch:
    # its report is the last word on batch 0, or the rerun replayed batch 0 and found it done.
    first = read_json(checkpoint / "batches" / f"{0:012d}.json")
    assert first["started_at"] < killed_at or first["replayed"] == first["valid"] > 0, first
    assert (
        summary["read"]
        == summary["inserted"] + summary["duplicates_dropped"] + summary["quarantined"] + (summary["replayed"])
    )
