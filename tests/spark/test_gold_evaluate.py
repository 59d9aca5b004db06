"""The gold join's semantics in Spark (`evaluate`), on silver-shaped rows with hand-written expectations.

The cases decide a temporal lookup: several versions of a key (the latest in the window
wins), window edges to the microsecond, ties on event time (partition, then offset,
decides), right rows after the left one, null keys, keys nobody has, a lookup keyed on an
earlier lookup's column, a dimension (latest row per key), inner and left joins, `require`.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform.gold.evaluate import drop_views, evaluate, gold_schema, latest_per_key
from riverhouse.platform.spec import PipelineSpec, parse_spec
from riverhouse.platform.state.tables import silver_schema, spark_schema

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


def frame(spark: Any, spec: PipelineSpec, source: str, table: pa.Table) -> Any:
    return spark.createDataFrame(table.to_pylist(), spark_schema(silver_schema(spec.sources[source])))


def joined(spark: Any, spec: PipelineSpec, dimension_reduced: bool = True) -> dict[str, dict[str, Any]]:
    driving, lookups = cases(spec)
    frames = {
        alias: frame(spark, spec, spec.plan.steps[i].source, lookups[alias]) for i, alias in enumerate(["u", "r"])
    }
    if dimension_reduced:
        frames["r"] = latest_per_key(frames["r"], spec.plan.steps[1])
    views: list[str] = []
    rows = evaluate(spark, spec, spec.plan, frame(spark, spec, "orders", driving), frames, views).collect()
    # The SQL's temporary view is dropped after use: the session may be shared by later runs.
    [view] = views
    assert spark.catalog.tableExists(view)
    drop_views(spark, views)
    assert not spark.catalog.tableExists(view) and views == []
    return {r["order_id"]: r.asDict() for r in rows}


@pytest.mark.parametrize("join", ["LEFT JOIN", "JOIN"])
def test_latest_match_in_the_window_edges_and_ties(spark: Any, join: str) -> None:
    rows = joined(spark, sql_spec(join))
    names = {k: r["user_name"] for k, r in rows.items()}
    assert names == {
        "o1": "A2",  # A3 is 65 min after: outside; A1 and A2 inside, A2 the latest
        "o2": "B",  # 50 min after the order: inside
        "o3": "C",
        "o4": None,  # null key matches nothing
        "o5": None,
        "o6": "in",  # exactly +1h is inside, +1h+1us and -1h-1us are not
        "o7": "p1-high",  # same time: higher partition, then higher offset
        "o8": None,  # u1's versions are all more than 1h before
        "o9": None,  # matched, with a null name
        "o10": "lower-in",  # exactly -1h is inside
    }
    managers = {k: r["manager"] for k, r in rows.items()}
    # The dimension is joined on the user's region: its latest row per key, no window.
    assert managers["o1"] == "E" and managers["o6"] == "W" and managers["o2"] is None and managers["o4"] is None
    assert rows["o3"]["_late_match"] is None or rows["o3"]["_late_match"] is False  # o3 has no Kafka time
    statuses = {k: r["_status"] for k, r in rows.items()}
    unmatched = {"o4", "o5", "o8"}
    if join == "JOIN":
        assert {k for k, s in statuses.items() if s == "unmatched"} == unmatched
    else:
        assert set(statuses.values()) == {"emitted"}
        # `_matched`: every lookup matched; o2's region has no row, o3's user has no region.
        assert {k for k, r in rows.items() if not r["_matched"]} == unmatched | {"o2", "o3"}


def test_require_rejects_rows_missing_a_field_with_the_first_missing_one(spark: Any) -> None:
    rows = joined(spark, sql_spec("LEFT JOIN", ["user_name", "manager"]))
    rejected = {k: r["_reason"] for k, r in rows.items() if r["_status"] == "rejected"}
    assert rejected == {
        k: "required field 'user_name' is missing when the join window closed" for k in ("o4", "o5", "o8", "o9")
    } | {k: "required field 'manager' is missing when the join window closed" for k in ("o2", "o3")}


def test_the_dimension_reduced_to_its_latest_rows_gives_the_same_join(spark: Any) -> None:
    spec = sql_spec("LEFT JOIN")
    assert joined(spark, spec, dimension_reduced=True) == joined(spark, spec, dimension_reduced=False)


def test_gold_schema_types_follow_the_query(spark: Any) -> None:
    schema = gold_schema(spark, sql_spec("LEFT JOIN"))
    assert schema.field("order_id").type == pa.string() and schema.field("amount").type == pa.int32()
    assert schema.field("seen_at").type == pa.timestamp("us", tz="UTC") and schema.field("n").type == pa.int64()
    assert {"_left_topic", "_left_partition", "_left_offset", "_status", "_reason", "_matched"} <= set(schema.names)
    assert all(f.nullable for f in schema)
