"""Temporal joins and SQL pipelines on real Kafka, Spark, Delta and ClickHouse: exact rows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from riverhouse.platform.gold.joins import gold_path, gold_quarantine_path
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import PipelineSpec, parse_spec
from riverhouse.platform.state.checkpoints import checkpoint_dir
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import produce

pytestmark = pytest.mark.integration

ORDER_FIELDS = {
    "order_id": "string",
    "user_id": "string",
    "amount": "int",
    "price": "double",
    "created_at": "timestamp",
}
USER_FIELDS = {"event_id": "string", "uid": "string", "name": "string", "created_at": "timestamp"}


def join_spec(
    topics: dict[str, str],
    kind: str = "left",
    name: str = "joined",
    window: str = "1h",
    require: list[str] | None = None,
) -> PipelineSpec:
    return parse_spec(
        {
            "name": name,
            "sources": {
                "orders": {
                    "topic": topics["orders"],
                    "fields": ORDER_FIELDS,
                    "key": ["order_id"],
                    "event_time": {"field": "created_at"},
                    "dedup": {"window": "1h"},
                },
                "users": {
                    "topic": topics["users"],
                    "fields": USER_FIELDS,
                    "key": ["event_id"],
                    "event_time": {"field": "created_at"},
                    "dedup": {"window": "1h"},
                },
            },
            "join": {
                "type": kind,
                "left": "orders",
                "right": "users",
                "on": {"left": ["user_id"], "right": ["uid"]},  # key names differ per side
                "window": window,
                "require": require or [],
                "select": {
                    "order_id": "orders.order_id",
                    "user_id": "orders.user_id",
                    "user_name": "users.name",
                    "amount": "orders.amount",
                    "created_at": "orders.created_at",
                },
            },
            "sink": {"table": f"{name}_out", "order_by": ["order_id"]},
        }
    )


def o(order_id: str, user: str, at: str, amount: int = 1) -> tuple[bytes, bytes]:
    return order_id.encode(), json.dumps(
        {"order_id": order_id, "user_id": user, "amount": amount, "price": 2.0, "created_at": f"2026-01-01T{at}:00Z"}
    ).encode()


def u(event_id: str, user: str, name: str, at: str) -> tuple[bytes, bytes]:
    return event_id.encode(), json.dumps(
        {"event_id": event_id, "uid": user, "name": name, "created_at": f"2026-01-01T{at}:00Z"}
    ).encode()


def topics_for(topic: str) -> dict[str, str]:
    return {"orders": f"{topic}_orders", "users": f"{topic}_users"}


def ch_rows(settings: Settings, spec: PipelineSpec) -> list[tuple[Any, ...]]:
    with open_client(settings.clickhouse_dsn) as client:
        return sorted(client.query(f"SELECT order_id, user_name FROM {qualified_table(spec)}").result_rows)


def semantics_events(kafka: str, topics: dict[str, str]) -> None:
    produce(
        kafka,
        topics["users"],
        [
            u("e1", "u1", "A1", "10:00"),
            u("e2", "u1", "A2", "10:20"),  # two versions: latest in window wins
            u("e3", "u2", "B", "12:30"),  # outside o2's window
            u("e4", "u4", "D", "09:30"),  # right before left
        ],
    )
    produce(
        kafka,
        topics["orders"],
        [
            o("o1", "u1", "10:30"),
            o("o1", "u1", "10:30"),  # duplicate left event
            o("o2", "u2", "10:00"),
            o("o3", "u3", "10:40"),
            o("o4", "u4", "10:15"),
            o("o5", "u1", "11:45"),  # u1's versions are > 1h before
        ],
    )
    produce(kafka, topics["users"], [u("e5", "u3", "C", "10:50")])  # arrives after its order: late match


def test_left_temporal_join_exact_rows(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    topics = topics_for(topic)
    semantics_events(kafka, topics)
    spec = join_spec(topics, "left", name="lj")
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)
    assert ch_rows(settings, spec) == [("o1", "A2"), ("o2", None), ("o3", "C"), ("o4", "D"), ("o5", None)]
    assert (summary["join_processed"], summary["join_matched"], summary["join_unmatched_left"]) == (5, 3, 2)
    assert summary["join_late_matches"] == 1
    # Re-running emits nothing again: each left event exactly once.
    again = Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)
    assert again["join_processed"] == 0 and again["clickhouse_rows_loaded"] == 0
    assert len(ch_rows(settings, spec)) == 5


def test_inner_temporal_join_exact_rows(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    topics = topics_for(topic)
    semantics_events(kafka, topics)
    spec = join_spec(topics, "inner", name="ij")
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)
    assert ch_rows(settings, spec) == [("o1", "A2"), ("o3", "C"), ("o4", "D")]
    assert summary["join_unmatched_inner"] == 2 and summary["join_emitted"] == 3


def test_unmatched_left_is_emitted_once_after_its_window_closes(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    topics = topics_for(topic)
    spec = join_spec(topics, "left", name="wc")
    produce(kafka, topics["orders"], [o("o1", "ux", "10:00")])
    produce(kafka, topics["users"], [u("e1", "ua", "A", "10:00")])
    first = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    # Watermark 10:00 < 10:00 + 1h: o1's window is open, nothing is emitted yet.
    assert (first["join_processed"], first["join_pending"]) == (0, 1)
    assert ch_rows(settings, spec) == []
    # Both streams move past 11:00: o1's window closes, it is emitted without a match.
    produce(kafka, topics["orders"], [o("o2", "ub", "11:30")])
    produce(kafka, topics["users"], [u("e2", "ub", "B", "11:30")])
    second = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    assert (second["join_processed"], second["join_unmatched_left"], second["join_pending"]) == (1, 1, 1)
    assert ch_rows(settings, spec) == [("o1", None)]
    # A right event for o1 arriving now is too late: o1 was final and is not emitted twice.
    produce(kafka, topics["users"], [u("e3", "ux", "X", "10:10")])
    third = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()
    assert third["join_processed"] == 0
    assert ch_rows(settings, spec) == [("o1", None)]


def test_require_sends_incomplete_rows_to_quarantine(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    topics = topics_for(topic)
    produce(kafka, topics["orders"], [o("o1", "u1", "10:00"), o("o2", "nobody", "10:00")])
    produce(kafka, topics["users"], [u("e1", "u1", "A", "10:05")])
    spec = join_spec(topics, "left", name="rq", require=["user_name"])
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)
    assert summary["join_rejected"] == 1
    assert ch_rows(settings, spec) == [("o1", "A")]
    layout = TableLayout(settings.warehouse, spec.name)
    quarantined = open_table(gold_quarantine_path(layout, spec)).to_pyarrow_dataset().to_table().to_pylist()
    assert [(r["order_id"], r["_reason"]) for r in quarantined] == [
        ("o2", "required field 'user_name' is missing when the join window closed")
    ]
    gold = open_table(gold_path(layout, spec)).to_pyarrow_dataset().to_table()
    assert sorted(gold.column("_status").to_pylist()) == ["emitted", "rejected"]


def test_sql_pipeline_with_dimension_and_where(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    topics = {**topics_for(topic), "tiers": f"{topic}_tiers"}
    spec = parse_spec(
        {
            "name": "sqlp",
            "sources": {
                "orders": {
                    "topic": topics["orders"],
                    "fields": ORDER_FIELDS,
                    "key": ["order_id"],
                    "event_time": {"field": "created_at"},
                    "dedup": {"window": "1h"},
                },
                "users": {
                    "topic": topics["users"],
                    "fields": USER_FIELDS,
                    "key": ["event_id"],
                    "event_time": {"field": "created_at"},
                },
                "tiers": {
                    "topic": topics["tiers"],
                    "fields": {"user_id": "string", "tier": "string", "updated_at": "timestamp"},
                    "key": ["user_id"],
                    "event_time": {"field": "updated_at"},
                },
            },
            "query": """
            SELECT o.order_id, u.name AS user_name, t.tier, o.amount * o.price AS total
            FROM orders o
            LEFT JOIN users u ON o.user_id = u.uid
            LEFT JOIN tiers t ON o.user_id = t.user_id
            WHERE o.amount > 1
        """,
            "state": {"ttl": "1h", "sources": {"users": "30m"}},
            "dimensions": ["tiers"],
            "sink": {"table": "sqlp_out", "order_by": ["order_id"]},
        }
    )
    produce(
        kafka,
        topics["tiers"],
        [
            (b"u1", json.dumps({"user_id": "u1", "tier": "silver", "updated_at": "2020-01-01T00:00:00Z"}).encode()),
            (b"u1", json.dumps({"user_id": "u1", "tier": "gold", "updated_at": "2025-06-01T00:00:00Z"}).encode()),
            (b"u2", json.dumps({"user_id": "u2", "tier": "bronze", "updated_at": "2019-01-01T00:00:00Z"}).encode()),
        ],
    )
    produce(kafka, topics["users"], [u("e1", "u1", "Ann", "10:00"), u("e2", "u2", "Bob", "09:00")])
    produce(
        kafka,
        topics["orders"],
        [
            o("o1", "u1", "10:10", amount=3),  # user in window, dimension's latest tier
            o("o2", "u2", "10:10", amount=2),  # Bob is 70 min earlier: outside users' 30m TTL
            o("o3", "u1", "10:20", amount=1),  # filtered by WHERE
            o("o4", "u9", "10:20", amount=5),  # nobody: nulls
        ],
    )
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)
    with open_client(settings.clickhouse_dsn) as client:
        rows = sorted(client.query(f"SELECT order_id, user_name, tier, total FROM {qualified_table(spec)}").result_rows)
        column_types = {r[0]: r[1] for r in client.query(f"DESCRIBE TABLE {qualified_table(spec)}").result_rows}
    assert rows == [("o1", "Ann", "gold", 6.0), ("o2", None, "bronze", 4.0), ("o4", None, None, 10.0)]
    assert summary["join_filtered"] == 1
    # ClickHouse types come from the query's output types.
    assert column_types == {
        "order_id": "String",
        "user_name": "Nullable(String)",
        "tier": "Nullable(String)",
        "total": "Nullable(Float64)",
        "_event_date": "Date",
    }  # the partition key


def test_example_sql_spec_against_a_reference(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    """pipelines/orders_sql.yaml on generated data, compared with plain Python over the events."""
    from datetime import timedelta

    import yaml

    from riverhouse.platform.kafka.generator import (
        GeneratorConfig,
        expected_join,
        orders,
        user_events,
        user_tiers,
    )
    from tests.conftest import REPO

    data = yaml.safe_load((REPO / "pipelines" / "orders_sql.yaml").read_text())
    for name in data["sources"]:
        data["sources"][name]["topic"] = f"{topic}_{name}"
    data["name"] = "sql_example"
    spec = parse_spec(data)
    cfg = GeneratorConfig(count=400, duplicate_rate=0.1, malformed=2, users=50, seed=9)
    order_records, order_stats = orders(cfg)
    user_records, user_stats = user_events(cfg)
    tier_records, tier_stats = user_tiers(cfg)
    produce(kafka, f"{topic}_user_tiers", list(tier_records))
    produce(kafka, f"{topic}_user_events", list(user_records))
    produce(kafka, f"{topic}_orders", list(order_records))
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)

    names = expected_join(order_stats, user_stats, timedelta(hours=1))["names"]
    latest_tier: dict[str, tuple[str, str]] = {}
    for row in tier_stats.events:
        if row["user_id"] not in latest_tier or row["updated_at"] > latest_tier[row["user_id"]][0]:
            latest_tier[row["user_id"]] = (row["updated_at"], row["tier"])
    expected = sorted(
        (e["order_id"], names[e["order_id"]], latest_tier[e["user_id"]][1], round(e["amount"] * e["price"], 6))
        for e in order_stats.events
        if e["amount"] * e["price"] >= 10
    )
    with open_client(settings.clickhouse_dsn) as client:
        got = sorted(
            (r[0], r[1], r[2], round(r[3], 6))
            for r in client.query(f"SELECT order_id, user_name, tier, total FROM {qualified_table(spec)}").result_rows
        )
    assert got == expected
    assert len(expected) < 400  # the WHERE filter removed some orders


def gold_rows(settings: Settings, spec: PipelineSpec) -> int:
    """Rows in the pipeline's gold table: it is made while the sources' queries run."""
    gold = open_table(gold_path(TableLayout(settings.warehouse, spec.name), spec))
    assert gold is not None
    return gold.to_pyarrow_table().num_rows


def test_a_failing_source_stops_the_run_and_is_named(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    """The sources' queries run side by side: one failing fails the run, names its source, stops the rest."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from riverhouse.platform.errors import PipelineError
    from riverhouse.platform.state.tables import bronze_schema

    topics = topics_for(topic)
    semantics_events(kafka, topics)
    spec = join_spec(topics, "left", name="broken")
    # users' bronze table exists with one more, required column: its first batch cannot be appended.
    wrong = bronze_schema(spec.sources["users"]).append(pa.field("_other", pa.int64(), nullable=False))
    write_deltalake(
        TableLayout(settings.warehouse, spec.name).bronze("users"), wrong.empty_table(), partition_by=["_event_date"]
    )
    with pytest.raises(PipelineError, match="source 'users'"):
        Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)
    assert [q.name for q in spark.streams.active if q.name and "broken" in q.name] == []
    # Nothing of the join was published: gold (made while the sources ran) holds no row.
    assert gold_rows(settings, spec) == 0


def test_a_source_that_cannot_start_stops_the_one_that_did(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    """The sources' queries start side by side: one failing to start is named, and the other is stopped."""
    from riverhouse.platform.errors import PipelineError

    topics = topics_for(topic)
    semantics_events(kafka, topics)
    spec = join_spec(topics, "left", name="nostart")
    # The users query's checkpoint holds a metadata file Spark cannot read, so Spark refuses to start it.
    metadata = checkpoint_dir(settings, spec.name, "users") / "spark" / "metadata"
    metadata.parent.mkdir(parents=True)
    metadata.write_text("{not json")
    with pytest.raises(PipelineError, match=r"source 'users'"):
        Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)
    assert [q.name for q in spark.streams.active if q.name and "nostart" in q.name] == []  # orders' was stopped
    assert gold_rows(settings, spec) == 0
