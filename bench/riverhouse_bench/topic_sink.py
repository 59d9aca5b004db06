"""topic_sink: the Kafka sink's throughput next to the ClickHouse loader's, on the same Delta versions.

The `riverhouse_dedup` scenario leaves the silver table of pipeline `bench_dedup` (every version
it committed). Both sinks then publish that same table from its first version: the ClickHouse
loader into a table of its own (a fresh ledger), the Kafka sink into a fresh topic in Kafka
transactions (`transaction_rows` rows each). Each is timed alone, from the Delta log to every
row committed; a read_committed count of the topic checks the result.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from riverhouse.platform.kafka.client import librdkafka_config
from riverhouse.platform.kafka.tail import read_committed
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.sink.loader import load_sink
from riverhouse.platform.sink.topic import produce_topics
from riverhouse.platform.spec import parse_spec
from riverhouse_bench.common import orders_spec
from riverhouse_bench.metering import CpuMeter

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench

SOURCE_PIPELINE = "bench_dedup"  # the riverhouse_dedup scenario's cold run: its silver is read here


def topic_sink(bench: Bench, transaction_rows: int = 100_000) -> dict[str, Any]:
    base = orders_spec(SOURCE_PIPELINE, SOURCE_PIPELINE).model_dump(mode="json", by_alias=True, exclude_none=True)
    clickhouse = {**base["sink"], "table": "bench_topic_sink_ch"}
    topic = f"bench_topic_sink_{int(time.time())}"
    kafka = {"kind": "kafka", "topic": topic, "key": ["order_id"], "transaction_rows": transaction_rows}
    spec = parse_spec({**{k: v for k, v in base.items() if k != "sink"}, "sinks": [clickhouse, kafka]})

    with CpuMeter() as cpu:
        started = time.monotonic()
        loaded = load_sink(spec, bench.settings, log=lambda m: None)
        clickhouse_seconds = time.monotonic() - started
    clickhouse_cpu = cpu.window(started, started + clickhouse_seconds)
    with open_client(bench.settings.clickhouse_dsn) as client:
        in_clickhouse = client.query(f"SELECT count() FROM {qualified_table(spec)}").result_rows[0][0]

    with CpuMeter() as cpu:
        started = time.monotonic()
        (produced,) = produce_topics(spec, bench.settings, log=lambda m: None)
        topic_seconds = time.monotonic() - started
    topic_cpu = cpu.window(started, started + topic_seconds)
    config = librdkafka_config(spec.kafka, bench.state.bootstrap)
    in_topic = sum(1 for _ in read_committed(config, topic))

    rows = loaded.rows_loaded
    return {
        "events": rows,
        "delta_versions": len(loaded.versions_loaded),
        "clickhouse": {
            "seconds": clickhouse_seconds,
            "events_per_s": rows / clickhouse_seconds if clickhouse_seconds else None,
            "cpu": clickhouse_cpu,
        },
        "topic": {
            "seconds": topic_seconds,
            "events_per_s": produced.rows / topic_seconds if topic_seconds else None,
            "transactions": produced.transactions,
            "transaction_rows": transaction_rows,
            "cpu": topic_cpu,
        },
        "seconds": topic_seconds,
        "events_per_s": produced.rows / topic_seconds if topic_seconds else None,
        "ratio": clickhouse_seconds / topic_seconds if topic_seconds else None,
        "exact": rows == in_clickhouse == produced.rows == in_topic and rows > 0,
    }
