"""Epoch numbers in time fields: milliseconds unless the field says otherwise, and never 1970 by mistake.

A producer that sends Unix seconds (`int(time.time())`) into a field read as milliseconds would
file every event under January 1970, without a word. With no `epoch_unit` declared, a number that
reads as 1970-1973 in milliseconds is quarantined with a reason that names the fix.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from riverhouse.platform.ingest.parse import parse_records
from riverhouse.platform.spec import parse_spec
from tests.conftest import orders_spec_data
from tests.spark.test_parse import KAFKA_TS, good, kafka_rows

pytestmark = pytest.mark.spark
# 2026-01-02T03:04:05Z, and the same instant in each unit.
SECONDS = 1767323045
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def parse_with(spark: Any, values: list[bytes], **field: Any) -> list[dict[str, Any]]:
    data = orders_spec_data("orders")
    data["sources"]["orders"]["fields"]["created_at"] = {"type": "timestamp", **field}
    src = parse_spec(data).sources["orders"]
    return [r.asDict() for r in parse_records(kafka_rows(spark, values), src).orderBy("_offset").collect()]


def test_seconds_in_a_field_without_a_unit_are_quarantined_not_read_as_1970(spark: Any) -> None:
    # Unix seconds as a number and as digits; a date written as digits, which is no epoch time at
    # all (read as milliseconds it was 1970-01-01 too); the edges of the refused window.
    values = [SECONDS, str(SECONDS), "20260102", 10**11 - 1, -(10**11) + 1, 0, -1]
    rows = parse_with(spark, [good(created_at=v) for v in values])
    assert [r["_status"] for r in rows] == ["rejected"] * len(values)
    assert rows[0]["_reason"] == (
        "field 'created_at' is 1767323045, which as epoch milliseconds is 1970-01-21T10:55:23Z: if it is "
        "epoch seconds, set epoch_unit: seconds on the field (epoch_unit: milliseconds keeps it)"
    )
    assert rows[2]["_reason"].startswith("field 'created_at' is 20260102, which as epoch milliseconds is 1970-01-01")
    assert rows[4]["_reason"].startswith("field 'created_at' is -99999999999, which as epoch milliseconds is 1966-")
    # No 1970 time is kept for them: they are filed under the Kafka record's date, like other unreadable times.
    assert {r["created_at"] for r in rows} == {None}
    assert {r["_event_date"] for r in rows} == {KAFKA_TS.date()}


def test_milliseconds_still_read_without_a_unit(spark: Any) -> None:
    # 10^11 ms is 1973-03-03 and -10^11 is 1966-10-31: beyond them a number reads as milliseconds, as before.
    values = [SECONDS * 1000 + 678, 10**11, -(10**11), -200_000_000_000]
    rows = parse_with(spark, [good(created_at=v) for v in values])
    assert [r["_status"] for r in rows] == ["ok"] * len(values)
    assert rows[0]["_event_time"] == AT.replace(microsecond=678000).replace(tzinfo=None)
    assert rows[1]["created_at"] == datetime(1973, 3, 3, 9, 46, 40)
    assert rows[2]["created_at"] == datetime(1966, 10, 31, 14, 13, 20)
    assert rows[3]["created_at"].year == 1963


@pytest.mark.parametrize(
    ("unit", "number"),
    [("seconds", SECONDS), ("milliseconds", SECONDS * 1000), ("microseconds", SECONDS * 1_000_000)],
)
def test_a_declared_unit_reads_the_same_instant(spark: Any, unit: str, number: int) -> None:
    rows = parse_with(spark, [good(created_at=number), good(created_at=str(number))], epoch_unit=unit)
    assert [r["_status"] for r in rows] == ["ok", "ok"], rows
    assert {r["_event_time"] for r in rows} == {AT.replace(tzinfo=None)}
    assert {str(r["_event_date"]) for r in rows} == {"2026-01-02"}


def test_a_declared_unit_reads_small_numbers_as_they_are_and_iso_text_as_before(spark: Any) -> None:
    rows = parse_with(
        spark, [good(created_at=86_400_000), good(created_at="2026-01-02T03:04:05Z")], epoch_unit="milliseconds"
    )
    assert [r["_status"] for r in rows] == ["ok", "ok"]
    assert rows[0]["created_at"] == datetime(1970, 1, 2)
    assert rows[1]["created_at"] == AT.replace(tzinfo=None)


def test_a_number_out_of_range_for_its_unit_is_not_valid_and_the_reason_names_the_unit(spark: Any) -> None:
    # 10^12 s is the year 33658, as 10^15 ms; the last second of 9999 is the last Python can show.
    rows = parse_with(spark, [good(created_at=10**12), good(created_at=253_402_300_799)], epoch_unit="seconds")
    assert [r["_status"] for r in rows] == ["rejected", "ok"]
    assert rows[1]["created_at"] == datetime(9999, 12, 31, 23, 59, 59)
    assert rows[0]["_reason"] == (
        "field 'created_at' is not a valid timestamp: 1000000000000 (expected an ISO 8601 date and time, "
        "its zone as Z, an offset or a region, or epoch seconds)"
    )
    [row] = parse_with(spark, [good(created_at=SECONDS * 1_000_000)])  # microseconds, no unit declared
    assert row["_reason"].endswith("or epoch milliseconds (epoch_unit for another unit))")


def long_event_time(
    spark: Any, values: list[int], fallback: str = "kafka_timestamp", **field: Any
) -> list[dict[str, Any]]:
    data = orders_spec_data("orders")
    data["sources"]["orders"]["fields"]["ts"] = {"type": "long", **field}
    data["sources"]["orders"]["event_time"] = {"field": "ts", "fallback": fallback}
    src = parse_spec(data).sources["orders"]
    records = [json.dumps({**json.loads(good()), "ts": v}).encode() for v in values]
    return [r.asDict() for r in parse_records(kafka_rows(spark, records), src).orderBy("_offset").collect()]


def test_a_long_event_time_follows_the_same_rule(spark: Any) -> None:
    rows = long_event_time(spark, [SECONDS * 1000, SECONDS])
    assert rows[0]["_status"] == "ok" and rows[0]["_event_time"] == AT.replace(tzinfo=None)
    assert rows[0]["ts"] == SECONDS * 1000  # the column keeps the number
    assert rows[1]["_status"] == "rejected"
    assert rows[1]["_reason"].startswith("field 'ts' is 1767323045, which as epoch milliseconds is 1970-01-21")
    assert rows[1]["_event_date"] == KAFKA_TS.date()  # not 1970-01-21
    [row] = long_event_time(spark, [SECONDS], epoch_unit="seconds")
    assert row["_status"] == "ok" and row["_event_time"] == AT.replace(tzinfo=None) and row["ts"] == SECONDS


def test_a_long_event_time_out_of_range_is_quarantined_with_its_reason(spark: Any) -> None:
    # The smallest long included: abs() of it overflows under ANSI and failed the whole batch.
    for fallback in ("kafka_timestamp", "quarantine"):
        rows = long_event_time(spark, [-(2**63), SECONDS * 1000], fallback=fallback, epoch_unit="seconds")
        assert [r["_status"] for r in rows] == ["rejected", "rejected"]
        assert {r["_reason"] for r in rows} == {"event time field 'ts' is out of range for epoch seconds"}
