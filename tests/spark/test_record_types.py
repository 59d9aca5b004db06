"""Issue 19 item 9: a record that is not what the spec declares is quarantined with a reason.

`NaN` (not JSON, but Python's `json.dumps` writes it) in a double field used to be stored
as NaN, so ClickHouse's `sum()` became NaN; a JSON object in a string field was stored as
its JSON text. Both now go to quarantine by default, in Spark's parse (the one implementation
of every rule); a per-field opt-in accepts them.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest

from riverhouse.platform.ingest.parse import parse_records
from riverhouse.platform.spec import SourceSpec
from tests.conftest import orders_spec

pytestmark = pytest.mark.spark


def record(i: int, **overrides: Any) -> bytes:
    payload = {"order_id": f"o{i}", "user_id": "u1", "amount": 2, "price": 9.5, "created_at": "2026-01-02T03:04:05Z"}
    payload.update(overrides)
    # Python's default: NaN and Infinity written as bare literals, which JSON does not allow.
    return json.dumps(payload).encode()


VALUES: list[bytes | None] = [
    record(0),
    record(1, price=float("nan")),
    record(2, price=float("inf")),
    record(3, price=float("-inf")),
    b'{"order_id":"o4","user_id":"u1","amount":2,"price":1e999,"created_at":"2026-01-02T03:04:05Z"}',
    record(5, price="NaN"),
    record(6, user_id={"id": 7, "name": "x"}),
    record(7, user_id=[1, 2]),
    record(8, user_id='{"id": 7}'),  # a string holding JSON text is a string: kept
    record(9, user_id="[not json"),
    record(10, price=-0.0),
]


def source(**field_changes: dict[str, Any]) -> SourceSpec:
    src = orders_spec("orders").sink_source
    fields = [f.model_copy(update=field_changes.get(f.name, {})) for f in src.fields]
    return src.model_copy(update={"fields": fields})


def parsed(spark: Any, src: SourceSpec) -> dict[int, dict[str, Any]]:
    """Kafka rows with these values through `parse_records`, by offset."""
    schema = (
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
        "timestampType int, headers array<struct<key:string,value:binary>>"
    )
    kafka_ts = datetime(2026, 3, 1, 12, tzinfo=UTC)
    data = [(b"k", v, "orders", 0, i, kafka_ts, 0, None) for i, v in enumerate(VALUES)]
    return {r["_offset"]: r.asDict() for r in parse_records(spark.createDataFrame(data, schema), src).collect()}


def test_nan_infinity_and_json_objects_are_quarantined_with_a_reason(spark: Any) -> None:
    got = parsed(spark, source())
    for offset in (1, 2, 3, 4, 5):
        assert got[offset]["_status"] == "rejected", got[offset]
        assert got[offset]["_reason"].startswith("field 'price' is not a finite number"), got[offset]
        assert "allow_non_finite" in got[offset]["_reason"]
    for offset in (6, 7):
        assert got[offset]["_status"] == "rejected", got[offset]
        assert got[offset]["_reason"].startswith("field 'user_id' should be string, got a JSON object or array")
    for offset in (0, 8, 9, 10):
        assert (got[offset]["_status"], got[offset]["_reason"]) == ("ok", None)
    assert got[8]["user_id"] == '{"id": 7}' and got[9]["user_id"] == "[not json"


def test_the_per_field_opt_ins_keep_the_values(spark: Any) -> None:
    src = source(price={"allow_non_finite": True}, user_id={"allow_json_text": True})
    got = parsed(spark, src)
    assert all(r["_status"] == "ok" for r in got.values()), [r["_reason"] for r in got.values()]
    assert math.isnan(got[1]["price"]) and math.isinf(got[2]["price"]) and got[3]["price"] < 0
    assert json.loads(got[6]["user_id"]) == {"id": 7, "name": "x"}
    assert json.loads(got[7]["user_id"]) == [1, 2]
