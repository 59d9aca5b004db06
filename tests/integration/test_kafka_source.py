"""The Kafka source's reader against the real local Kafka: every column, exact ranges, batching."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform import kafka_source
from riverhouse.platform.kafka_source import (
    KafkaInputPartition,
    read_partition,
    source_options,
    watermarks,
)

pytestmark = pytest.mark.integration

CREATE_MS = 1_767_261_600_000  # 2026-01-01T10:00:00Z


def produce_with_headers(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
    for i in range(count):
        value = json.dumps({"order_id": f"o{i}", "amount": i}).encode()
        headers = [("trace", f"t{i}".encode()), ("empty", None)] if i % 3 == 0 else None
        producer.produce(
            topic,
            key=None if i % 5 == 0 else f"k{i}".encode(),
            value=value,
            partition=0,
            timestamp=CREATE_MS + i,
            headers=headers,
        )
    assert producer.flush(30) == 0


def read_all(options: dict[str, str], part: KafkaInputPartition) -> pa.Table:
    lowered = {k.lower(): v for k, v in options.items()}
    batches = list(read_partition(lowered, part, fail_on_data_loss=True))
    return pa.Table.from_batches(batches) if batches else pa.table({})


def test_reader_returns_exactly_the_planned_range_with_every_column(
    kafka: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    produce_with_headers(kafka, topic, 300)
    low, high = watermarks({"bootstrap.servers": kafka}, [topic])[topic][0]
    assert (low, high) == (0, 300)
    # Small Arrow batches and consume() calls, so the range spans several of each.
    monkeypatch.setattr(kafka_source, "ARROW_BATCH_ROWS", 64)
    monkeypatch.setattr(kafka_source, "CONSUME_BATCH", 50)
    options = source_options(
        kafka, [topic], {}, "earliest", None, parse_fields=[("order_id", "string"), ("amount", "int")]
    )
    rows = read_all(options, KafkaInputPartition(topic, 0, 37, 251))

    assert rows.schema == kafka_source._arrow_schema([("order_id", "string"), ("amount", "int")])
    assert rows.column("offset").to_pylist() == list(range(37, 251))
    got = rows.to_pylist()
    for row in got:
        i = row["offset"]
        assert row["topic"] == topic and row["partition"] == 0
        assert row["key"] == (None if i % 5 == 0 else f"k{i}".encode())
        assert json.loads(row["value"]) == {"order_id": f"o{i}", "amount": i}
        assert int(row["timestamp"].timestamp() * 1000) == CREATE_MS + i
        assert row["timestampType"] == 0  # create time, as Spark's Kafka source says it
        want_headers = [{"key": "trace", "value": f"t{i}".encode()}, {"key": "empty", "value": None}]
        assert row["headers"] == (want_headers if i % 3 == 0 else None)
        assert row["_parsed"] == {"order_id": f"o{i}", "amount": i, "_corrupt": None}


def test_reader_replays_the_same_records_and_reads_to_the_end(kafka: str, topic: str) -> None:
    produce_with_headers(kafka, topic, 120)
    options = source_options(kafka, [topic], {}, "earliest", None)
    first = read_all(options, KafkaInputPartition(topic, 0, 0, 120))
    again = read_all(options, KafkaInputPartition(topic, 0, 0, 120))
    assert first.num_rows == 120 and "_parsed" not in first.column_names
    assert first.equals(again)
    # A range that starts at the last record still reads it (and stops).
    last: Any = read_all(options, KafkaInputPartition(topic, 0, 119, 120))
    assert last.column("offset").to_pylist() == [119]


def test_producing_to_fewer_partitions_keeps_a_key_in_one_and_the_rest_empty(kafka: str, topic: str) -> None:
    """The benchmark's --partitions: the generator's producer uses only the topic's first N partitions."""
    from confluent_kafka import Consumer, TopicPartition

    from riverhouse.platform.generator import produce

    keys = [f"k{i % 40}".encode() for i in range(400)]  # ten copies of each of 40 keys
    assert produce(kafka, topic, iter((k, b"{}") for k in keys), partitions=2) == 400
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
