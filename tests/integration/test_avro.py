"""Avro sources through a real schema registry (Apicurio, `riverhouse registry start`'s build).

The records are in the Confluent wire format, produced with fastavro against the registry's
own ids; the expected rows come from the generator's bookkeeping, never from the pipeline.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.avro import local_registry
from riverhouse.platform.avro.produce import SCHEMAS, as_avro, encode, register
from riverhouse.platform.errors import PipelineError
from riverhouse.platform.kafka.generator import GeneratorConfig, expected_join, orders, user_events
from riverhouse.platform.pipeline import Pipeline, Window
from riverhouse.platform.runtime.processes import free_port
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.spec_base import SpecError
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import produce, riverhouse_cmd, subprocess_env
from tests.integration.test_crash import clickhouse_ids, silver_ids

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

ORDER = SCHEMAS["orders"]
WITH_COUPON = {**ORDER, "fields": [*ORDER["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}]}
AMOUNT_AS_TEXT = {
    **ORDER,
    "fields": [f if f["name"] != "amount" else {"name": "amount", "type": "string"} for f in ORDER["fields"]],
}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_registry.RegistryState]:
    state_dir = tmp_path_factory.mktemp("registry")
    state = local_registry.start(state_dir)
    try:
        yield state
    finally:
        local_registry.stop(state_dir)


def avro_spec_data(topic: str, url: str, name: str = "avro_orders", **source: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kafka": {"bootstrap_servers": "local", "max_offsets_per_trigger": source.pop("max_offsets", 200_000)},
        "sources": {
            "orders": {
                "topic": topic,
                "format": "avro",
                "schema_registry": {"url": url},
                "key": ["order_id"],
                "event_time": {"field": "created_at"},
                "dedup": {"key": ["order_id"], "window": "1h"},
                **source,
            }
        },
        "sink": {"table": f"{name}_orders", "order_by": ["order_id"], "batch_size": 1000},
    }


def quarantine_reasons(settings: Settings, spec: Any) -> list[str]:
    table = open_table(TableLayout(settings.warehouse, spec.name).quarantine("orders"))
    return table.to_pyarrow_dataset().to_table(columns=["_reason"]).column("_reason").to_pylist()


def set_compatibility(api: str, level: str) -> None:
    """The registry-wide compatibility rule (Apicurio applies it even where a subject says NONE)."""
    request = urllib.request.Request(
        f"{api}/config",
        method="PUT",
        data=json.dumps({"compatibility": level}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    urllib.request.urlopen(request, timeout=10).close()


def test_avro_orders_dedup_into_silver_and_clickhouse_exactly(
    registry: local_registry.RegistryState, kafka: str, topic: str, settings: Settings, spark: Any
) -> None:
    schema_id = register(registry.api, f"{topic}-value", ORDER)
    records, stats = orders(GeneratorConfig(count=600, duplicate_rate=0.2, malformed=6, out_of_order=0.1, seed=5))
    produce(kafka, topic, list(as_avro(records, ORDER, schema_id)))
    spec = parse_spec(avro_spec_data(topic, registry.api))
    # The fields come from the registry's latest schema (the spec lists none).
    assert [(f.name, f.type) for f in spec.sources["orders"].fields] == [
        ("order_id", "string"), ("user_id", "string"), ("amount", "int"), ("price", "double"), ("created_at", "timestamp"),
    ]  # fmt: skip
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    expected = sorted(e["order_id"] for e in stats.events)
    assert silver_ids(settings, spec) == expected
    assert clickhouse_ids(settings, spec) == expected
    assert summary["duplicates_dropped"] == stats.duplicates and summary["quarantined"] == 6
    reasons = quarantine_reasons(settings, spec)
    assert sum(r.startswith("not in the Confluent wire format") for r in reasons) == 2
    assert sum(r.startswith(f"unknown schema id {2**31 - 1}") for r in reasons) == 2
    assert sum(r == "the Avro body does not decode with its schema" for r in reasons) == 2
    # Values and times arrive as written (timestamp-millis -> timestamp).
    first = stats.events[0]
    row = spark.read.format("delta").load(TableLayout(settings.warehouse, spec.name).silver("orders"))
    got = row.where(row.order_id == first["order_id"]).select("amount", "price", "created_at").first()
    assert (got.amount, got.price) == (first["amount"], first["price"])
    assert got.created_at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" == first["created_at"]
    # A backfill decodes bronze's raw Avro bytes again (writer schemas from the registry): the same rows.
    window = Window(datetime(2025, 12, 31, 23, tzinfo=UTC), datetime(2026, 1, 1, 2, tzinfo=UTC))
    rebuilt = Pipeline(spec, settings, spark=spark, log=lambda m: None).rebuild(window)
    assert rebuilt.silver["orders"].rows == len(expected) and not rebuilt.silver["orders"].changed
    assert clickhouse_ids(settings, spec) == expected


def test_a_join_of_two_avro_topics_matches_the_reference_join(
    registry: local_registry.RegistryState, kafka: str, topic: str, settings: Settings, spark: Any
) -> None:
    """pipelines/orders_enriched.yaml with both sources Avro (fields from the registry): the
    left temporal join's rows equal the generator's own reference join."""
    cfg = GeneratorConfig(count=300, duplicate_rate=0.2, malformed=3, users=40, seed=17)
    order_records, order_stats = orders(cfg)
    user_records, user_stats = user_events(cfg)
    data = yaml.safe_load((REPO / "pipelines" / "orders_enriched.yaml").read_text())
    data["name"] = "avro_join"
    for source, kind, records in (("orders", "orders", order_records), ("user_events", "user_events", user_records)):
        name = f"{topic}_{source}"
        produce(
            kafka, name, list(as_avro(records, SCHEMAS[kind], register(registry.api, f"{name}-value", SCHEMAS[kind])))
        )
        block = data["sources"][source]
        del block["fields"]  # read from the registry
        block |= {"topic": name, "format": "avro", "schema_registry": {"url": registry.api}}
    spec = parse_spec(data)
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)
    assert summary["inserted"] == order_stats.expected_unique + user_stats.expected_unique
    with open_client(settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT order_id, user_name FROM {qualified_table(spec)}").result_rows
    assert len(rows) == len(dict(rows)), "an order was emitted twice"
    assert dict(rows) == expected_join(order_stats, user_stats, timedelta(hours=1))["names"]


def test_a_version_registered_after_the_spec_was_loaded_is_read_and_an_incompatible_one_quarantined(
    registry: local_registry.RegistryState, kafka: str, topic: str, settings: Settings, spark: Any
) -> None:
    subject = f"{topic}-value"
    v1 = register(registry.api, subject, ORDER)
    spec = parse_spec(avro_spec_data(topic, registry.api, max_offsets=3))  # reader: v1; several batches
    v2 = register(registry.api, subject, WITH_COUPON)  # compatible (a field with a default)
    set_compatibility(registry.api, "NONE")  # let the producer register a breaking change
    try:
        v3 = register(registry.api, subject, AMOUNT_AS_TEXT)
    finally:
        set_compatibility(registry.api, "BACKWARD")
    assert len({v1, v2, v3}) == 3
    when = 1767261600000  # 2026-01-01T10:00:00Z
    values = [
        encode(ORDER, {"order_id": "a1", "user_id": "u1", "amount": 1, "price": 1.5, "created_at": when}, v1),
        encode(WITH_COUPON, {"order_id": "a2", "user_id": "u2", "amount": 2, "price": 2.5, "created_at": when, "coupon": "X"}, v2),
        encode(AMOUNT_AS_TEXT, {"order_id": "a3", "user_id": "u3", "amount": "3", "price": 3.5, "created_at": when}, v3),
        encode(ORDER, {"order_id": "a4", "user_id": "u4", "amount": 4, "price": 4.5, "created_at": when}, v1),
    ]  # fmt: skip
    produce(kafka, topic, [(b"k", v) for v in values])
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    assert silver_ids(settings, spec) == ["a1", "a2", "a4"]
    assert quarantine_reasons(settings, spec) == [
        f"schema id {v3} cannot be read as the reader schema: field 'amount' is string in the writer's schema "
        "and int in the reader's"
    ]


def test_the_registry_down_at_the_start_is_a_clear_error(
    registry: local_registry.RegistryState, kafka: str, topic: str, settings: Settings, spark: Any
) -> None:
    down = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    with pytest.raises(SpecError, match=r"cannot reach the schema registry at http://127\.0\.0\.1:\d+/apis/ccompat/v7"):
        parse_spec(avro_spec_data(topic, down))  # the fields come from it
    with pytest.raises(SpecError, match=r"has no subject 'nobody-value': register the topic's schema first"):
        parse_spec(avro_spec_data("nobody", registry.api))
    spec = parse_spec(avro_spec_data(topic, down, avro_schema=ORDER))  # the reader schema is the spec's own
    produce(
        kafka,
        topic,
        [(b"k", encode(ORDER, {"order_id": "a", "user_id": "u", "amount": 1, "price": 1.0, "created_at": 0}, 1))],
    )
    with pytest.raises(PipelineError, match=r"cannot reach the schema registry at .*riverhouse registry start"):
        Pipeline(spec, settings, spark=spark, log=lambda m: None).run()


def test_the_registry_down_mid_run_keeps_cached_schemas_and_a_new_id_fails_the_batch_with_nothing_lost(
    tmp_path: Path, kafka: str, topic: str, settings: Settings, spark: Any
) -> None:
    """The registry is stopped while the first batch is written: later batches decode with the
    schemas the run fetched at its start; a record whose id it never fetched fails its batch with
    a clear message; with the registry back the next run ends with every row exactly once."""
    state_dir = tmp_path / "registry"
    state = local_registry.start(state_dir)
    subject = f"{topic}-value"
    v1 = register(state.api, subject, ORDER)
    other = register(state.api, f"{topic}-other-value", WITH_COUPON)  # an id, but not of this subject
    when = 1767261600000
    values = [
        encode(ORDER, {"order_id": f"m{i}", "user_id": "u", "amount": i, "price": 1.0, "created_at": when}, v1)
        for i in range(6)
    ]
    values.append(encode(WITH_COUPON, {"order_id": "odd", "user_id": "u", "amount": 9, "price": 1.0, "created_at": when, "coupon": None}, other))  # fmt: skip
    produce(kafka, topic, [(b"k", v) for v in values])
    spec_path = tmp_path / "avro.yaml"
    spec_path.write_text(yaml.safe_dump(avro_spec_data(topic, state.api, max_offsets=2)))
    spec = parse_spec(avro_spec_data(topic, state.api, avro_schema=ORDER))  # the same tables, readable offline
    bronze = TableLayout(settings.warehouse, spec.name).bronze("orders")
    try:
        # The stall must outlast noticing batch 0 in bronze and stopping the registry's JVM, on a
        # machine busy with the rest of the suite: 10 s was not always enough (the run then read
        # every batch with the registry still up, and ended well).
        proc = subprocess.Popen(
            [*riverhouse_cmd(), "run", str(spec_path), "--json"],
            env=subprocess_env(settings, RIVERHOUSE_STALL_AT="after_bronze_commit", RIVERHOUSE_STALL_S="20"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 300
        while (DeltaLog(bronze).latest_version() or 0) < 1:  # batch 0 is in bronze, stalled after it
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first batch never reached bronze"
            time.sleep(0.1)
        # Down at once: in full test runs the registry's JVM has ignored SIGTERM and kept answering
        # until stop's SIGKILL 30 s later, after the stalled batch went on (the cause is not found).
        local_registry.stop(state_dir, timeout_s=0)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 1, f"{stdout[-2000:]}\n{stderr[-3000:]}"
        assert f"schema id {other} is not among the cached schemas of subject '{subject}'" in stderr, stderr[-3000:]
        assert "the registry cannot be reached" in stderr
        written = silver_ids(settings, spec)
        assert written and set(written) <= {f"m{i}" for i in range(6)}  # the batches before it, decoded from the cache
        restarted = local_registry.start(state_dir)
        assert restarted.url == state.url  # same port, same schemas (the H2 file): the ids in Kafka stay valid
        again = subprocess.run(
            [*riverhouse_cmd(), "run", str(spec_path), "--json"],
            env=subprocess_env(settings), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
    finally:
        local_registry.stop(state_dir)
    assert silver_ids(settings, spec) == [f"m{i}" for i in range(6)]
    assert clickhouse_ids(settings, spec) == [f"m{i}" for i in range(6)]
    assert [r.split(" (")[0] for r in quarantine_reasons(settings, spec)] == [f"unknown schema id {other}"]


def test_registry_cli_lifecycle_and_generate_avro_through_it(kafka: str, topic: str, settings: Settings) -> None:
    """`riverhouse registry start|status|stop` and `riverhouse generate --format avro` against the local registry."""
    env = subprocess_env(settings)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*riverhouse_cmd(), *args], env=env, capture_output=True, text=True, timeout=180)

    refused = cli("generate", "--format", "avro", "--topic", topic, "--count", "5")
    assert refused.returncode == 1 and "riverhouse registry start" in refused.stderr
    started = cli("registry", "start")
    try:
        assert started.returncode == 0, started.stderr
        status = json.loads(cli("registry", "status", "--json").stdout)
        assert status["running"] and status["url"].startswith("http://127.0.0.1:")
        made = cli("generate", "--format", "avro", "--topic", topic, "--count", "40", "--malformed", "3", "--json")
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)["messages"] == 40 + 4 + 3  # 10% duplicates, 3 malformed
        spec = parse_spec(avro_spec_data(topic, status["url"], name="cli_avro"))  # the schema it registered
        assert [f.name for f in spec.sources["orders"].fields] == [f["name"] for f in ORDER["fields"]]
    finally:
        stopped = cli("registry", "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    down = cli("registry", "status")
    assert down.returncode == 1 and "not running" in down.stdout


# ------------------------------------------------------------------ the Kafka sink writing Avro
SINK_BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=6)


def avro_sink_spec(topic: str, url: str) -> Any:
    fields = {
        "order_id": "string",
        "amount": "long",
        "price": "double",
        "created_at": "timestamp",
        "tags": "array<string>",
        "attrs": "map<string,long>",
    }
    source = {"topic": f"in_{topic}", "fields": fields, "key": ["order_id"]}
    sink = {"kind": "kafka", "topic": topic, "format": "avro", "schema_registry": {"url": url}}
    return parse_spec({"name": "avrosink", "sources": {"orders": source}, "sink": sink})


def test_the_kafka_sink_writes_avro_a_registry_consumer_decodes(
    registry: local_registry.RegistryState, kafka: str, topic: str, settings: Settings
) -> None:
    """Values in Confluent's wire format under `<topic>-value`; every type decoded as it was written."""
    import fastavro
    import pyarrow as pa
    from deltalake import write_deltalake

    from riverhouse.platform.sink.topic import TopicSink
    from tests.integration.test_topic_sink import committed_records

    spec = avro_sink_spec(topic, registry.api)
    expected = {
        f"o{i}": {
            "order_id": f"o{i}",
            "amount": 10**12 + i,  # beyond an int
            "price": i / 4,
            "created_at": SINK_BASE + timedelta(minutes=i, microseconds=i),
            "tags": [f"t{i}", None] if i % 3 else None,
            "attrs": {"n": i, "none": None} if i % 2 else {},
        }
        for i in range(40)
    }
    rows = list(expected.values())
    table = pa.table(
        {
            "order_id": [r["order_id"] for r in rows],
            "amount": pa.array([r["amount"] for r in rows], pa.int64()),
            "price": [r["price"] for r in rows],
            "created_at": pa.array([r["created_at"] for r in rows], pa.timestamp("us", tz="UTC")),
            "tags": pa.array([r["tags"] for r in rows], pa.list_(pa.string())),
            "attrs": pa.array([list(r["attrs"].items()) for r in rows], pa.map_(pa.string(), pa.int64())),
            "_event_date": [r["created_at"].date() for r in rows],
        }
    )
    path = TableLayout(settings.warehouse, spec.name).silver("orders")
    write_deltalake(path, table.slice(0, 25), partition_by=["_event_date"], mode="append")
    write_deltalake(path, table.slice(25), partition_by=["_event_date"], mode="append")  # a second version
    # The subject exists (another producer's, KaflowSQL's record name): the sink keeps the name, since
    # a renamed record is an incompatible change, and adds its fields as a compatible new version.
    earlier = {
        "type": "record",
        "name": "Value",
        "fields": [{"name": "order_id", "type": ["null", "string"], "default": None}],
    }
    register(registry.api, f"{topic}-value", earlier)
    with TopicSink(spec, spec.topic_sinks[0], settings, log=lambda m: None) as sink:
        assert sink.produce_new_versions().rows == 40

    records = committed_records(kafka, topic)
    assert len(records) == 40
    ids = {int.from_bytes(r.value()[1:5], "big") for r in records}
    assert {r.value()[0] for r in records} == {0} and len(ids) == 1  # magic byte; one schema for both versions
    with urllib.request.urlopen(f"{registry.api}/subjects/{topic}-value/versions/latest", timeout=10) as answer:
        latest = json.loads(answer.read())
    assert latest["id"] == ids.pop()  # registered under the topic name strategy's subject
    assert json.loads(latest["schema"])["name"] == "Value" and latest["version"] == 2
    writer = fastavro.parse_schema(json.loads(latest["schema"]))
    decoded = {}
    for record in records:
        value = fastavro.schemaless_reader(io.BytesIO(record.value()[5:]), writer, None)
        assert record.key() == value["order_id"].encode()  # keys stay text, as the JSON sink writes them
        decoded[value["order_id"]] = value
    assert decoded == expected

    # `riverhouse kafka tail --spec` shows the values decoded through the sink's registry.
    spec_file = settings.home / "avrosink.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_none=True)))
    tail = subprocess.run(
        [
            *riverhouse_cmd(),
            "kafka",
            "tail",
            topic,
            "--json",
            "--max",
            "0",
            "--spec",
            str(spec_file),
            "--bootstrap",
            kafka,
        ],
        env=subprocess_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tail.returncode == 0, tail.stderr
    shown = {json.loads(line)["key"]: json.loads(json.loads(line)["value"]) for line in tail.stdout.splitlines()}
    assert shown["o7"] == {**expected["o7"], "created_at": expected["o7"]["created_at"].isoformat()}
    assert len(shown) == 40


def test_an_avro_sink_spec_needs_its_registry_and_its_own_secrets() -> None:
    sink = {"kind": "kafka", "topic": "out", "format": "avro"}
    source = {"topic": "in", "fields": {"order_id": "string"}, "key": ["order_id"]}
    with pytest.raises(SpecError, match="format avro needs schema_registry"):
        parse_spec({"name": "p", "sources": {"orders": source}, "sink": sink})
    with pytest.raises(SpecError, match="schema_registry is for format avro"):
        parse_spec(
            {
                "name": "p",
                "sources": {"orders": source},
                "sink": {**sink, "format": "json", "schema_registry": {"url": "http://r:8081"}},
            }
        )
    other = {"url": "http://r:8081", "auth": {"username": "u", "password": "${env:RIVERHOUSE_SECRET_OTHER__PASSWORD}"}}
    with pytest.raises(SpecError, match=r"the sink of topic out\.schema_registry\.auth\.password"):
        parse_spec({"name": "p", "sources": {"orders": source}, "sink": {**sink, "schema_registry": other}})
