"""The real local Kafka broker -> Spark -> Delta -> ClickHouse (chDB): exact rows, idempotent re-runs."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform.errors import PipelineError
from riverhouse.platform.ingest.stream import ingest
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import order, orders_spec, produce

pytestmark = pytest.mark.integration

EVENTS = [
    order("o1", "2026-01-01T10:00:00Z", amount=1),
    order("o1", "2026-01-01T10:00:00Z", amount=1),  # producer retry: exact duplicate
    order("o2", "2026-01-01T10:05:00Z", amount=2),
    order("o3", "2026-01-01T09:50:00Z", amount=3),  # out of order
    order("o4", "2026-01-01T10:00:00Z", amount=4),
    (b"x", b'{"order_id": "broken", '),  # invalid JSON
    (b"x", json.dumps({"order_id": "o9", "amount": "many"}).encode()),  # wrong type
    (b"x", json.dumps({"user_id": "u1", "amount": 1}).encode()),  # missing key
    (b"x", json.dumps({"order_id": None, "amount": 1}).encode()),  # null key
    (b"x", b'{"order_id": "\xc3\x28"}'),  # invalid UTF-8
    order("o2", "2026-01-01T10:35:00Z", amount=20),  # same key 30 min later: duplicate
    order("o4", "2026-01-01T12:00:00Z", amount=40),  # same key 2 h later: outside the window
    (b"x", json.dumps({"order_id": "big", "user_id": "u" * 3000}).encode()),  # oversized for this spec
]
EXPECTED_SILVER = {
    ("o1", "2026-01-01 10:00:00", 1),
    ("o2", "2026-01-01 10:05:00", 2),
    ("o3", "2026-01-01 09:50:00", 3),
    ("o4", "2026-01-01 10:00:00", 4),
    ("o4", "2026-01-01 12:00:00", 40),
}
EXPECTED_REASONS = [
    "not a JSON object",
    "field 'amount' should be int, got many",
    "missing required field 'order_id'",
    "missing required field 'order_id'",
    "value is not valid UTF-8",
    "message of",
]


def spec_for(topic: str, **kw: Any) -> Any:
    spec = orders_spec(topic, **kw)
    src = spec.sink_source.model_copy(update={"max_message_bytes": 2000})
    return spec.model_copy(update={"sources": {"orders": src}})


def silver_rows(settings: Settings, spec: Any) -> set[tuple[str, str, int]]:
    path = TableLayout(settings.warehouse, spec.name).silver("orders")
    table = open_table(path).to_pyarrow_dataset().to_table(columns=["order_id", "created_at", "amount"])
    return {(r["order_id"], r["created_at"].strftime("%Y-%m-%d %H:%M:%S"), r["amount"]) for r in table.to_pylist()}


def clickhouse_rows(settings: Settings, spec: Any) -> list[tuple[str, str, int]]:
    with open_client(settings.clickhouse_dsn) as client:
        rows = client.query(
            f"SELECT order_id, formatDateTime(created_at, '%Y-%m-%d %H:%i:%S'), amount FROM {qualified_table(spec)}"
        ).result_rows
    return sorted(tuple(r) for r in rows)


def quarantine_reasons(settings: Settings, spec: Any) -> list[str]:
    path = TableLayout(settings.warehouse, spec.name).quarantine("orders")
    table = open_table(path).to_pyarrow_dataset().to_table(columns=["_offset", "_reason"])
    return [r["_reason"] for r in sorted(table.to_pylist(), key=lambda r: r["_offset"])]


def versions(settings: Settings, spec: Any) -> dict[str, int]:
    layout = TableLayout(settings.warehouse, spec.name)
    return {layer: open_table(layout.path(layer, "orders")).version() for layer in ("bronze", "silver", "quarantine")}


def test_exact_rows_in_silver_quarantine_and_clickhouse(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    produce(kafka, topic, EVENTS, partition=0)
    spec = spec_for(topic, max_offsets=4)  # several micro-batches: dedup across batches too
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()

    assert summary["batches"] >= 3
    assert silver_rows(settings, spec) == EXPECTED_SILVER
    reasons = quarantine_reasons(settings, spec)
    assert len(reasons) == len(EXPECTED_REASONS)
    for got, want in zip(reasons, EXPECTED_REASONS, strict=True):
        assert got.startswith(want), (got, want)
    assert clickhouse_rows(settings, spec) == sorted(EXPECTED_SILVER)
    # Counts reconcile: every record read is inserted, dropped as a duplicate, or quarantined.
    assert summary["read"] == len(EVENTS)
    assert summary["read"] == summary["inserted"] + summary["duplicates_dropped"] + summary["quarantined"]
    assert summary["duplicates_dropped"] == 2 and summary["quarantined"] == 6
    # ClickHouse was loaded while the stream still ran (as batches landed), and the last
    # load reached silver's final version.
    assert summary["clickhouse_loads"] >= 2
    assert summary["last_loaded_version"] == versions(settings, spec)["silver"]

    # Re-running with no new data changes nothing anywhere.
    before = versions(settings, spec)
    again = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    assert again["read"] == 0 and again["clickhouse_rows_loaded"] == 0
    assert versions(settings, spec) == before
    assert clickhouse_rows(settings, spec) == sorted(EXPECTED_SILVER)


def test_a_decimal_field_is_exact_in_silver_and_clickhouse(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    from decimal import Decimal

    from riverhouse.platform.spec import parse_spec
    from tests.conftest import orders_spec_data

    data = orders_spec_data(topic, name="decimals")
    data["sources"]["orders"]["fields"]["price"] = "decimal(12,3)"
    spec = parse_spec(data)
    prices = {"d1": "0.1", "d2": "123456789.125", "d3": "0.001"}  # not exact as doubles: 0.1 + 0.001 != 0.101
    produce(kafka, topic, [
        (k.encode(), json.dumps({"order_id": k, "user_id": "u", "amount": 1, "price": p,
                                 "created_at": "2026-01-01T10:00:00Z"}).encode())
        for k, p in prices.items()
    ])  # fmt: skip
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    silver = open_table(TableLayout(settings.warehouse, spec.name).silver("orders")).to_pyarrow_dataset()
    assert {r["order_id"]: r["price"] for r in silver.to_table(columns=["order_id", "price"]).to_pylist()} == {
        k: Decimal(p) for k, p in prices.items()
    }
    with open_client(settings.clickhouse_dsn) as client:
        table = qualified_table(spec)
        column = client.query(f"SELECT type FROM system.columns WHERE name = 'price' AND table = '{spec.sink.table}'")
        assert column.result_rows == [("Nullable(Decimal(12, 3))",)]
        total = client.query(f"SELECT toString(sum(price)) FROM {table} WHERE order_id IN ('d1', 'd3')").result_rows
    assert total == [("0.101",)]  # exact decimal arithmetic in ClickHouse


def test_new_data_is_deduplicated_against_earlier_batches(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    spec = spec_for(topic)
    produce(kafka, topic, [order("a", "2026-02-01T00:00:00Z"), order("b", "2026-02-01T00:00:00Z")])
    first = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    assert first["inserted"] == 2
    produce(kafka, topic, [order("a", "2026-02-01T00:10:00Z", amount=7), order("c", "2026-02-01T00:00:00Z")])
    second = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    assert (second["read"], second["inserted"], second["duplicates_dropped"]) == (2, 1, 1)
    assert second["clickhouse_rows_loaded"] == 1
    assert [r[0] for r in clickhouse_rows(settings, spec)] == ["a", "b", "c"]


def test_bronze_keeps_every_record_with_coordinates(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    spec = spec_for(topic)
    produce(kafka, topic, EVENTS[:6], partition=1)
    ingest(spark, spec, settings)
    bronze = open_table(TableLayout(settings.warehouse, spec.name).bronze("orders")).to_pyarrow_dataset().to_table()
    assert bronze.num_rows == 6
    assert sorted(bronze.column("_offset").to_pylist()) == list(range(6))
    assert set(bronze.column("_partition").to_pylist()) == {1}
    assert sorted(bronze.column("_status").to_pylist()) == ["ok"] * 5 + ["rejected"]
    values = sorted(v for v in bronze.column("_value").to_pylist())
    assert values == sorted(v for _, v in EVENTS[:6])
    assert bronze.schema.field("_headers").type == pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def test_local_kafka_not_running_is_a_clear_error(spark: Any, tmp_path: Any) -> None:
    settings = Settings.from_env(tmp_path / "nothing")
    with pytest.raises(PipelineError, match="riverhouse kafka start"):
        ingest(spark, orders_spec("t"), settings)


def test_event_dates_partition_silver(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    spec = spec_for(topic)
    produce(kafka, topic, [order("a", "2026-02-01T23:59:59Z"), order("b", "2026-02-02T00:00:01Z")])
    ingest(spark, spec, settings)
    silver = open_table(TableLayout(settings.warehouse, spec.name).silver("orders"))
    assert silver.metadata().partition_columns == ["_event_date"]
    dates = {str(d) for d in silver.to_pyarrow_dataset().to_table().column("_event_date").to_pylist()}
    assert dates == {"2026-02-01", "2026-02-02"}


def test_unusable_clickhouse_dsn_fails_the_load_after_ingest_without_its_secret(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    from riverhouse.platform.sink.clickhouse import ClickHouseLoadError

    produce(kafka, topic, EVENTS[:5])
    spec = spec_for(topic, max_offsets=2)  # several batches: each would ask for a load
    bad = settings.with_(clickhouse_dsn="ftp://loader:s3cret-pw@ch.example:21/db")
    with pytest.raises(ClickHouseLoadError, match="unsupported ClickHouse DSN") as error:
        Pipeline(spec, bad, spark=spark, log=lambda m: None).run()
    assert "s3cret-pw" not in str(error.value)
    # The ingest is not undone: the next run with a good DSN only loads.
    assert silver_rows(settings, spec) == {
        ("o1", "2026-01-01 10:00:00", 1),
        ("o2", "2026-01-01 10:05:00", 2),
        ("o3", "2026-01-01 09:50:00", 3),
        ("o4", "2026-01-01 10:00:00", 4),
    }
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    assert summary["read"] == 0
    assert clickhouse_rows(settings, spec) == sorted(silver_rows(settings, spec))
