"""Join/SQL specs: compiled to a plan, validated up front with errors naming the clause."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from riverhouse.platform.spec import SpecError, load_specs, parse_spec
from tests.conftest import REPO

pytestmark = pytest.mark.unit

SOURCES = {
    "orders": {
        "topic": "orders",
        "fields": {
            "order_id": "string",
            "user_id": "string",
            "amount": "int",
            "price": "double",
            "created_at": "timestamp",
        },
        "key": ["order_id"],
        "event_time": {"field": "created_at"},
    },
    "users": {
        "topic": "user_events",
        "fields": {"event_id": "string", "user_id": "string", "name": "string", "created_at": "timestamp"},
        "key": ["event_id"],
        "event_time": {"field": "created_at"},
    },
    "tiers": {"topic": "tiers", "fields": {"user_id": "string", "tier": "string"}, "key": ["user_id"]},
}


def sql_spec(query: str, **extra: Any) -> Any:
    return parse_spec(
        {
            "name": "q",
            "sources": SOURCES,
            "query": query,
            "sink": {"table": "out", "order_by": extra.pop("order_by", ["order_id"])},
            **extra,
        }
    )


def error(query: str, **extra: Any) -> str:
    with pytest.raises(SpecError) as info:
        sql_spec(query, **extra)
    return info.value.problems[0][1]


def test_plan_of_a_two_join_query() -> None:
    spec = sql_spec(
        "SELECT o.order_id, u.name AS user_name, t.tier, o.amount * o.price AS total FROM orders o "
        "LEFT JOIN users u ON o.user_id = u.user_id JOIN tiers t ON u.user_id = t.user_id WHERE o.amount > 0",
        dimensions=["tiers"],
        state={"ttl": "2h", "sources": {"users": "30m"}},
    )
    plan = spec.plan
    assert plan.driving_source == "orders" and plan.output_names == ["order_id", "user_name", "tier", "total"]
    assert [(s.source, s.kind, s.window) for s in plan.steps] == [
        ("users", "left", timedelta(minutes=30)),
        ("tiers", "inner", None),
    ]
    assert plan.steps[1].keys[0].base_alias == "u"  # chained on the earlier join
    assert plan.where == "`o__amount` > 0"
    assert plan.close_after == timedelta(minutes=30)
    assert spec.sink_source_name == "orders"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT o.order_id FROM pets o", "FROM names unknown source 'pets'"),
        ("SELECT o.order_id, o.nope FROM orders o", "unknown column 'nope' of 'orders'"),
        ("SELECT o.order_id FROM orders o LEFT JOIN users u ON o.amount > 1", "only `a.x = b.y` equality keys"),
        ("SELECT o.order_id FROM orders o LEFT JOIN users u", "has no ON clause"),
        ("SELECT o.order_id, count(*) AS n FROM orders o GROUP BY o.order_id", "GROUP BY"),
        ("SELECT o.order_id, sum(o.amount) AS s FROM orders o", "aggregate functions"),
        ("SELECT DISTINCT o.order_id FROM orders o", "DISTINCT"),
        ("SELECT * FROM orders", "SELECT *"),
        ("SELECT o.order_id FROM orders o ORDER BY o.order_id", "ORDER BY"),
        ("SELECT o.order_id FROM orders o FULL JOIN users u ON o.user_id = u.user_id", "FULL"),
        ("SELECT order_id, user_id FROM orders o JOIN users u ON o.user_id = u.user_id", "ambiguous"),
        ("SELECT o.order_id, o.amount + 1 FROM orders o", "needs a name"),
        (
            "SELECT o.order_id FROM orders o JOIN users u ON u.user_id = u.event_id",
            "must compare 'u' with an earlier source",
        ),
        ("SELECT o.order_id FROM (SELECT * FROM orders) o", "unsupported clause: subqueries"),
        ("SELEC o.order_id FROM orders o", "cannot parse SQL"),
    ],
)
def test_query_errors_name_the_clause(query: str, message: str) -> None:
    assert message in error(query)


def test_require_dimensions_and_order_by_are_checked() -> None:
    with pytest.raises(SpecError) as info:
        sql_spec("SELECT o.order_id FROM orders o", require=["nope"])
    assert info.value.problems[0][:2] == ("require", "'nope' is not an output column of the query (order_id)")
    assert "not used in the query" in error("SELECT o.order_id FROM orders o", dimensions=["tiers"])
    assert "FROM 'tiers' is a dimension" in error("SELECT t.user_id AS order_id FROM tiers t", dimensions=["tiers"])
    assert "order_by column 'x'" in error("SELECT o.order_id FROM orders o", order_by=["x"])


def test_temporal_join_spec_validation() -> None:
    base = {"name": "j", "sources": SOURCES, "sink": {"table": "out", "order_by": ["order_id"]}}
    join = {
        "left": "orders",
        "right": "users",
        "on": ["user_id"],
        "window": "1h",
        "select": {"order_id": "orders.order_id", "user_name": "users.name"},
    }
    spec = parse_spec({**base, "join": join})
    assert spec.plan.steps[0].kind == "inner" and spec.plan.output_names == ["order_id", "user_name"]
    for change, message in [
        ({"window": "8d"}, "longer than the maximum"),
        ({"right": "pets"}, "'pets' is not one of the sources"),
        ({"on": {"left": ["user_id"], "right": ["nope"]}}, "key 'nope' is not a field of 'users'"),
        ({"select": {"order_id": "orders.nope"}}, "has no field 'nope'"),
        ({"select": {"order_id": "order_id"}}, "write <source>.<field>"),
        ({"type": "outer"}, "Input should be"),
    ]:
        with pytest.raises(SpecError) as info:
            parse_spec({**base, "join": {**join, **change}})
        assert any(message in p[1] for p in info.value.problems), (change, info.value.problems)
    with pytest.raises(SpecError, match="not both"):
        parse_spec({**base, "join": join, "query": "SELECT o.order_id FROM orders o"})


def test_example_join_specs_are_valid() -> None:
    joins = [s for s in load_specs(REPO / "pipelines") if s.is_join]
    assert {s.name for s in joins} >= {"orders_enriched", "orders_sql"}
