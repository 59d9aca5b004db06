"""Issue 19 item 9: a record that is not what the spec declares is quarantined with a reason.

`NaN` (not JSON, but Python's `json.dumps` writes it) in a double field used to be stored
as NaN, so ClickHouse's `sum()` became NaN; a JSON object in a string field was stored as
its JSON text. Both now go to quarantine by default, in Spark's parse and in local mode's
Arrow fast path alike (the parity check below); a per-field opt-in accepts them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.parse import parse_records
from riverhouse.platform.spec import SourceSpec
from tests.conftest import orders_spec
from tests.spark.test_arrow_parse import kafka_table
from tests.spark.test_arrow_validate import assert_same, both_paths, comparable

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


def by_order(rows: Any) -> dict[str, dict[str, Any]]:
    return {r["order_id"] or f"#{r['_offset']}": r for r in comparable(rows)}


def test_nan_infinity_and_json_objects_are_quarantined_with_a_reason(spark: Any) -> None:
    rows = parse_records(spark.createDataFrame(kafka_table(VALUES, None)), source()).toArrow()
    got = {r["_offset"]: r for r in comparable(rows)}
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
    rows = parse_records(spark.createDataFrame(kafka_table(VALUES, None)), src).toArrow()
    got = {r["_offset"]: r for r in comparable(rows)}
    assert all(r["_status"] == "ok" for r in got.values()), [r["_reason"] for r in got.values()]
    assert got[1]["price"] == "NaN" and math.isinf(got[2]["price"]) and got[3]["price"] < 0
    assert json.loads(got[6]["user_id"]) == {"id": 7, "name": "x"}
    assert json.loads(got[7]["user_id"]) == [1, 2]


@pytest.mark.parametrize("opt_in", [False, True])
def test_the_fast_path_decides_these_records_as_spark_does(spark: Any, tmp_path: Path, opt_in: bool) -> None:
    changes = {"price": {"allow_non_finite": True}, "user_id": {"allow_json_text": True}} if opt_in else {}
    src = source(**changes)
    reference, rows, fast = both_paths(spark, src, VALUES, tmp_path, block_rows=1)
    assert_same(reference, rows)
    statuses = [r["_status"] for r in comparable(reference)]
    assert statuses.count("rejected") == (0 if opt_in else 7)
    # The NaN/Infinity literals Arrow reads go fast only when the field accepts them.
    assert fast.fast_rows >= (7 if opt_in else 4)
