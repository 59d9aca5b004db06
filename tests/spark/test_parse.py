"""Parsing and validation in Spark: every bad record gets a status and a precise reason."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any

import pytest

from riverhouse.platform.ingest.parse import event_date_or, parse_records
from tests.conftest import orders_spec

pytestmark = pytest.mark.spark
KAFKA_TS = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def kafka_rows(spark: Any, values: list[bytes | None]) -> Any:
    schema = (
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
        "timestampType int, headers array<struct<key:string,value:binary>>"
    )
    data = [(b"k", v, "orders", 0, i, KAFKA_TS, 0, None) for i, v in enumerate(values)]
    return spark.createDataFrame(data, schema)


def parse(spark: Any, values: list[bytes | None], **spec_changes: Any) -> list[dict[str, Any]]:
    spec = orders_spec("orders")
    src = spec.sink_source
    if spec_changes:
        src = src.model_copy(update=spec_changes)
    return [r.asDict() for r in parse_records(kafka_rows(spark, values), src).orderBy("_offset").collect()]


def good(**overrides: Any) -> bytes:
    payload = {"order_id": "o1", "user_id": "u1", "amount": 2, "price": 9.5, "created_at": "2026-01-02T03:04:05.678Z"}
    payload.update(overrides)
    return json.dumps(payload).encode()


def test_valid_record_is_typed(spark: Any) -> None:
    [row] = parse(spark, [good()])
    assert row["_status"] == "ok" and row["_reason"] is None
    assert row["order_id"] == "o1" and row["amount"] == 2 and row["price"] == 9.5
    assert row["_event_time"].replace(tzinfo=None) == datetime(2026, 1, 2, 3, 4, 5, 678000)
    assert str(row["_event_date"]) == "2026-01-02"


def test_epoch_millis_event_time_and_kafka_fallback(spark: Any) -> None:
    rows = parse(spark, [good(created_at=1767323045678), good(created_at=None)])
    assert rows[0]["_event_time"].replace(tzinfo=None) == datetime(2026, 1, 2, 3, 4, 5, 678000)
    # Missing event time falls back to the Kafka record timestamp.
    assert rows[1]["_status"] == "ok"
    assert rows[1]["_event_time"].replace(tzinfo=None) == KAFKA_TS.replace(tzinfo=None)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'{"order_id": "o1", "amount": ', "not a JSON object"),
        (b"plain text", "not a JSON object: plain text"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xef\xbb\xbf" + good(), "not a JSON object: the value starts with a byte order mark (U+FEFF)"),
        (good(amount="lots"), "field 'amount' should be int, got lots"),
        (good(price=True), "field 'price' should be double, got true"),
        (good(created_at="yesterday"), "field 'created_at' is not a valid timestamp: yesterday"),
        (json.dumps({"user_id": "u1", "amount": 1}).encode(), "missing required field 'order_id'"),
        (good(order_id=None), "missing required field 'order_id'"),
        (b'{"order_id": "\xff\xfe", "amount": 1}', "value is not valid UTF-8"),
        (None, "empty message (null value)"),
    ],
)
def test_bad_records_are_rejected_with_reason(spark: Any, value: bytes | None, reason: str) -> None:
    [row] = parse(spark, [value])
    assert row["_status"] == "rejected"
    assert row["_reason"].startswith(reason), row["_reason"]
    assert row["_event_date"] is not None  # rejected rows stay partitioned (by Kafka time)


def test_a_decimal_field_reads_exact_values_and_names_what_does_not_fit(spark: Any) -> None:
    from decimal import Decimal

    from riverhouse.platform.spec import parse_spec
    from tests.conftest import orders_spec_data

    data = orders_spec_data("orders")
    data["sources"]["orders"]["fields"]["price"] = "decimal(10,2)"
    src = parse_spec(data).sources["orders"]
    values = [good(price=12.34), good(price="0.10"), good(price=123456789.5), good(price="lots")]
    rows = [r.asDict() for r in parse_records(kafka_rows(spark, values), src).orderBy("_offset").collect()]
    assert [r["price"] for r in rows[:2]] == [Decimal("12.34"), Decimal("0.10")]  # a number or its text
    # 9 digits before the point do not fit (Spark's JSON path prints the number as 1.234567895E8).
    assert rows[2]["_reason"].startswith("field 'price' should be decimal(10,2), got 1.23456789")
    assert rows[3]["_reason"] == "field 'price' should be decimal(10,2), got lots"


def test_a_decimal_string_with_a_comma_is_quarantined_not_read_without_it(spark: Any) -> None:
    """from_json's decimal parser drops commas: "12,5" (a European 12.5) read as 125 before."""
    from decimal import Decimal

    from riverhouse.platform.spec import parse_spec
    from tests.conftest import orders_spec_data

    data = orders_spec_data("orders")
    data["sources"]["orders"]["fields"]["price"] = "decimal(10,2)"
    src = parse_spec(data).sources["orders"]
    values = [
        good(price="12,5"),
        good(price="1,234"),
        good(price="1,2,3.5"),
        good(price="12.5", user_id="Smith, J."),  # commas elsewhere in the record are no concern
        good(price=1234.5),
    ]
    rows = [r.asDict() for r in parse_records(kafka_rows(spark, values), src).orderBy("_offset").collect()]
    for row, text in zip(rows[:3], ["12,5", "1,234", "1,2,3.5"], strict=True):
        assert row["_status"] == "rejected", row
        assert row["_reason"].startswith(f"field 'price' is not a valid decimal(10,2): {text} "), row["_reason"]
    assert [(r["_status"], r["price"], r["user_id"]) for r in rows[3:]] == [
        ("ok", Decimal("12.50"), "Smith, J."),
        ("ok", Decimal("1234.50"), "u1"),
    ]


@pytest.mark.parametrize(
    "value",
    [
        "03:04:05",  # no date: Spark gave it the day the batch ran, so a replay read another day
        "12:00:00Z",
        "T12:00:00Z",
        "2026-06-15T03:04:05 BST",  # Java's short IDs: Bangladesh, not British Summer Time
        "2026-06-15T03:04:05 CST",  # America/Chicago, daylight time applied in June
        "2026-06-15T03:04:05 IST",  # India, not Ireland or Israel
        "2026-06-15T03:04:05 BST \t",  # Spark trims the padding, then reads the abbreviation
    ],
)
def test_a_timestamp_without_its_date_or_with_a_zone_abbreviation_is_quarantined(spark: Any, value: str) -> None:
    [row] = parse(spark, [good(created_at=value)])
    assert row["_status"] == "rejected", row
    assert row["_reason"].startswith(f"field 'created_at' is not a valid timestamp: {value} (expected an ISO 8601")


def test_iso_timestamps_with_a_zone_offset_or_region_still_read(spark: Any) -> None:
    values = [
        "2026-06-15T03:04:05Z",
        "2026-06-15T03:04:05 UTC",
        "2026-06-15T03:04:05 GMT",
        "2026-06-15T03:04:05+01:00",
        "2026-06-15 03:04:05",  # no zone: UTC
        "2026-06-15T03:04:05 Europe/London",  # British Summer Time by region: +01:00 in June
        " 2026-06-15T03:04:05Z\n",  # padded (Spark trims it)
        "2026-06-15T03:04:05 UTC ",
    ]
    rows = parse(spark, [good(created_at=v) for v in values])
    assert [r["_status"] for r in rows] == ["ok"] * len(values), [r["_reason"] for r in rows]
    utc = [r["_event_time"].replace(tzinfo=None) for r in rows]
    at, hour_earlier = datetime(2026, 6, 15, 3, 4, 5), datetime(2026, 6, 15, 2, 4, 5)
    assert utc == [at, at, at, hour_earlier, at, hour_earlier, at, at]


def test_a_date_field_reads_the_date_alone_not_a_year_or_a_timestamp(spark: Any) -> None:
    from riverhouse.platform.spec import parse_spec
    from tests.conftest import orders_spec_data

    data = orders_spec_data("orders")
    data["sources"]["orders"]["fields"]["day"] = "date"
    src = parse_spec(data).sources["orders"]
    refused = [20454, "20454", "2026", "2026-01", "2026-01-02T23:30:00-05:00", "2026-01-02 junk", "2026-02-30"]
    values = [good(day=v) for v in [*refused, "2026-01-02", " 2026-01-02\n"]]
    rows = [r.asDict() for r in parse_records(kafka_rows(spark, values), src).orderBy("_offset").collect()]
    for row, value in zip(rows, refused, strict=False):
        # 20454 (Debezium's days since 1970) was the year 20454, "2026" the 1st of January, and a
        # timestamp's date was taken before its offset moved it to another day in UTC.
        assert row["_status"] == "rejected", (value, row["day"])
        assert row["_reason"] == f"field 'day' is not a valid date: {value} (expected YYYY-MM-DD)"
    assert [(r["_status"], str(r["day"])) for r in rows[-2:]] == [("ok", "2026-01-02")] * 2  # padding is trimmed


def test_an_unpaired_surrogate_is_quarantined_with_a_reason_that_names_it(spark: Any) -> None:
    [row] = parse(spark, [good(user_id="\ud800")])  # json.dumps writes the escape: "\\ud800"
    assert row["_status"] == "rejected"
    assert "unpaired surrogate" in row["_reason"], row["_reason"]


def test_a_number_in_a_string_field_keeps_its_exact_value(spark: Any) -> None:
    """from_json wrote such numbers as Java doubles: 1.00000005E7, and 17 significant digits at most."""
    numbers = [b"10000000.5", b"123456789.12", b"0.0001", b"12345678901234567.5", b"7", b"2.5"]
    numbers += [b"0.1000000000000000055511151231257827", b"1.0", b"100.0", b"-0.0"]
    values = [good(user_id="PLACEHOLDER").replace(b'"PLACEHOLDER"', n) for n in numbers]
    values.append(good(user_id="1.2345678912E8"))  # a JSON string that looks like a double stays as sent
    rows = parse(spark, values)
    assert [r["_status"] for r in rows] == ["ok"] * len(values), [r["_reason"] for r in rows]
    assert [r["user_id"] for r in rows] == [
        "10000000.5",
        "123456789.12",
        "0.0001",
        "12345678901234567.5",
        "7",
        "2.5",
        "0.1000000000000000055511151231257827",  # the double read 0.1
        "1.0",  # the double kept these values: their text stays as it was read before
        "100.0",
        "-0.0",
        "1.2345678912E8",
    ]


def test_oversized_message_is_rejected_without_parsing(spark: Any) -> None:
    big = good(user_id="x" * 5000)
    [row] = parse(spark, [big], max_message_bytes=1000)
    assert row["_status"] == "rejected"
    assert row["_reason"] == f"message of {len(big)} bytes is larger than max_message_bytes=1000"


def test_quarantine_fallback_policy(spark: Any) -> None:
    spec = orders_spec("orders")
    src = spec.sink_source
    src = src.model_copy(update={"event_time": src.event_time.model_copy(update={"fallback": "quarantine"})})
    rows = [r.asDict() for r in parse_records(kafka_rows(spark, [good(created_at=None)]), src).collect()]
    assert rows[0]["_reason"] == "missing event time field 'created_at'"


def test_record_without_any_time_gets_the_batch_date(spark: Any) -> None:
    schema = (
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
        "timestampType int, headers array<struct<key:string,value:binary>>"
    )
    rows = spark.createDataFrame(
        [(b"k", b"not json", "orders", 0, 0, None, -1, None), (b"k", b"[1]", "orders", 0, 1, KAFKA_TS, 0, None)], schema
    )
    parsed = parse_records(rows, orders_spec("orders").sink_source).orderBy("_offset")
    assert [r["_event_date"] for r in parsed.collect()] == [None, KAFKA_TS.date()]
    filled = parsed.withColumn("_event_date", event_date_or(date(2030, 5, 6))).collect()
    assert [r["_event_date"] for r in filled] == [date(2030, 5, 6), KAFKA_TS.date()]
    assert [r["_reason"] for r in filled] == [r["_reason"] for r in parsed.collect()]


# ----------------------------------------------------------------- issue 27, item 6: duplicate keys, single quotes
NOTE = {"order_id": "o1", "user_id": "u1", "amount": 2, "price": 9.5, "created_at": "2026-01-02T03:04:05Z"}


def with_note(**changes: Any) -> Any:
    """The orders source with a string field `note` (a JSON object in it is quarantined unless allowed)."""
    src = orders_spec("orders").sink_source
    fields = [*src.fields, src.fields[0].model_copy(update={"name": "note", "required": False, **changes})]
    return src.model_copy(update={"fields": fields})


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        # The field itself twice: from_json keeps the last value (an object), get_json_object the first.
        (b'{"order_id":"o1","amount":2,"note":"plain","note":{"a":1},"created_at":"2026-01-02T03:04:05Z"}',
         "key 'note' appears twice"),
        (b'{"order_id":"o1","amount":2,"amount":3,"created_at":"2026-01-02T03:04:05Z"}', "key 'amount' appears twice"),
        # A key twice anywhere: the object in `note` escaped the JSON-in-string check (its strict parse failed).
        (b'{"order_id":"o1","amount":2,"note":{"a":1,"a":2},"created_at":"2026-01-02T03:04:05Z"}',
         "not strict JSON: a key appears twice in a nested object"),
        (b'{"order_id":"o1","amount":2,"extra":{"b":{"c":1,"c":1}},"created_at":"2026-01-02T03:04:05Z"}',
         "not strict JSON: a key appears twice in a nested object"),
        # Single-quoted JSON is not JSON (Spark's JSON reader accepts it by default).
        (b"{'order_id':'o1','amount':2,'note':{'a':1},'created_at':'2026-01-02T03:04:05Z'}", "not a JSON object"),
        (b'{"order_id":"o1","amount":2,"note":\'{"a":1}\',"created_at":"2026-01-02T03:04:05Z"}', "not a JSON object"),
    ],
)  # fmt: skip
def test_duplicate_keys_and_single_quotes_are_quarantined(spark: Any, value: bytes, reason: str) -> None:
    rows = parse_records(kafka_rows(spark, [value]), with_note()).collect()
    assert rows[0]["_status"] == "rejected"
    assert rows[0]["_reason"].startswith(reason), rows[0]["_reason"]


def test_strict_json_rule_keeps_what_was_valid(spark: Any) -> None:
    """Records the duplicate-key rule must not touch: NaN where a field allows it, an object that
    is allowed as JSON text, and a string that merely looks like JSON."""
    src = with_note(allow_json_text=True)
    src = src.model_copy(
        update={
            "fields": [f.model_copy(update={"allow_non_finite": True}) if f.name == "price" else f for f in src.fields]
        }
    )
    values = [
        json.dumps({**NOTE, "note": {"a": 1, "b": [1, {"c": 2}]}}).encode(),
        json.dumps({**NOTE, "price": float("nan"), "note": '{"a": 1, "a": 2}'}).encode(),  # NaN: Python writes it
        json.dumps({**NOTE, "note": "it's {fine}"}).encode(),
    ]
    rows = [r.asDict() for r in parse_records(kafka_rows(spark, values), src).orderBy("_offset").collect()]
    assert [r["_status"] for r in rows] == ["ok", "ok", "ok"], [r["_reason"] for r in rows]
    assert json.loads(rows[0]["note"]) == {"a": 1, "b": [1, {"c": 2}]}
    assert rows[1]["note"] == '{"a": 1, "a": 2}'  # a string's content is not JSON to check


# ------------------------------------------------------- text after the record: two records in one message
ONE = json.dumps(NOTE)
TWO = json.dumps({**NOTE, "order_id": "o2"})


@pytest.mark.parametrize(
    "value",
    [
        f"{ONE}{TWO}",  # two records written into one message
        f"{ONE}\n{TWO}\n",  # newline-delimited JSON in one message
        f"{ONE}, {TWO}",
        f"{ONE} trailing words",
        f"{ONE}]",
        f'{ONE}, "x"]',  # text that would close a wrapping array itself
        f"{ONE}}}",
    ],
)
def test_text_after_the_record_is_quarantined_not_dropped(spark: Any, value: str) -> None:
    """`from_json` (and `parse_json`) read the first JSON value of a message and ignore the rest: the
    second of two records in one message was lost without a word. The whole message must be one record."""
    rows = parse_records(kafka_rows(spark, [value.encode()]), with_note()).collect()
    assert rows[0]["_status"] == "rejected", value
    assert rows[0]["_reason"].startswith("not strict JSON"), rows[0]["_reason"]


def test_whitespace_around_the_record_and_json_in_strings_still_read(spark: Any) -> None:
    """What the end-of-record check must not touch: whitespace around the record, and the checks that
    read the strict parse (a JSON object in a string field, allowed or not)."""
    values = [
        f"  {ONE}\n".encode(),
        f"\t{ONE}\r\n\n".encode(),
        json.dumps({**NOTE, "note": {"a": 1}}).encode(),
        json.dumps({**NOTE, "note": "[not, json] but text"}).encode(),
    ]
    rows = [r.asDict() for r in parse_records(kafka_rows(spark, values), with_note()).orderBy("_offset").collect()]
    assert [r["_status"] for r in rows] == ["ok", "ok", "rejected", "ok"], [r["_reason"] for r in rows]
    assert [r["order_id"] for r in rows[:2]] == ["o1", "o1"]
    assert rows[2]["_reason"].startswith("field 'note' should be string, got a JSON object or array"), rows[2][
        "_reason"
    ]
    assert rows[3]["note"] == "[not, json] but text"
