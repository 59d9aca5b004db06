"""Local mode's fast path gives exactly the rows Spark's parse gives, and takes the clean ones.

Each set of records goes through both paths. The reference path is Spark's `parse_records`
alone. The fast path is what the source and the driver do in local mode: `FastPath.split`
finishes some records into a spool file, Spark parses the rest plus one marker row, and
`take_spooled` puts them back together. The two outputs must be identical, row by row and
type by type, for good records and for every kind of bad one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform.arrow_parse import ArrowJsonParser
from riverhouse.platform.arrow_validate import (
    SPOOL_COLUMN,
    FastPath,
    SpoolWriter,
    rules_for,
    take_spooled,
)
from riverhouse.platform.kafka_source import KafkaInputPartition, _arrow_schema, _marker
from riverhouse.platform.parse import parse_records
from riverhouse.platform.spec import SourceSpec
from tests.conftest import orders_spec
from tests.spark.test_arrow_parse import EDGE_CASES, KAFKA_TS, good, kafka_table

pytestmark = pytest.mark.spark

TIMESTAMP_FORMS: list[Any] = [
    "2026-01-02T03:04:05Z",
    "2026-01-02T03:04:05.1Z",
    "2026-01-02T03:04:05.123456Z",
    "2026-01-02T03:04:05.1234567Z",
    "2026-01-02T03:04:05+05:30",
    "2026-01-02T03:04:05-01:00",
    "2026-01-02T03:04:05+18:00",
    "2026-01-02T03:04:05+19:00",
    "2026-01-02T03:04:05+0530",
    "2026-01-02 03:04:05Z",
    "2026-01-02T03:04:05",
    "2026-01-02 03:04:05",
    "2026-01-02T03:04:05.5",
    "2026-01-02 03:04:05.123456",
    "2026-01-02T03:04:05.1234567",
    "0001-01-01T00:00:00",
    "9999-12-31T23:59:59.999999",
    "1582-10-10T00:00:00",
    "0000-01-01T00:00:00",
    "0000-01-01T00:00:00Z",
    "2026-01-02",
    "2026-01-02T03:04Z",
    "1767323045678",
    "-1000",
    "0",
    "007",
    "123456789012345",
    "9999999999999999",
    "253402300800000",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z",
    "1582-10-10T00:00:00Z",
    "1900-01-01T00:00:00+17:59",
    " 2026-01-02T03:04:05Z",
    "2026-01-02T03:04:05Z ",
    "2026-01-02T03:04:05z",
    "2026-01-02T03:04:05UTC",
    "\uff12\uff10\uff12\uff16-01-02T03:04:05Z",
    "",
]


def comparable(rows: pa.Table) -> list[dict[str, Any]]:
    """Rows as dicts; timestamps and dates as their integers (Spark holds years past 9999, Python does not)."""
    for index, field in enumerate(rows.schema):
        if pa.types.is_timestamp(field.type) or pa.types.is_date32(field.type):
            integer = pa.int64() if pa.types.is_timestamp(field.type) else pa.int32()
            rows = rows.set_column(index, field.name, rows.column(index).cast(integer))
    out = []
    for row in rows.sort_by("_offset").to_pylist():
        out.append({k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
    return out


def both_paths(
    spark: Any,
    src: SourceSpec,
    values: list[bytes | None],
    tmp_path: Path,
    stamps: list[Any] | None = None,
    block_rows: int = 7,
) -> tuple[pa.Table, pa.Table, FastPath]:
    """(Spark's parse alone, the fast path put back together, the fast path's counters)."""
    fields = [(f.name, f.type) for f in src.fields]
    reference = parse_records(spark.createDataFrame(kafka_table(values, None, stamps)), src).toArrow()

    rules = rules_for(src)
    assert rules is not None
    fast = FastPath(rules)
    parser = ArrowJsonParser(fields, src.max_message_bytes, block_rows=block_rows)
    batch = kafka_table(values, parser, stamps).to_batches()[0]
    finished, rest = fast.split(batch)
    spool = SpoolWriter(str(tmp_path), fast.schema)
    if finished is not None:
        spool.write(finished)
    schema = _arrow_schema(fields, spool=True)
    pieces = [rest.append_column(pa.field(SPOOL_COLUMN, pa.string()), pa.nulls(rest.num_rows, pa.string()))]
    path = spool.close()
    if path is not None:
        pieces.append(_marker(schema, KafkaInputPartition("orders", 0, 0, len(values)), path))
    to_spark = pa.Table.from_batches([p for p in pieces if p.num_rows], schema=schema)
    rows, spooled = take_spooled(parse_records(spark.createDataFrame(to_spark), src).toArrow())
    assert spooled.rows == fast.fast_rows and len(spooled.paths) == (1 if path else 0)
    return reference, rows, fast


def assert_same(reference: pa.Table, rows: pa.Table) -> None:
    assert rows.schema == reference.schema
    assert rows.num_rows == reference.num_rows
    for a, b in zip(comparable(rows), comparable(reference), strict=True):
        assert a == b


def test_every_edge_case_gives_the_rows_spark_gives(spark: Any, tmp_path: Path) -> None:
    src = orders_spec("orders").sink_source.model_copy(update={"max_message_bytes": 250})
    values = EDGE_CASES + [good(100 + i, created_at=form) for i, form in enumerate(TIMESTAMP_FORMS)]
    # One record per Arrow parse block: each record decides on its own.
    reference, rows, fast = both_paths(spark, src, values, tmp_path, block_rows=1)
    assert_same(reference, rows)
    statuses = [r["_status"] for r in comparable(reference)]
    # The clean edge cases and the timestamp forms the fast path knows went fast (33 records
    # here, 8 of them zone-less: 26 before zone-less forms had a fast path; the NaN price,
    # once stored as NaN, is now Spark's to quarantine); every rejected record and the good
    # records in other forms (7 decimals, no seconds...) went to Spark.
    assert fast.fast_rows >= 33
    assert fast.jvm_rows >= statuses.count("rejected") and statuses.count("ok") > fast.fast_rows


def test_one_value_arrow_cannot_convert_sends_that_fields_values_to_spark(spark: Any, tmp_path: Path) -> None:
    src = orders_spec("orders").sink_source
    values = [good(i) for i in range(10)] + [
        good(10, created_at="2026-13-02T03:04:05Z"),
        good(11, created_at="2026-02-30T00:00:00Z"),
    ]
    reference, rows, fast = both_paths(spark, src, values, tmp_path)
    assert_same(reference, rows)
    assert [r["_status"] for r in comparable(rows)][-2:] == ["rejected", "rejected"]
    assert (fast.fast_rows, fast.jvm_rows) == (0, 12)  # that batch's ISO timestamps all went to Spark


@pytest.mark.parametrize("bad", ["2026-02-30T00:00:00", "2026-01-02T24:00:00", "2026-01-02T03:04:60"])
def test_one_zone_less_value_arrow_cannot_convert_sends_the_zone_less_ones_to_spark(
    spark: Any, tmp_path: Path, bad: str
) -> None:
    src = orders_spec("orders").sink_source
    zoned = [good(i) for i in range(5)]
    local = [good(5 + i, created_at=f"2026-01-02T03:04:0{i}") for i in range(5)]
    reference, rows, fast = both_paths(spark, src, [*zoned, *local, good(10, created_at=bad)], tmp_path)
    assert_same(reference, rows)
    # The zoned ones stay fast; every zone-less one goes to Spark, which names the bad one.
    assert (fast.fast_rows, fast.jvm_rows) == (5, 6)


def test_event_time_rules_dates_and_kafka_time(spark: Any, tmp_path: Path) -> None:
    """Epoch-millisecond event times, date fields, quarantine vs Kafka-time fallback, no Kafka time."""
    base = {"topic": "t", "key": ["id"]}
    fields = {"id": "string", "ts": "long", "day": "date", "flag": "boolean", "n": "long"}
    quarantine = SourceSpec.model_validate(
        {**base, "fields": fields, "event_time": {"field": "ts", "fallback": "quarantine"}}
    )
    fallback = SourceSpec.model_validate({**base, "fields": fields, "event_time": {"field": "ts"}})
    kafka_time = SourceSpec.model_validate({**base, "fields": fields})

    def rec(**kw: Any) -> bytes:
        return json.dumps({"id": "a", **kw}).encode()

    values: list[bytes | None] = [
        rec(ts=1767323045678, day="2026-01-02", flag=True, n=5),
        rec(ts=-5, day="1970-01-01"),
        rec(day="2026-01-02"),  # no event time
        rec(ts=10**15),  # out of range for epoch milliseconds
        rec(ts=999_999_999_999_999),
        rec(ts=253402300799999),
        rec(ts=1, day="2026-1-2"),  # a date form Spark reads and the fast path leaves
        rec(ts=1, day="2026-01-02T10:00"),
        rec(ts=1, day=""),
        rec(ts=None, flag=None),
        json.dumps({"ts": 1}).encode(),  # missing key
    ]
    stamps = [KAFKA_TS] * (len(values) - 3) + [None, None, None]
    for src in (quarantine, fallback, kafka_time):
        reference, rows, fast = both_paths(spark, src, values, tmp_path, stamps)
        assert_same(reference, rows)
        assert fast.fast_rows >= 2
    # A date Arrow cannot convert (Feb 30) sends the batch's dates to Spark, which names it.
    reference, rows, _ = both_paths(
        spark, fallback, [rec(ts=1, day="2026-02-30"), rec(ts=2, day="2026-01-01")], tmp_path
    )
    assert_same(reference, rows)
    assert comparable(rows)[0]["_reason"].startswith("field 'day' is not a valid date")


def test_float_fields_have_no_fast_path() -> None:
    src = SourceSpec.model_validate({"topic": "t", "key": ["id"], "fields": {"id": "string", "w": "float"}})
    assert rules_for(src) is None
