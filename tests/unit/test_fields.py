"""Nested fields, arrays and maps in the spec: paths, references by path, and one type map for every layer."""

from __future__ import annotations

import copy
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_type

from riverhouse.platform.sink.clickhouse import clickhouse_type, expected_columns
from riverhouse.platform.spec import SpecError, parse_spec
from riverhouse.platform.state.tables import silver_schema
from riverhouse.platform.types import SCALARS, SpecTypeError, arrow_type, canonical, parse_type, spark_type_names
from riverhouse.platform.types import clickhouse_type as spec_clickhouse_type

pytestmark = pytest.mark.unit

SPEC: dict[str, Any] = {
    "name": "nested",
    "sources": {
        "users": {
            "topic": "users",
            "fields": {
                "event_id": "string",
                "user.id": "string",
                "user.name": {"type": "string", "required": True},
                "city": {"path": "user.address.city", "type": "string"},
                "service": {"path": ["resource", "service.name"], "type": "string"},
                "tags": "Array< String >",
                "attrs": "map<string,long>",
            },
            "key": ["event_id"],
            "dedup": {"key": ["user.id"], "window": "1h"},
        },
        "orders": {"topic": "orders", "fields": {"order_id": "string", "buyer.id": "string"}, "key": ["order_id"]},
    },
    "join": {
        "left": "orders",
        "right": "users",
        "on": {"left": ["buyer.id"], "right": ["user.id"]},
        "window": "1h",
        "select": {"order_id": "orders.order_id", "city": "users.user.address.city", "tags": "users.tags"},
    },
    "sink": {"table": "orders_users", "order_by": ["order_id"]},
}


def problems(change: Any) -> str:
    data = copy.deepcopy(SPEC)
    change(data)
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    return "\n".join(message for _, message, _ in err.value.problems)


def test_fields_read_at_paths_and_referenced_by_name_or_path() -> None:
    spec = parse_spec(SPEC)
    users = spec.sources["users"]
    assert [(f.name, f.path_text, f.type) for f in users.fields] == [
        ("event_id", "event_id", "string"),
        ("user_id", "user.id", "string"),  # a dotted name is the path; the column is user_id
        ("user_name", "user.name", "string"),
        ("city", "user.address.city", "string"),
        ("service", "resource.service.name", "string"),
        ("tags", "tags", "array<string>"),  # written in the spec's own spelling
        ("attrs", "attrs", "map<string,long>"),
    ]
    assert users.field("service").segments == ("resource", "service.name")  # one key with a dot in it
    assert users.dedup is not None and users.dedup.key == ["user_id"]  # written as its path
    assert spec.join is not None and (spec.join.on.left, spec.join.on.right) == (["buyer_id"], ["user_id"])
    assert spec.join.select["city"] == "users.city"
    assert "user_id" in users.required_fields and "user_name" in users.required_fields
    # The spec dumps and loads back to itself (paths in their written form).
    assert parse_spec(spec.model_dump(mode="json")) == spec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["sources"]["users"].update(key=["tags"]), "key field 'tags' is array<string>: keys"),
        (lambda d: d["sources"]["users"]["fields"].update(user="string"), "inside the value of field 'user'"),
        (lambda d: d["sources"]["users"]["fields"].update({"User.x": "string"}), "differ only in case"),
        (lambda d: d["sources"]["users"]["fields"].update(x={"path": "user.id", "type": "long"}), "same path"),
        (lambda d: d["sources"]["users"]["fields"].update(x={"path": "a..b", "type": "long"}), "key '' is empty"),
        (lambda d: d["sources"]["users"]["fields"].update(x={"path": "a['b']", "type": "long"}), "characters other"),
        (lambda d: d["sources"]["users"]["fields"].update(x={"path": "_corrupt", "type": "long"}), "reserved"),
        (lambda d: d["sources"]["users"]["fields"].update(x="array<timestamp>"), "keep times inside containers"),
        (lambda d: d["sources"]["users"]["fields"].update(x="map<long,string>"), "expected 'string'"),
        (lambda d: d["sources"]["users"]["fields"].update(x="list<string>"), "unknown type 'list'"),
        (lambda d: d["sources"]["users"]["fields"].update(x="decimal(39,2)"), "1 <= P <= 38 and 0 <= S <= P"),
        (lambda d: d["sources"]["users"]["fields"].update(x="decimal(4,5)"), "1 <= P <= 38 and 0 <= S <= P"),
        (lambda d: d["sources"]["users"]["fields"].update(x="decimal"), "write e.g. decimal(10,2)"),
        (lambda d: d["sources"]["users"]["fields"].update(x="array<decimal(10,2)>"), "not decimals"),
        (lambda d: d["sources"]["users"]["fields"].update({"a-b.c": "string"}), "is not an identifier"),
        (lambda d: d["sources"]["users"]["fields"].update(x={"type": "array<long>", "min": 1}), "min/max apply"),
        (lambda d: d["join"]["on"].update(right=["attrs"]), "is map<string,long>: keys"),
        (
            lambda d: d["join"]["on"].update(right=["user.nope"]),
            "join.on.right: 'user.nope' is not a field, nor the path of one (paths: resource.service.name, user.address.city, user.id, user.name)",
        ),
    ],
)
def test_bad_paths_types_and_keys_are_refused_with_the_reason(change: Any, message: str) -> None:
    assert message in problems(change)


def test_json_text_and_non_finite_opt_ins_apply_to_container_leaves() -> None:
    def field(**block: Any) -> Any:
        return lambda d: d["sources"]["users"]["fields"].update(x=block)

    data = copy.deepcopy(SPEC)
    data["sources"]["users"]["fields"]["x"] = {"type": "map<string,array<string>>", "allow_json_text": True}
    data["sources"]["users"]["fields"]["y"] = {"type": "array<double>", "allow_non_finite": True}
    parse_spec(data)
    assert "allow_json_text applies to string" in problems(field(type="array<long>", allow_json_text=True))
    assert "allow_non_finite applies to float" in problems(field(type="map<string,long>", allow_non_finite=True))


def test_one_type_map_for_delta_clickhouse_and_the_checks() -> None:
    assert canonical("MAP< string , ARRAY<long> >") == "map<string,array<long>>"
    assert str(parse_type("array<map<string,double>>").leaf) == "double"
    with pytest.raises(SpecTypeError, match="nests more than 4 levels"):
        parse_type("array<array<array<array<array<long>>>>>")
    assert arrow_type("map<string,array<long>>") == pa.map_(pa.string(), pa.list_(pa.int64()))
    # The quality suite's Spark type for each type is the class Spark reads the Delta column as.
    for typ in [*SCALARS, "decimal(10,2)", "array<long>", "map<string,array<string>>"]:
        assert type(from_arrow_type(arrow_type(typ))).__name__ in spark_type_names(typ)
    # An exact decimal is one in every layer: Delta (Arrow), ClickHouse, the spec's own spelling.
    assert canonical("DECIMAL( 18 , 4 )") == "decimal(18,4)"
    assert arrow_type("decimal(18,4)") == pa.decimal128(18, 4)
    assert spec_clickhouse_type("decimal(18,4)") == clickhouse_type(pa.decimal128(18, 4), "x") == "Decimal(18, 4)"
    spec = parse_spec({**SPEC, "join": None, "sink": {"source": "users", "table": "u", "order_by": ["user.id"]}})
    assert spec.sink.order_by == ["user_id"]
    silver = silver_schema(spec.sources["users"])
    assert silver.field("tags").type == pa.list_(pa.string())
    assert silver.field("attrs").type == pa.map_(pa.string(), pa.int64())
    columns = dict(expected_columns(spec))
    assert columns["user_id"] == "String"  # order_by: not nullable
    assert columns["city"] == "Nullable(String)"
    # ClickHouse has no Nullable(Array) or Nullable(Map): a missing one loads empty; elements may be null.
    assert columns["tags"] == "Array(Nullable(String))" and columns["attrs"] == "Map(String, Nullable(Int64))"
    # The join's output columns, typed by Spark (Arrow), map the same way.
    assert clickhouse_type(pa.list_(pa.map_(pa.string(), pa.float64())), "x") == "Array(Map(String, Nullable(Float64)))"
