"""Kafka topics as a sink: exactly once on the real broker, read back by a plain read_committed consumer.

The consumer here is confluent-kafka's own, configured as a downstream service would be
(`isolation.level=read_committed`), not Riverhouse's reader. Expected rows come from the
events the test produced (or wrote to Delta), never from the sink's code.
"""

from __future__ import annotations

import json
import random
import shutil
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import CommitProperties, write_deltalake

from riverhouse.platform.importers.kaflowsql import import_kaflowsql
from riverhouse.platform.kafka.generator import GeneratorConfig, orders
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.sink.topic import TopicSink, TopicSinkError, TopicSinkFenced, produce_topics, reset_topic_sink
from riverhouse.platform.sink.topic_check import topic_matches_delta
from riverhouse.platform.spec import PipelineSpec, load_spec, parse_spec
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout
from tests.conftest import orders_spec_data, produce

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[1] / "fixtures" / "migrate"
BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=6)


def committed_records(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Any]:
    """Every record of `topic` a consumer with `isolation` reads, up to the end of each partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=15).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records, ended = [], set()
        while len(ended) < len(partitions):
            message = consumer.poll(10)
            assert message is not None, f"no progress reading {topic}"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                ended.add(message.partition())
                continue
            records.append(message)
        return records
    finally:
        consumer.close()


def values(records: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(r.value()) for r in records]


# ------------------------------------------------------------------ sink alone (Delta written by delta-rs)
def silver_spec(topic: str, **sink: Any) -> PipelineSpec:
    return parse_spec(
        {
            "name": "topicsink",
            "sources": {
                "orders": {
                    "topic": f"in_{topic}",
                    "fields": {"order_id": "string", "amount": "int", "created_at": "timestamp"},
                    "key": ["order_id"],
                }
            },
            "sink": {"kind": "kafka", "topic": topic, **sink},
        }
    )


def write_silver(settings: Settings, spec: PipelineSpec, ids: range, rebuild: str | None = None) -> None:
    """A silver-shaped Delta commit (what the ingest writes), one file per day."""
    rows = pa.table(
        {
            "order_id": [f"o{i}" for i in ids],
            "amount": pa.array(list(ids), pa.int32()),
            "created_at": pa.array([BASE + timedelta(minutes=i) for i in ids], pa.timestamp("us", tz="UTC")),
            "_event_date": pa.array([date(2026, 1, 1 + i % 2) for i in ids]),
        }
    )
    meta = CommitProperties(custom_metadata={"userMetadata": json.dumps({"riverhouse.rebuild": rebuild})})
    path = TableLayout(settings.warehouse, spec.name).silver("orders")
    write_deltalake(
        path, rows, partition_by=["_event_date"], mode="append", commit_properties=meta if rebuild else None
    )


def test_a_fenced_producer_stops_with_a_clear_error(kafka: str, topic: str, settings: Settings) -> None:
    spec = silver_spec(topic)
    write_silver(settings, spec, range(0, 50))
    first = TopicSink(spec, spec.topic_sinks[0], settings, log=lambda m: None)
    first.open()
    newer = TopicSink(spec, spec.topic_sinks[0], settings, log=lambda m: None)
    newer.open()  # the same transactional.id: Kafka fences `first`
    try:
        with pytest.raises(TopicSinkFenced, match=r"another instance of pipeline 'topicsink'.*fenced"):
            first.produce_new_versions()
        result = newer.produce_new_versions()
    finally:
        newer.close()
        first._producer = None  # fenced: nothing to flush
    assert result.rows == 50
    assert sorted(r["order_id"] for r in values(committed_records(kafka, topic))) == sorted(f"o{i}" for i in range(50))


def test_a_fence_found_by_librdkafka_first_is_still_named(kafka: str, topic: str, settings: Settings) -> None:
    """CI's race: the fence reached librdkafka's thread between two produce() calls of one transaction."""
    from confluent_kafka import KafkaError, KafkaException

    spec = silver_spec(topic, partitions=3)
    first = TopicSink(spec, spec.topic_sinks[0], settings, log=lambda m: None)
    first.open()
    newer = TopicSink(spec, spec.topic_sinks[0], settings, log=lambda m: None)
    try:
        first._producer.begin_transaction()
        newer.open()  # fences `first`, which does not know it yet
        with pytest.raises(KafkaException):  # adding partition 0 to the transaction meets the fence
            first._producer.produce(topic, b"a", partition=0)
            first._producer.flush(10)
        with pytest.raises(KafkaException) as later:
            first._producer.produce(topic, b"b", partition=1)
        assert later.value.args[0].code() == KafkaError._FATAL  # all a later produce() says
        assert first._fenced(later.value.args[0])
    finally:
        newer.close()
        first._producer = None  # fenced: nothing to flush


def test_large_versions_go_in_bounded_transactions_and_backfills_are_emitted_again(
    kafka: str, topic: str, settings: Settings
) -> None:
    spec = silver_spec(topic, transaction_rows=40, key=["order_id"], partitions=3)
    write_silver(settings, spec, range(0, 100))  # two files of 50 rows: slices of 40 + 10 each
    write_silver(settings, spec, range(100, 105))
    (result,) = produce_topics(spec, settings, log=lambda m: None)
    # version 0: each file's slices are 40 and 10 rows; 10 + 40 would pass 40, so 40 | 10 | 40 | 10: four
    # transactions, and one for version 1
    assert (result.rows, result.versions_produced, result.transactions) == (105, [0, 1], 5)
    assert topic_matches_delta(spec, settings, result)[0]
    write_silver(settings, spec, range(0, 10), rebuild="2026-01-01T00:00:00+00:00/2026-01-02T00:00:00+00:00")
    (again,) = produce_topics(spec, settings, log=lambda m: None)
    assert (again.rows, again.versions_produced) == (10, [2])
    passed, metadata = topic_matches_delta(spec, settings, again)
    assert passed and metadata["rows_in_topic"] == 10

    records = committed_records(kafka, topic)
    assert len(records) == 115
    by_version: dict[bytes, list[str]] = {}
    for record in records:
        headers = dict(record.headers())
        by_version.setdefault(headers["riverhouse.version"], []).append(record.key().decode())
        assert ("riverhouse.rebuild" in headers) == (headers["riverhouse.version"] == b"2")
    assert sorted(by_version[b"0"]) == sorted(f"o{i}" for i in range(100))
    assert sorted(by_version[b"2"]) == sorted(f"o{i}" for i in range(10))  # the backfilled rows, again
    # keyed records: each key always lands in one partition (Java's murmur2, as librdkafka's murmur2_random)
    partitions: dict[bytes, set[int]] = {}
    for record in records:
        partitions.setdefault(record.key(), set()).add(record.partition())
    assert all(len(p) == 1 for p in partitions.values()) and len({r.partition() for r in records}) == 3
    assert produce_topics(spec, settings, log=lambda m: None)[0].rows == 0  # nothing new: nothing produced


def test_a_recreated_table_is_refused_until_reset(kafka: str, topic: str, settings: Settings) -> None:
    spec = silver_spec(topic)
    write_silver(settings, spec, range(0, 20))
    assert produce_topics(spec, settings, log=lambda m: None)[0].rows == 20
    shutil.rmtree(TableLayout(settings.warehouse, spec.name).silver("orders"))
    write_silver(settings, spec, range(100, 105))  # the same path, a new Delta table (a new id)
    with pytest.raises(TopicSinkError, match=r"holds rows of another Delta table.*riverhouse reset"):
        produce_topics(spec, settings, log=lambda m: None)
    assert reset_topic_sink(spec, spec.topic_sinks[0], settings, log=lambda m: None)
    assert produce_topics(spec, settings, log=lambda m: None)[0].rows == 5  # the new table, from its start
    keys = sorted(r.key().decode() for r in committed_records(kafka, topic))
    assert keys == sorted([f"o{i}" for i in range(20)] + [f"o{i}" for i in range(100, 105)])


# ------------------------------------------------------------------ end to end with Spark
def test_clickhouse_and_topic_sinks_get_the_same_rows(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    records, stats = orders(GeneratorConfig(count=300, duplicate_rate=0.3, malformed=5, seed=11))
    records = list(records)
    produce(kafka, topic, records)
    data = orders_spec_data(topic, name="both_sinks", max_offsets=120, batch_size=50)
    data["sinks"] = [data.pop("sink"), {"kind": "kafka", "topic": f"{topic}_clean", "transaction_rows": 70}]
    spec = parse_spec(data)
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()

    expected = sorted({json.loads(v)["order_id"] for _, v in records if v and v.startswith(b'{"order_id":"o-')})
    assert len(expected) == stats.expected_unique == 300
    in_topic = committed_records(kafka, f"{topic}_clean")
    assert sorted(r["order_id"] for r in values(in_topic)) == expected  # each once
    assert sorted(r.key().decode() for r in in_topic) == expected  # keyed by the source key by default
    with open_client(settings.clickhouse_dsn) as client:
        loaded = sorted(r[0] for r in client.query(f"SELECT order_id FROM {qualified_table(spec)}").result_rows)
    assert loaded == expected
    assert summary["topic_rows_produced"] == 300 and summary["clickhouse_rows_loaded"] == 300
    assert summary["topic_transactions"] >= 300 // 70  # bounded: no transaction holds more than 70 rows
    assert Pipeline(spec, settings, spark=spark, log=lambda m: None).run()["topic_rows_produced"] == 0


def test_kaflowsql_pipeline_imported_runs_into_its_topic(
    spark: Any, kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    """KaflowSQL's documented example, imported as is (its topics renamed), against a plain Python reference."""
    rng = random.Random(28)
    names = {t: f"{topic}_{t}" for t in ("transactions", "users", "merchants", "enriched_transactions")}
    text = (FIXTURES / "kaflowsql_transactions.yaml").read_text().replace("format: avro", "format: json")
    for original, renamed in names.items():
        text = text.replace(f" {original}", f" {renamed}")
    (tmp_path / "kaflow.yaml").write_text(text)
    result = import_kaflowsql(tmp_path / "kaflow.yaml")
    assert result.unmapped == []
    spec_path = tmp_path / "imported.yaml"
    spec_path.write_text(result.to_yaml())
    spec = load_spec(spec_path)
    assert spec.clickhouse_sink is None and [s.topic for s in spec.topic_sinks] == [names["enriched_transactions"]]

    def produce_at(name: str, events: list[tuple[str, dict[str, Any], datetime]]) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": kafka, "linger.ms": 5, "log_level": 0})
        for key, value, at in sorted(events, key=lambda e: e[2]):
            ts = int(at.timestamp() * 1000)
            producer.produce(names[name], key=key.encode(), value=json.dumps(value).encode(), timestamp=ts)
        assert producer.flush(30) == 0

    merchants = {f"m{i}": f"Merchant {i}" for i in range(4)}  # m4 has no row: its transactions lack merchant_name
    users = {}  # user -> (email, risk, time of the profile event)
    for n in range(8):
        if n == 7:
            continue  # u7 has no profile: email is empty, the row is required to have one
        at = BASE + timedelta(minutes=rng.randint(0, 180)) if n != 6 else BASE - timedelta(hours=5)  # u6: too old
        users[f"u{n}"] = (f"u{n}@example.com", rng.randint(1, 99), at)
    transactions = []
    for i in range(60):
        at = BASE + timedelta(minutes=rng.randint(0, 200))
        amount = rng.choice([-5.0, 0.0, 12.5, 999.0, 1500.0, 42.25])
        value = {"transaction_id": f"t{i:03d}", "user_id": f"u{rng.randint(0, 7)}", "amount": amount}
        transactions.append((value["transaction_id"], {**value, "merchant_id": f"m{rng.randint(0, 4)}"}, at))
    produce_at("merchants", [(m, {"merchant_id": m, "merchant_name": n}, BASE) for m, n in merchants.items()])
    produce_at("users", [(u, {"user_id": u, "email": e, "risk_score": r}, at) for u, (e, r, at) in users.items()])
    produce_at("transactions", transactions)

    Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)

    # KaflowSQL's semantics as docs/migrating.md states them: users join within their 2h TTL of the
    # transaction's time, merchants (a dimension) always; WHERE amount > 0; rows still missing a
    # required column (email, merchant_name) are not emitted.
    expected = {}
    for _, t, at in transactions:
        if not t["amount"] > 0:
            continue
        user = users.get(t["user_id"])
        email, risk = (user[0], user[1]) if user and abs(user[2] - at) <= timedelta(hours=2) else (None, None)
        merchant = merchants.get(t["merchant_id"])
        if email is None or merchant is None:
            continue
        band = "high" if t["amount"] > 1000 else "normal"
        expected[t["transaction_id"]] = {
            **t,
            "email": email,
            "risk_score": risk,
            "merchant_name": merchant,
            "amount_band": band,
        }
    assert 10 < len(expected) < 60  # the data exercises the filter, the TTL, the dimension and require
    records = committed_records(kafka, names["enriched_transactions"])
    got = {r.key().decode(): json.loads(r.value()) for r in records}
    assert len(records) == len(got)  # no key twice: each transaction once
    assert got == expected
    assert yaml.safe_load(spec_path.read_text())["sink"]["key"] == ["transaction_id"]
