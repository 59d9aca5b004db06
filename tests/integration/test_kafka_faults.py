"""Faults of the real broker: stopped mid-run, records deleted by retention, a topic recreated smaller.

Each ends with ClickHouse holding exactly what Kafka still had, each event once: the run
either fails with a clear error that names what happened, or (kafka.fail_on_data_loss:
false) skips what Kafka lost and says how much.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.errors import PipelineError
from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import order, orders_spec, produce, riverhouse_cmd, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def broker_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A broker of this module's own: these tests stop it, delete records and topics."""
    state_dir = tmp_path_factory.mktemp("fault_kafka")
    local_kafka.start(state_dir)
    yield state_dir
    local_kafka.stop(state_dir)


@pytest.fixture
def broker(broker_dir: Path) -> str:
    return local_kafka.start(broker_dir).bootstrap  # started again if a test stopped it


def orders(first: int, last: int) -> list[tuple[bytes, bytes]]:
    return [
        order(f"o{i}", f"2026-01-01T{10 + i // 3600 % 10:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z")
        for i in range(first, last)
    ]


def clickhouse_ids(settings: Settings, spec: PipelineSpec) -> list[str]:
    with open_client(settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT order_id FROM {qualified_table(spec)}").result_rows
    return sorted(r[0] for r in rows)


def ids(first: int, last: int) -> list[str]:
    return sorted(f"o{i}" for i in range(first, last))


def write_spec(path: Path, spec: PipelineSpec, **kafka: Any) -> Path:
    data = spec.model_dump(mode="json", exclude_defaults=True, by_alias=True)
    data.setdefault("kafka", {}).update(kafka)
    path.write_text(yaml.safe_dump(data))
    return path


def cli_run(spec_file: Path, settings: Settings, bootstrap: str) -> subprocess.Popen[str]:
    env = subprocess_env(settings, RIVERHOUSE_KAFKA_BOOTSTRAP=bootstrap)
    return subprocess.Popen(
        [*riverhouse_cmd(), "run", str(spec_file), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def delta_commits(path: str) -> int:
    log = Path(path) / "_delta_log"
    return len(list(log.glob("*.json"))) if log.exists() else 0


def test_broker_stopped_mid_run_then_restarted(broker_dir: Path, broker: str, topic: str, tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home")
    # Small batches: the run is still reading when the broker goes (its controlled shutdown takes seconds).
    spec = orders_spec(topic, name="broker_down", max_offsets=500)
    produce(broker, topic, orders(0, 30_000) + orders(0, 500))  # 500 producer retries
    spec_file = write_spec(tmp_path / "spec.yaml", spec)
    run = cli_run(spec_file, settings, broker)
    silver = TableLayout(settings.warehouse, spec.name).silver("orders")
    deadline = time.monotonic() + 300
    while delta_commits(silver) < 3 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # table creation + at least one batch committed
    assert run.poll() is None, run.communicate()[1][-3000:]
    local_kafka.stop(broker_dir)
    _, stderr = run.communicate(timeout=600)
    assert run.returncode == 1
    # The run's own last word names the source and what happened (Spark's Python daemon may
    # print a worker's connection reset before it: that is Spark's, not the error).
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: pipeline 'broker_down', source 'orders'"), stderr[-3000:]
    assert "cannot reach Kafka" in last or "no progress reading" in last, stderr[-3000:]
    assert "rdkafka" not in stderr  # librdkafka's own log does not flood the terminal
    # Really interrupted: silver holds some batches, not all of them.
    assert 0 < open_table(silver).to_pyarrow_dataset().count_rows() < 30_000

    assert local_kafka.start(broker_dir).bootstrap == broker  # same address after the restart
    # The rerun catches up in larger batches: a limit raised after an outage applies from the
    # next batch on (the batches already planned in the checkpoint keep their offsets).
    catch_up = write_spec(tmp_path / "catch_up.yaml", spec, max_offsets_per_trigger=200_000)
    rerun = cli_run(catch_up, settings, broker)
    _, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-3000:]
    assert clickhouse_ids(settings, spec) == ids(0, 30_000)  # every event, once


def delete_records_before(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, partition, offset)]).values():
        future.result(timeout=30)


def test_records_deleted_before_they_were_read(spark: Any, broker: str, topic: str, tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home").with_(kafka_bootstrap=broker)
    spec = orders_spec(topic, name="retention")
    local_kafka.create_topic(broker, topic, 1)
    produce(broker, topic, orders(0, 100))
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    produce(broker, topic, orders(100, 200))
    delete_records_before(broker, topic, 0, 150)  # what retention does: offsets 100..149 are gone unread
    with pytest.raises(PipelineError) as failure:
        Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    message = str(failure.value)
    assert f"{topic}[0]: offsets 100..149 (50 records) were deleted by retention" in message, message
    assert "fail_on_data_loss: false" in message
    assert clickhouse_ids(settings, spec) == ids(0, 100)  # nothing of the later records was loaded

    # The documented opt-out: the same pipeline (same checkpoint) skips the lost records and says how many.
    ran = cli_run(write_spec(tmp_path / "skip.yaml", spec, fail_on_data_loss=False), settings, broker)
    stdout, stderr = ran.communicate(timeout=600)
    assert ran.returncode == 0, stderr[-3000:]
    assert "skipping records lost in Kafka" in stderr and "(50 records)" in stderr, stderr[-3000:]
    assert json.loads(stdout)["read"] == 50
    assert clickhouse_ids(settings, spec) == sorted(ids(0, 100) + ids(150, 200))


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:  # the deletion finishes in the background
        try:
            local_kafka.create_topic(bootstrap, topic, partitions)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_topic_recreated_with_fewer_partitions(spark: Any, broker: str, topic: str, tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home").with_(kafka_bootstrap=broker)
    spec = orders_spec(topic, name="recreated")
    local_kafka.create_topic(broker, topic, 4)
    produce(broker, topic, orders(0, 80))
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    recreate_topic(broker, topic, 2)
    produce(broker, topic, orders(1000, 1010))
    with pytest.raises(PipelineError) as failure:
        Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    message = str(failure.value)
    assert "the partition no longer exists" in message and f"{topic}[3]" in message, message
    assert clickhouse_ids(settings, spec) == ids(0, 80)

    ran = cli_run(write_spec(tmp_path / "skip.yaml", spec, fail_on_data_loss=False), settings, broker)
    _, stderr = ran.communicate(timeout=600)
    assert ran.returncode == 0, stderr[-3000:]
    # Spark's connector resumes a partition whose offsets went backwards at its new end: the
    # 10 records the recreated topic held before this run are skipped, and the run says so.
    assert "skipping records lost in Kafka" in stderr, stderr[-3000:]
    skipped = re.findall(r"\((\d+) records\) are skipped too", stderr)
    assert sum(int(n) for n in skipped) == 10, stderr[-3000:]
    assert clickhouse_ids(settings, spec) == ids(0, 80)
    # From there on the new topic is read: what is produced next arrives, exactly once.
    produce(broker, topic, orders(2000, 2030))
    ran = cli_run(write_spec(tmp_path / "skip.yaml", spec, fail_on_data_loss=False), settings, broker)
    _, stderr = ran.communicate(timeout=600)
    assert ran.returncode == 0, stderr[-3000:]
    assert "skipping records lost in Kafka" not in stderr, stderr[-3000:]
    assert clickhouse_ids(settings, spec) == sorted(ids(0, 80) + ids(2000, 2030))


def test_topic_recreated_past_the_checkpoints_offsets(spark: Any, broker: str, topic: str, tmp_path: Path) -> None:
    # Offsets alone cannot tell: the recreated topic has grown past where the checkpoint
    # stopped, so every next offset is in range. Kafka's topic id tells the two apart.
    settings = Settings.from_env(tmp_path / "home").with_(kafka_bootstrap=broker)
    spec = orders_spec(topic, name="regrown")
    local_kafka.create_topic(broker, topic, 1)
    produce(broker, topic, orders(0, 20))
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    recreate_topic(broker, topic, 1)
    produce(broker, topic, orders(500, 550))
    with pytest.raises(PipelineError) as failure:
        Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    message = str(failure.value)
    assert f"{topic}[0]" in message and "topic id" in message and "(20) belongs to the old topic" in message, message
    assert clickhouse_ids(settings, spec) == ids(0, 20)

    ran = cli_run(write_spec(tmp_path / "skip.yaml", spec, fail_on_data_loss=False), settings, broker)
    _, stderr = ran.communicate(timeout=600)
    assert ran.returncode == 0, stderr[-3000:]
    assert "records 0..19 (20 records) are skipped" in stderr, stderr[-3000:]
    # The connector reads on from offset 20 of the new topic: its 30 later records, once.
    assert clickhouse_ids(settings, spec) == sorted(ids(0, 20) + ids(520, 550))
