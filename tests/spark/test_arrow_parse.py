"""The Arrow JSON parse in the source gives exactly the rows Spark's own parse gives.

Every record is parsed twice: once as the Kafka source hands it over (with the
`_parsed` column from `ArrowJsonParser`) and once without it (Spark's `from_json`
only). The outputs must be identical, row by row, for good records and for every
kind of bad one; and the blocks must really have taken the fast path when clean.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform.arrow_parse import ArrowJsonParser, supported
from riverhouse.platform.kafka_source import _arrow_schema
from riverhouse.platform.parse import parse_records
from tests.conftest import orders_spec

pytestmark = pytest.mark.spark
KAFKA_TS = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def good(i: int = 0, **overrides: Any) -> bytes:
    payload = {
        "order_id": f"o{i}",
        "user_id": "u1",
        "amount": 2,
        "price": 9.5,
        "created_at": "2026-01-02T03:04:05.678Z",
    }
    payload.update(overrides)
    return json.dumps(payload, separators=(",", ":")).encode()


EDGE_CASES: list[bytes | None] = [
    None,
    b"",
    b"null",
    b"plain text",
    b"[1, 2]",
    b'"just a string"',
    b"{}",
    b' {"order_id":"o-space"} ',
    b'\xef\xbb\xbf{"order_id":"o-bom"}',
    b'{"order_id":"o-bad-utf8-\xff"}',
    b'{"order_id":"o-two"}{"order_id":"o-three"}',
    b'{"order_id":"o-nl",\n"amount":1}',
    b'{"order_id":"o-cr",\r"amount":1}',
    b'{"order_id":"o-trailing"} x',
    b'{"order_id":"o-trailing-comma",}',
    b"{'order_id':'single-quotes'}",
    b'{"order_id":1234}',
    b'{"order_id":true}',
    b'{"order_id":{"nested":1}}',
    b'{"order_id":"o-dup","order_id":"o-dup2"}',
    b'{"ORDER_ID":"o-case","created_at":"2026-01-02T03:04:05Z"}',
    good(1, amount=1.5),
    good(2, amount=1e2),
    good(3, amount=3_000_000_000),
    good(4, amount="7"),
    good(5, amount=-0),
    good(6, price=5),
    good(7, price="9.5"),
    good(8, price=12345678901234567890123),
    b'{"order_id":"o9","user_id":"u1","amount":2,"price":1e400,"created_at":"2026-01-02T03:04:05Z"}',
    b'{"order_id":"o10","user_id":"u1","amount":2,"price":NaN,"created_at":"2026-01-02T03:04:05Z"}',
    b'{"order_id":"o11","user_id":"u1","amount":2,"price":0.1e-400,"created_at":"2026-01-02T03:04:05Z"}',
    good(12, price=0.1 + 0.2),
    good(13, created_at=1767323045678),
    good(14, created_at="not a time"),
    good(15, created_at=None),
    good(16, order_id=None),
    good(17, user_id="\u00e9\u4e2d\U0001f600"),
    b'{"order_id":"o18\\u00e9\\ud83d\\ude00","user_id":"u\\/1","amount":2,"price":1,"created_at":"2026-01-02"}',
    b'{"order_id":"o19\\ud800","user_id":"u1","amount":2,"price":1,"created_at":"2026-01-02T03:04:05Z"}',
    b'{"order_id":"o20\there","user_id":"u1","amount":2,"price":1,"created_at":"2026-01-02T03:04:05Z"}',
    good(21, extra={"deep": [1, {"x": None}]}, more="ignored"),
    b'{"order_id":"o22","amount":01}',
    '{"order_id":"o23-é中😀","user_id":"u1","amount":2,"price":1,"created_at":"2026-01-02"}'.encode(),
    b"x" * 200 + b"}",
    b"{" + b" " * 300 + b'"order_id":"o-big"}',
]


def kafka_table(
    values: list[bytes | None], parser: ArrowJsonParser | None, stamps: list[Any] | None = None
) -> pa.Table:
    """The Kafka source's Arrow rows for these values (with `_parsed` when a parser is given)."""
    n = len(values)
    columns: dict[str, Any] = {
        "key": [b"k"] * n,
        "value": values,
        "topic": ["orders"] * n,
        "partition": [0] * n,
        "offset": list(range(n)),
        "timestamp": stamps or [KAFKA_TS] * n,
        "timestampType": [0] * n,
        "headers": [None] * n,
    }
    schema = _arrow_schema(None)
    arrays = [pa.array(columns[name], schema.field(name).type) for name in schema.names]
    table = pa.Table.from_arrays(arrays, schema=schema)
    if parser is not None:
        table = table.append_column("_parsed", parser.parse(values))
    return table


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """NaN is not equal to itself; both parsers giving NaN is agreement."""
    return {k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def parse_both(
    spark: Any, values: list[bytes | None], block_rows: int, max_message_bytes: int = 250
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], ArrowJsonParser]:
    src = orders_spec("orders").sink_source.model_copy(update={"max_message_bytes": max_message_bytes})
    fields = [(f.name, f.type) for f in src.fields]
    assert supported(fields)
    parser = ArrowJsonParser(fields, src.max_message_bytes, block_rows=block_rows)
    out = []
    for p in (parser, None):
        df = spark.createDataFrame(kafka_table(values, p))
        out.append([comparable(r.asDict()) for r in parse_records(df, src).orderBy("_offset").collect()])
    return out[0], out[1], parser


def test_every_edge_case_parses_as_spark_does(spark: Any) -> None:
    # One record per block: each edge case decides on its own whether it takes the fast path.
    fast, jvm, parser = parse_both(spark, EDGE_CASES, block_rows=1)
    assert len(fast) == len(jvm) == len(EDGE_CASES)
    for value, a, b in zip(EDGE_CASES, fast, jvm, strict=True):
        assert a == b, value
    # The clean ones really were parsed by Arrow, and the rest fell back.
    assert parser.fast_rows >= 10 and parser.fallback_rows >= 20
    statuses = {row["_status"] for row in jvm}
    assert statuses == {"ok", "rejected"}


def test_a_bad_record_sends_only_its_block_to_the_jvm(spark: Any) -> None:
    values: list[bytes | None] = [good(i) for i in range(40)]
    values[25] = b'{"order_id": "broken", "amount": '
    fast, jvm, parser = parse_both(spark, values, block_rows=10)
    assert fast == jvm
    assert parser.fallback_rows == 10 and parser.fast_rows == 30
    assert [r["_status"] for r in fast].count("rejected") == 1
    assert fast[25]["_reason"].startswith("not a JSON object")


def test_clean_block_takes_the_fast_path_with_typed_values() -> None:
    fields = [
        ("order_id", "string"),
        ("amount", "int"),
        ("price", "double"),
        ("ok", "boolean"),
        ("created_at", "timestamp"),
    ]
    parser = ArrowJsonParser(fields, 1000)
    parsed = parser.parse(
        [
            b'{"order_id":"a","amount":3,"price":1.25,"ok":true,"created_at":"2026-01-01"}',
            b'{"amount":null,"other":[1]}',
        ]
    )
    assert parser.fast_rows == 2 and parser.fallback_rows == 0
    assert parsed.to_pylist() == [
        {"order_id": "a", "amount": 3, "price": 1.25, "ok": True, "created_at": "2026-01-01", "_corrupt": None},
        {"order_id": None, "amount": None, "price": None, "ok": None, "created_at": None, "_corrupt": None},
    ]


def test_float_fields_keep_the_jvm_parse() -> None:
    assert not supported([("order_id", "string"), ("weight", "float")])
