"""The yardsticks: what the broker and ClickHouse allow on this machine, and a plain consumer's dedup."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from riverhouse.platform.sink.clickhouse import open_client
from riverhouse_bench.common import (
    CLICKHOUSE_BATCH_ROWS,
    ORDER_FIELDS,
    READ_TUNING,
    assign_from_start,
    generated_orders,
)
from riverhouse_bench.metering import CpuMeter

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench


def kafka_read_limit(bench: Bench, topic: str, messages: int) -> dict[str, Any]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bench.state.bootstrap,
            "group.id": f"rl-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 3,
            **READ_TUNING,
        }
    )
    started = time.monotonic()
    assign_from_start(consumer, topic)
    seen = 0
    while seen < messages and time.monotonic() - started < 300:
        for msg in consumer.consume(10_000, timeout=1.0):
            if msg.error() is None:
                seen += 1
    seconds = time.monotonic() - started
    consumer.close()
    return {"events": seen, "seconds": seconds, "events_per_s": seen / seconds, "exact": seen == messages}


def clickhouse_insert_limit(bench: Bench, rows: int) -> dict[str, Any]:
    table = generated_orders(range(rows))
    batch = CLICKHOUSE_BATCH_ROWS
    with open_client(bench.settings.clickhouse_dsn) as client:
        client.command("DROP TABLE IF EXISTS bench_insert_limit")
        client.command(
            "CREATE TABLE bench_insert_limit (order_id String, user_id String, amount Int32, "
            "price Float64, created_at DateTime64(6, 'UTC')) ENGINE = MergeTree ORDER BY order_id"
        )
        started = time.monotonic()
        for offset in range(0, rows, batch):
            client.insert_arrow("bench_insert_limit", table.slice(offset, batch))
        seconds = time.monotonic() - started
        count = client.query("SELECT count() FROM bench_insert_limit").result_rows[0][0]
    return {
        "events": rows,
        "seconds": seconds,
        "events_per_s": rows / seconds,
        "exact": count == rows,
        "batch_rows": batch,
    }


def baseline_consumer(bench: Bench, topic: str, messages: int, expected_unique: int) -> dict[str, Any]:
    """The yardstick: confluent-kafka -> json + set dedup -> batched inserts, commit after each insert."""
    from confluent_kafka import Consumer

    batch_rows = 50_000
    consumer = Consumer(
        {
            "bootstrap.servers": bench.state.bootstrap,
            "group.id": f"baseline-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 3,
            **READ_TUNING,
        }
    )
    seen_keys: set[str] = set()
    columns: dict[str, list[Any]] = {k: [] for k in ORDER_FIELDS}
    consumed = inserted = 0
    last: dict[int, Any] = {}  # partition -> last message consumed
    with open_client(bench.settings.clickhouse_dsn) as client, CpuMeter() as cpu:
        client.command("DROP TABLE IF EXISTS bench_baseline")
        client.command(
            "CREATE TABLE bench_baseline (order_id String, user_id String, amount Int32, "
            "price Float64, created_at String) ENGINE = MergeTree ORDER BY order_id"
        )

        def flush() -> None:
            nonlocal inserted
            n = len(columns["order_id"])
            if n:
                client.insert(
                    "bench_baseline", list(columns.values()), column_names=list(columns), column_oriented=True
                )
                inserted += n
                for values in columns.values():
                    values.clear()
            if last:  # offsets after each insert: at-least-once
                from confluent_kafka import TopicPartition

                consumer.commit(
                    offsets=[TopicPartition(topic, p, m.offset() + 1) for p, m in last.items()], asynchronous=False
                )

        started = time.monotonic()
        assign_from_start(consumer, topic)
        while consumed < messages and time.monotonic() - started < 600:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is not None:
                    continue
                consumed += 1
                last[msg.partition()] = msg
                try:
                    event = json.loads(msg.value())
                except ValueError:
                    continue
                key = event.get("order_id")
                if key is None or key in seen_keys:
                    continue
                seen_keys.add(key)
                for name in ORDER_FIELDS:
                    columns[name].append(event.get(name))
            if len(columns["order_id"]) >= batch_rows:
                flush()
        flush()
        seconds = time.monotonic() - started
        rows = client.query("SELECT count(), uniqExact(order_id) FROM bench_baseline").result_rows[0]
    consumer.close()
    return {
        "events": consumed,
        "seconds": seconds,
        "events_per_s": consumed / seconds,
        "exact": tuple(rows) == (expected_unique, expected_unique) and consumed == messages,
        "rows": rows[0],
        "expected_unique": expected_unique,
        "batch_rows": batch_rows,
        "cpu": cpu.window(started, started + seconds),
    }
