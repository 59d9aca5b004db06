"""Nested fields, arrays and maps in Spark's parse: values read at their paths, every check applied there too."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from riverhouse.platform.ingest.parse import parse_records
from riverhouse.platform.spec import parse_spec

pytestmark = pytest.mark.spark
KAFKA_TS = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

SPEC = {
    "name": "nested",
    "sources": {
        "events": {
            "topic": "events",
            "fields": {
                "event_id": "string",
                "user.id": "string",  # shorthand: column user_id
                "user.age": "long",
                "score": {"path": ["stats", "score.v2"], "type": "double"},  # a key with a dot
                "tags": "array<string>",
                "nums": "array<double>",
                "attrs": "map<string,string>",
                "hist": {"path": "a.b.c", "type": "map<string,array<long>>"},
                "created": {"path": "meta.created_at", "type": "timestamp"},
            },
            "key": ["event_id"],
            "dedup": {"key": ["user.id"], "window": "1h"},  # a nested key, written as its path
            "event_time": {"field": "meta.created_at"},
        }
    },
    "sink": {"table": "events", "order_by": ["user.id"]},
}


def parse(spark: Any, values: list[bytes], **source_changes: Any) -> list[dict[str, Any]]:
    schema = (
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
        "timestampType int, headers array<struct<key:string,value:binary>>"
    )
    data = [(b"k", v, "events", 0, i, KAFKA_TS, 0, None) for i, v in enumerate(values)]
    src = parse_spec(SPEC).sources["events"]
    if source_changes:
        src = src.model_copy(update=source_changes)
    rows = parse_records(spark.createDataFrame(data, schema), src).orderBy("_offset").collect()
    return [r.asDict(recursive=True) for r in rows]


def record(**overrides: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "event_id": "e1",
        "user": {"id": "u1", "age": 41},
        "stats": {"score.v2": 0.5},
        "tags": ["a", "b"],
        "nums": [1.5, None],
        "attrs": {"plan": "pro", "n": 3},  # a number in a string map is its text, as for a string field
        "a": {"b": {"c": {"x": [1, 2], "y": []}}},
        "meta": {"created_at": "2026-01-02T03:04:05Z"},
    }
    value.update(overrides)
    return value


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()


def test_nested_values_arrays_and_maps_are_read_at_their_paths(spark: Any) -> None:
    [row] = parse(spark, [encode(record())])
    assert row["_status"] == "ok", row["_reason"]
    assert (row["event_id"], row["user_id"], row["user_age"], row["score"]) == ("e1", "u1", 41, 0.5)
    assert row["tags"] == ["a", "b"] and row["nums"] == [1.5, None]
    assert row["attrs"] == {"plan": "pro", "n": "3"}
    assert row["hist"] == {"x": [1, 2], "y": []}
    assert row["created"] == datetime(2026, 1, 2, 3, 4, 5) and row["_event_time"] == row["created"]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"user": {"id": "u1", "age": "old"}}, "field 'user_age' (user.age) should be long, got old"),
        ({"user": "u1"}, "field 'user' should be a JSON object (fields are read inside it), got u1"),
        ({"a": {"b": "flat"}}, "field 'a.b' should be a JSON object (fields are read inside it), got flat"),
        ({"user": {"age": 3}}, "missing required field 'user_id' (user.id)"),
        ({"user": None}, "missing required field 'user_id' (user.id)"),
        ({"user": {"id": {"first": "u"}}}, "field 'user_id' (user.id) should be string, got a JSON object or array"),
        ({"tags": "a,b"}, "field 'tags' should be array<string>, got a,b"),
        ({"tags": ["a", {"b": 1}]}, "field 'tags' should be array<string>, got a JSON object or array where a string"),
        ({"attrs": {"plan": ["x"]}}, "field 'attrs' should be map<string,string>, got a JSON object or array where"),
        ({"a": {"b": {"c": {"x": [1, "two"]}}}}, "field 'hist' (a.b.c) should be map<string,array<long>>, got"),
        ({"meta": {"created_at": "soon"}}, "field 'created' (meta.created_at) is not a valid timestamp: soon"),
    ],
)
def test_every_check_applies_at_nested_paths(spark: Any, changes: dict[str, Any], reason: str) -> None:
    [row] = parse(spark, [encode(record(**changes))])
    assert row["_status"] == "rejected"
    assert row["_reason"].startswith(reason), row["_reason"]


def test_non_finite_numbers_inside_arrays_and_their_opt_in(spark: Any) -> None:
    value = b'{"event_id": "e1", "user": {"id": "u1"}, "nums": [1.0, NaN], "stats": {"score.v2": Infinity}}'
    [row] = parse(spark, [value])
    assert row["_reason"].startswith("field 'score' (stats.score.v2) is not a finite number"), row["_reason"]
    src = parse_spec(SPEC).sources["events"]
    opted = [f.model_copy(update={"allow_non_finite": f.name == "score"}) for f in src.fields]
    [row] = parse(spark, [value], fields=opted)
    assert row["_reason"].startswith("field 'nums' holds a number that is not finite"), row["_reason"]
    opted = [f.model_copy(update={"allow_non_finite": f.name in ("score", "nums")}) for f in src.fields]
    [row] = parse(spark, [value], fields=opted)
    assert row["_status"] == "ok" and row["nums"][0] == 1.0 and row["nums"][1] != row["nums"][1]  # NaN kept


def test_json_text_inside_containers_is_kept_when_allowed(spark: Any) -> None:
    src = parse_spec(SPEC).sources["events"]
    opted = [f.model_copy(update={"allow_json_text": f.name in ("tags", "attrs")}) for f in src.fields]
    value = encode(record(tags=["a", {"b": 1}], attrs={"plan": {"tier": 2}}))
    [row] = parse(spark, [value], fields=opted)
    assert row["_status"] == "ok", row["_reason"]
    assert row["tags"] == ["a", '{"b":1}'] and row["attrs"] == {"plan": '{"tier":2}'}


def test_strings_that_only_look_like_json_and_missing_containers_are_fine(spark: Any) -> None:
    value = encode(record(tags=["{not json", "[1"], attrs=None, nums=None))
    del_hist = record()
    del del_hist["a"]
    rows = parse(spark, [value, encode(del_hist)])
    assert [r["_status"] for r in rows] == ["ok", "ok"], [r["_reason"] for r in rows]
    assert rows[0]["tags"] == ["{not json", "[1"] and rows[0]["attrs"] is None and rows[1]["hist"] is None
