"""Avro records decoded in Spark (`from_avro` on the executors): logical types, nested records, reasons.

A source with `avro_schema` and no registry reads plain Avro bodies; a registry source's records
carry the Confluent header, and the writer schemas are given as the batch body gets them.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import fastavro
import pytest

from riverhouse.platform.avro.produce import encode
from riverhouse.platform.ingest.avro import WriterSchemas
from riverhouse.platform.ingest.parse import parse_records
from riverhouse.platform.spec import parse_spec
from tests.spark.test_parse import kafka_rows

pytestmark = pytest.mark.spark

SCHEMA = {
    "type": "record",
    "name": "Payment",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["CARD", "CASH"]}},
        {"name": "score", "type": ["null", "double"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "card", "type": {"type": "record", "name": "Card", "fields": [{"name": "brand", "type": "string"}]}},
    ],
}
AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
RECORD = {
    "id": "p1",
    "at": AT,
    "day": date(2026, 1, 2),
    "price": Decimal("12.34"),
    "ref": "5b1c8e9e-5d7a-4a53-9d0f-3f3b8f7f2a10",
    "kind": "CASH",
    "score": float("nan"),
    "tags": ["a", "b"],
    "card": {"brand": "visa"},
}


def source(**extra: Any) -> Any:
    data = {
        "name": "pay",
        "sources": {"pay": {"topic": "pay", "format": "avro", "key": ["id"], "event_time": {"field": "at"}, **extra}},
        "sink": {"table": "pay", "order_by": ["id"]},
    }
    return parse_spec(data).sources["pay"]


def body(record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), record)
    return out.getvalue()


def test_plain_avro_bodies_read_every_logical_type_and_nested_record(spark: Any) -> None:
    src = source(avro_schema=SCHEMA)
    assert [(f.name, f.type) for f in src.fields] == [
        ("id", "string"), ("at", "timestamp"), ("day", "date"), ("price", "decimal(10,2)"), ("ref", "string"),
        ("kind", "string"), ("score", "double"), ("tags", "array<string>"), ("card_brand", "string"),
    ]  # fmt: skip
    ok = {**RECORD, "score": 0.5}
    rows = parse_records(kafka_rows(spark, [body(ok), body(RECORD), b"\x02"]), src).orderBy("_offset").collect()
    first = rows[0].asDict()
    assert first["_status"] == "ok", first["_reason"]
    assert first["_event_time"].replace(tzinfo=UTC) == AT  # microseconds kept
    assert (first["day"], first["price"]) == (date(2026, 1, 2), Decimal("12.34"))  # exact
    assert (first["ref"], first["kind"]) == (RECORD["ref"], "CASH")
    assert (first["tags"], first["card_brand"], first["score"]) == (["a", "b"], "visa", 0.5)
    # NaN is a value Avro can carry; the spec's rule for non-finite numbers still applies.
    assert rows[1]["_reason"].startswith("field 'score' is not a finite number")
    assert rows[2]["_reason"] == "the Avro body does not decode with its schema"


def test_avro_text_that_is_not_utf8_is_rejected_as_a_json_record_is(spark: Any) -> None:
    """Avro's strings are UTF-8 by its specification, and `from_avro` keeps whatever bytes come: a
    string field, or a string inside an array, that is not UTF-8 is quarantined with the field named."""
    src = source(avro_schema=SCHEMA)
    ok = body({**RECORD, "score": 0.5})
    assert ok.startswith(b"\x04p1") and ok.count(b"\x04\x02a\x02b\x00") == 1  # id "p1"; tags ["a", "b"]
    bad_id = b"\x04p\x80" + ok[3:]
    bad_tag = ok.replace(b"\x04\x02a\x02b\x00", b"\x04\x02\xff\x02b\x00")
    parsed = parse_records(kafka_rows(spark, [ok, bad_id, bad_tag]), src)
    rows = parsed.orderBy("_offset").select("_status", "_reason").collect()  # the text itself is not UTF-8
    assert [r["_reason"] for r in rows] == [
        None,
        "field 'id' is not valid UTF-8 text",
        "field 'tags' is not valid UTF-8 text",
    ]
    assert [r["_status"] for r in rows] == ["ok", "rejected", "rejected"]


def test_registry_records_are_decoded_with_their_writer_schema_by_id(spark: Any) -> None:
    older = {**SCHEMA, "fields": [f for f in SCHEMA["fields"] if f["name"] != "score"]}  # before `score` existed
    src = source(avro_schema=SCHEMA, schema_registry={"url": "http://registry.invalid:8081"})
    writers = WriterSchemas({7: json.dumps(older), 8: json.dumps(SCHEMA)}, True, "subject 'pay-value'")
    old_record = {k: v for k, v in RECORD.items() if k != "score"}
    values = [encode(older, old_record, 7), encode(SCHEMA, {**RECORD, "score": 1.5}, 8), body(RECORD)]
    rows = parse_records(kafka_rows(spark, values), src, writers).orderBy("_offset").collect()
    assert (rows[0]["_status"], rows[0]["score"], rows[0]["card_brand"]) == ("ok", None, "visa")  # the default
    assert (rows[1]["_status"], rows[1]["score"]) == ("ok", 1.5)
    assert rows[2]["_reason"].startswith("not in the Confluent wire format")  # a plain body, no header


def test_a_long_event_time_reads_epoch_milliseconds_and_refuses_seconds_unless_declared(spark: Any) -> None:
    """The same epoch rule as a JSON source (tests/spark/test_epoch_units.py), on a plain Avro long."""
    schema = {
        "type": "record",
        "name": "E",
        "fields": [{"name": "id", "type": "string"}, {"name": "ts", "type": "long"}],
    }

    def plain(record: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
        return out.getvalue()

    values = [plain({"id": "a", "ts": 1767323045678}), plain({"id": "b", "ts": 1767323045})]
    for fields, statuses in [
        (None, ["ok", "rejected"]),
        ({"id": "string", "ts": {"type": "long", "epoch_unit": "seconds"}}, ["rejected", "ok"]),
    ]:
        src = source(avro_schema=schema, event_time={"field": "ts"}, **({"fields": fields} if fields else {}))
        rows = parse_records(kafka_rows(spark, values), src).orderBy("_offset").collect()
        assert [r["_status"] for r in rows] == statuses, [r["_reason"] for r in rows]
        at = rows[statuses.index("ok")]["_event_time"].replace(tzinfo=UTC)
        assert at == datetime(2026, 1, 2, 3, 4, 5, 678000 if fields is None else 0, tzinfo=UTC)
    assert rows[0]["_reason"] == "event time field 'ts' is out of range for epoch seconds"
