"""Local mode's numpy join gives exactly the rows of Spark's `joins.evaluate`.

The driving rows and lookup rows are silver-shaped Arrow tables with the cases that
decide a temporal lookup: several versions of a key (the latest in the window wins),
window edges to the microsecond, ties on event time (partition, then offset, decides),
right rows after the left one, null keys, keys nobody has, chained lookups keyed on an
earlier lookup's column, a dimension, inner and left joins, `require`, Kafka times that
are missing. Both paths must give the same rows, cast to the gold schema.
"""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform.gold.arrow_join import evaluate_arrow, plain_gold_schema
from riverhouse.platform.gold.joins import evaluate, gold_schema, spark_gold_schema
from riverhouse.platform.spec import PipelineSpec, parse_spec
from riverhouse.platform.state.tables import silver_schema

pytestmark = pytest.mark.spark
T0 = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
ORDER_FIELDS = {"order_id": "string", "user_id": "string", "amount": "int", "created_at": "timestamp"}
USER_FIELDS = {"event_id": "string", "uid": "string", "name": "string", "region": "string", "created_at": "timestamp"}
REGION_FIELDS = {"region": "string", "manager": "string", "n": "long", "updated_at": "timestamp"}


def sql_spec(join: str, require: list[str] | None = None, users_window: str = "1h") -> PipelineSpec:
    return parse_spec(
        {
            "name": "aj",
            "sources": {
                "orders": {
                    "topic": "o",
                    "fields": ORDER_FIELDS,
                    "key": ["order_id"],
                    "event_time": {"field": "created_at"},
                },
                "users": {
                    "topic": "u",
                    "fields": USER_FIELDS,
                    "key": ["event_id"],
                    "event_time": {"field": "created_at"},
                },
                "regions": {
                    "topic": "r",
                    "fields": REGION_FIELDS,
                    "key": ["region"],
                    "event_time": {"field": "updated_at"},
                },
            },
            "query": f"""
            SELECT o.order_id, o.amount, o.created_at, u.name AS user_name, u.created_at AS seen_at,
                   r.manager, r.n
            FROM orders o {join} users u ON o.user_id = u.uid
            LEFT JOIN regions r ON u.region = r.region
        """,
            "state": {"ttl": "1h", "sources": {"users": users_window}},
            "dimensions": ["regions"],
            "require": require or [],
            "sink": {"table": "aj_out", "order_by": ["order_id"]},
        }
    )


def silver(spec: PipelineSpec, source: str, rows: list[dict[str, Any]], partition: int = 0) -> pa.Table:
    schema = silver_schema(spec.sources[source])
    time_field = spec.sources[source].event_time.field
    full = []
    for offset, row in enumerate(rows):
        t = row[time_field]
        full.append(
            {
                **row,
                "_event_time": t,
                "_event_date": t.date() if t else date(2026, 1, 1),
                "_topic": spec.sources[source].topic,
                "_partition": row.get("_partition", partition),
                "_offset": row.get("_offset", offset),
                "_kafka_timestamp": row.get("_kts", t),
                "_batch_id": 0,
            }
        )
    return pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in full], schema=schema)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def cases(spec: PipelineSpec) -> tuple[pa.Table, dict[str, pa.Table]]:
    hour = 60
    orders = [
        {"order_id": "o1", "user_id": "u1", "amount": 1, "created_at": at(30)},
        {"order_id": "o2", "user_id": "u2", "amount": 2, "created_at": at(0)},
        {"order_id": "o3", "user_id": "u3", "amount": 3, "created_at": at(40), "_kts": None},
        {"order_id": "o4", "user_id": None, "amount": 4, "created_at": at(5)},
        {"order_id": "o5", "user_id": "nobody", "amount": 5, "created_at": at(6)},
        {"order_id": "o6", "user_id": "edge", "amount": 6, "created_at": at(0)},
        {"order_id": "o7", "user_id": "tie", "amount": 7, "created_at": at(10)},
        {"order_id": "o8", "user_id": "u1", "amount": 8, "created_at": at(200)},
        {"order_id": "o9", "user_id": "nameless", "amount": 9, "created_at": at(1)},
        {"order_id": "o10", "user_id": "lower", "amount": 10, "created_at": at(0)},
    ]
    second = timedelta(microseconds=1)
    users = [
        {"event_id": "e1", "uid": "u1", "name": "A1", "region": "west", "created_at": at(0)},
        {"event_id": "e2", "uid": "u1", "name": "A2", "region": "east", "created_at": at(20)},
        {"event_id": "e3", "uid": "u1", "name": "A3", "region": "west", "created_at": at(95)},  # after o1, outside
        {"event_id": "e4", "uid": "u2", "name": "B", "region": "nowhere", "created_at": at(50)},  # after o2, inside
        {"event_id": "e5", "uid": "u3", "name": "C", "region": None, "created_at": at(41), "_kts": at(99)},
        {"event_id": "e6", "uid": None, "name": "null key", "region": "west", "created_at": at(5)},
        {"event_id": "e7", "uid": "edge", "name": "in", "region": "west", "created_at": at(hour)},
        {"event_id": "e8", "uid": "edge", "name": "out", "region": "west", "created_at": at(hour) + second},
        {"event_id": "e9", "uid": "edge", "name": "out2", "region": "west", "created_at": at(-hour) - second},
        {
            "event_id": "e10",
            "uid": "tie",
            "name": "p0",
            "region": "east",
            "created_at": at(10),
            "_partition": 0,
            "_offset": 50,
        },
        {
            "event_id": "e11",
            "uid": "tie",
            "name": "p1-low",
            "region": "east",
            "created_at": at(10),
            "_partition": 1,
            "_offset": 3,
        },
        {
            "event_id": "e12",
            "uid": "tie",
            "name": "p1-high",
            "region": "east",
            "created_at": at(10),
            "_partition": 1,
            "_offset": 4,
        },
        {"event_id": "e13", "uid": "nameless", "name": None, "region": "east", "created_at": at(2)},
        {"event_id": "e14", "uid": "lower", "name": "lower-in", "region": "east", "created_at": at(-hour)},
    ]
    regions = [
        {"region": "west", "manager": "W-old", "n": 1, "updated_at": datetime(2020, 1, 1, tzinfo=UTC)},
        {"region": "west", "manager": "W", "n": 2, "updated_at": datetime(2025, 1, 1, tzinfo=UTC)},
        {"region": "east", "manager": "E", "n": None, "updated_at": datetime(2019, 1, 1, tzinfo=UTC)},
        {"region": None, "manager": "null region", "n": 9, "updated_at": datetime(2025, 1, 1, tzinfo=UTC)},
    ]
    return silver(spec, "orders", orders), {"u": silver(spec, "users", users), "r": silver(spec, "regions", regions)}


def both(spark: Any, spec: PipelineSpec, driving: pa.Table, lookups: dict[str, pa.Table]) -> tuple[list, list]:
    schema = gold_schema(spark, spec)
    reference = evaluate(spark, spec, spec.plan, driving, lookups).toArrow().select(schema.names).cast(schema)
    fast = evaluate_arrow(spec, spec.plan, driving, lookups)
    assert fast is not None
    fast = fast.select(schema.names).cast(schema)
    order = [("_left_partition", "ascending"), ("_left_offset", "ascending")]
    return fast.sort_by(order).to_pylist(), reference.sort_by(order).to_pylist()


@pytest.mark.parametrize("join", ["LEFT JOIN", "JOIN"])
@pytest.mark.parametrize("require", [[], ["user_name", "manager"]])
def test_the_numpy_join_gives_sparks_rows(spark: Any, join: str, require: list[str]) -> None:
    spec = sql_spec(join, require)
    driving, lookups = cases(spec)
    fast, reference = both(spark, spec, driving, lookups)
    assert fast == reference
    names = {r["order_id"]: r["user_name"] for r in reference}
    # The cases really decide something: the latest in the window, the tie-break, the edges.
    assert names["o1"] == "A2" and names["o2"] == "B" and names["o7"] == "p1-high" and names["o6"] == "in"
    assert names["o10"] == "lower-in"
    assert {r["_status"] for r in reference} >= ({"emitted", "unmatched"} if join == "JOIN" else {"emitted"})


def test_random_streams_give_sparks_rows(spark: Any) -> None:
    spec = sql_spec("LEFT JOIN", users_window="10m")
    rng = random.Random(5)
    orders = [
        {"order_id": f"o{i}", "user_id": f"u{rng.randrange(40)}", "amount": i, "created_at": at(rng.randrange(0, 300))}
        for i in range(600)
    ]
    users = [
        {
            "event_id": f"e{i}",
            "uid": f"u{rng.randrange(40)}",
            "name": f"n{i}",
            "region": rng.choice(["west", "east", None]),
            "created_at": at(rng.randrange(-20, 320)),
            "_partition": rng.randrange(4),
            "_offset": i,
        }
        for i in range(400)
    ]
    lookups = {"u": silver(spec, "users", users), "r": cases(spec)[1]["r"]}
    fast, reference = both(spark, spec, silver(spec, "orders", orders), lookups)
    assert fast == reference
    assert 100 < sum(r["_matched"] for r in reference) < 600


def test_plans_the_numpy_join_does_not_take() -> None:
    base = sql_spec("LEFT JOIN").model_dump(mode="json", exclude={"plan"})
    join = "FROM orders o LEFT JOIN users u ON o.user_id = u.uid"
    specs = [
        parse_spec({**base, "dimensions": [], "query": query})
        for query in (
            f"SELECT o.order_id {join} WHERE o.amount > 1",
            f"SELECT o.order_id, o.amount * 2 AS twice {join}",
            "SELECT o.order_id FROM orders o LEFT JOIN users u ON o.amount = u.uid",  # types differ: Spark casts
        )
    ]
    for spec in specs:
        driving, lookups = cases(spec)
        assert evaluate_arrow(spec, spec.plan, driving, {"u": lookups["u"]}) is None


def test_plain_gold_schema_is_the_one_spark_analyses(spark: Any) -> None:
    every_type = {
        "id": "string",
        "i": "int",
        "l": "long",
        "f": "float",
        "d": "double",
        "b": "boolean",
        "t": "timestamp",
        "day": "date",
    }
    spec = parse_spec(
        {
            "name": "types",
            "sources": {
                "a": {"topic": "a", "fields": every_type, "key": ["id"], "event_time": {"field": "t"}},
                "b": {"topic": "b", "fields": every_type, "key": ["id"], "event_time": {"field": "t"}},
            },
            "query": "SELECT a.id, a.i, a.l, a.f, a.d, a.b, a.t, a.day, b.i AS b_i, b.f AS b_f, b.day AS b_day "
            "FROM a LEFT JOIN b ON a.id = b.id",
            "state": {"ttl": "1h"},
            "sink": {"table": "types_out", "order_by": ["id"]},
        }
    )
    where = parse_spec(
        {
            **spec.model_dump(mode="json", exclude={"plan"}),
            "query": "SELECT a.id, b.t FROM a LEFT JOIN b ON a.id = b.id WHERE a.i > 1",
        }
    )
    for each in (spec, where, sql_spec("LEFT JOIN", ["user_name"]), sql_spec("JOIN")):
        assert plain_gold_schema(each, each.plan) == spark_gold_schema(spark, each)
    computed = parse_spec(
        {
            **spec.model_dump(mode="json", exclude={"plan"}),
            "query": "SELECT a.id, a.i + 1 AS j FROM a LEFT JOIN b ON a.id = b.id",
        }
    )
    assert plain_gold_schema(computed, computed.plan) is None
