"""Spark's Kafka connector as the pipeline uses it, against the real broker: batches, transactions, headers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from riverhouse.platform.ingest.stream import ingest
from riverhouse.platform.kafka.client import watermarks
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import order, orders_spec

pytestmark = pytest.mark.integration


def bronze(settings: Settings, spec: Any) -> list[dict[str, Any]]:
    table = open_table(TableLayout(settings.warehouse, spec.name).bronze("orders")).to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda r: (r["_partition"], r["_offset"]))


def test_batches_are_bounded_and_headers_and_coordinates_are_kept(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka, "linger.ms": 5, "log_level": 3})
    for i in range(10):
        key, value = order(f"o{i}", f"2026-01-01T10:00:{i:02d}Z")
        producer.produce(topic, key=key, value=value, partition=0, headers=[("trace", f"t{i}".encode())])
    assert producer.flush(30) == 0
    spec = orders_spec(topic, max_offsets=4)
    result = ingest(spark, spec, settings)
    # maxOffsetsPerTrigger: 10 records in batches of at most 4.
    assert [b.read for b in result.batches] == [4, 4, 2]
    rows = bronze(settings, spec)
    assert [r["_offset"] for r in rows] == list(range(10)) and {r["_partition"] for r in rows} == {0}
    assert rows[3]["_headers"] == [{"key": "trace", "value": b"t3"}]
    assert json.loads(rows[3]["_value"])["order_id"] == "o3" and rows[3]["_key"] == b"o3"
    assert result.end_offsets == {topic: {"0": 10, "1": 0, "2": 0, "3": 0}}


def test_records_of_an_aborted_transaction_are_never_read(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    """kafka.isolation.level=read_committed: a batch stops at the last stable offset, aborted records are skipped."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka, "transactional.id": f"{topic}-tx", "log_level": 3})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        key, value = order(f"aborted{i}", "2026-01-01T10:00:00Z")
        producer.produce(topic, key=key, value=value, partition=0)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(3):
        key, value = order(f"kept{i}", "2026-01-01T10:00:00Z")
        producer.produce(topic, key=key, value=value, partition=0)
    producer.commit_transaction(30)
    spec = orders_spec(topic)
    result = ingest(spark, spec, settings)
    ids = sorted(json.loads(r["_value"])["order_id"] for r in bronze(settings, spec))
    assert ids == ["kept0", "kept1", "kept2"] and result.read == 3


def test_producing_to_fewer_partitions_keeps_a_key_in_one_and_the_rest_empty(kafka: str, topic: str) -> None:
    """The benchmark's --partitions: the generator's producer uses only the topic's first N partitions."""
    from confluent_kafka import Consumer, TopicPartition

    from riverhouse.platform.kafka.generator import produce as generate

    keys = [f"k{i % 40}".encode() for i in range(400)]  # ten copies of each of 40 keys
    assert generate(kafka, topic, iter((k, b"{}") for k in keys), partitions=2) == 400
    ranges = watermarks({"bootstrap.servers": kafka}, [topic])[topic]
    assert len(ranges) == 4  # the local Kafka's topics have four
    assert [ranges[p][1] for p in (2, 3)] == [0, 0] and ranges[0][1] > 0 and ranges[1][1] > 0
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": f"{topic}-check", "log_level": 3})
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    seen: dict[bytes, set[int]] = {}
    read = 0
    while read < 400:
        for msg in consumer.consume(500, timeout=5):
            assert msg.error() is None
            seen.setdefault(msg.key(), set()).add(msg.partition())
            read += 1
    consumer.close()
    assert len(seen) == 40 and all(len(parts) == 1 for parts in seen.values())


def test_a_batch_runs_no_more_tasks_than_the_engine_has_slots(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    """A task per Kafka partition paid each task's fixed cost per partition: the batch is read in at most
    as many tasks as the engine runs at once (narrowly merged), so bronze gets at most that many files."""
    from confluent_kafka import Producer

    from riverhouse.platform.ingest.writer import task_slots
    from riverhouse.platform.state.delta_log import DeltaLog

    partitions = 4  # the local Kafka's topics have four
    producer = Producer({"bootstrap.servers": kafka, "log_level": 3})
    for i in range(40):
        key, value = order(f"o{i}", f"2026-01-01T10:00:{i:02d}Z")
        producer.produce(topic, key=key, value=value, partition=i % partitions)
    assert producer.flush(30) == 0
    assert len(watermarks({"bootstrap.servers": kafka}, [topic])[topic]) == partitions
    slots = task_slots(spark)
    assert slots < partitions, f"the test needs fewer task slots ({slots}) than partitions ({partitions})"
    spec = orders_spec(topic)
    result = ingest(spark, spec, settings)
    assert result.read == 40 and len({r["_partition"] for r in bronze(settings, spec)}) == partitions
    log = DeltaLog(TableLayout(settings.warehouse, spec.name).bronze("orders"))
    commit = log.commit(log.latest_version())
    assert 1 <= len(commit.adds) <= slots, commit.adds  # one day: a file per task
