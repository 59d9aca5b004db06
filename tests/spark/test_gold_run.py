"""A gold run in Spark over real Delta silver tables (no Kafka): rows, progress, idempotence.

The silver rows are what the ingest would have written for test_joins' semantics events;
the expected rows are written out by hand from the join's rules.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.gold.joins import STATE_RUN, STATE_VERSION, gold_app_id, gold_path, run_gold
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.delta_spark import table_version
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import (
    SILVER_PROPERTIES,
    TableLayout,
    ensure_delta_table,
    open_table,
    silver_schema,
    spark_schema,
)
from tests.integration.test_joins import join_spec

pytestmark = pytest.mark.spark
TOPICS = {"orders": "g_orders", "users": "g_users"}


def at(hhmm: str) -> datetime:
    return datetime.fromisoformat(f"2026-01-01T{hhmm}:00+00:00").astimezone(UTC)


def append(spark: Any, spec: Any, layout: TableLayout, source: str, rows: list[dict[str, Any]], first: int) -> None:
    schema = silver_schema(spec.sources[source])
    full = [
        {
            **row,
            "_event_time": row["created_at"],
            "_event_date": row["created_at"].date(),
            "_topic": spec.sources[source].topic,
            "_partition": 0,
            "_offset": first + i,
            "_kafka_timestamp": row.get("_kts", row["created_at"]),
            "_batch_id": first,
        }
        for i, row in enumerate(rows)
    ]
    ensure_delta_table(spark, layout.silver(source), schema, ["_event_date"], SILVER_PROPERTIES)
    frame = spark.createDataFrame([{k: r.get(k) for k in schema.names} for r in full], spark_schema(schema))
    frame.write.format("delta").mode("append").save(layout.silver(source))


def order(oid: str, user: str, hhmm: str) -> dict[str, Any]:
    return {"order_id": oid, "user_id": user, "amount": 1, "price": 2.0, "created_at": at(hhmm)}


def user(eid: str, uid: str, name: str, hhmm: str, kts: str | None = None) -> dict[str, Any]:
    row = {"event_id": eid, "uid": uid, "name": name, "created_at": at(hhmm)}
    return {**row, "_kts": at(kts)} if kts else row


def emitted(spark: Any, path: str) -> list[tuple[str, str | None]]:
    rows = spark.read.format("delta").load(path).where("_status = 'emitted'").select("order_id", "user_name")
    return sorted((r[0], r[1]) for r in rows.collect())


def test_a_drained_gold_run_joins_once_and_records_its_progress(spark: Any, tmp_path: Path) -> None:
    spec = join_spec(TOPICS, "left", name="gold_run")
    settings = Settings.from_env(tmp_path / "home")
    layout = TableLayout(settings.warehouse, spec.name)
    users = [
        user("e1", "u1", "A1", "10:00"),
        user("e2", "u1", "A2", "10:20"),  # the latest within o1's window
        user("e3", "u2", "B", "12:30"),  # outside o2's window
        user("e4", "u4", "D", "09:30"),  # before its order, inside the window
        user("e5", "u3", "C", "10:50", kts="11:59"),  # reached Kafka after o3: a late match
    ]
    orders = [
        order("o1", "u1", "10:30"),
        order("o2", "u2", "10:00"),
        order("o3", "u3", "10:40"),
        order("o4", "u4", "10:15"),
        order("o5", "u1", "11:45"),  # u1's versions are more than 1h before
    ]
    append(spark, spec, layout, "users", users, 0)
    append(spark, spec, layout, "orders", orders, 0)

    first = run_gold(spark, spec, settings, drain=True)
    assert (first.processed, first.emitted, first.matched, first.unmatched_left) == (5, 5, 3, 2)
    assert first.late_matches == 1
    path = gold_path(layout, spec)
    want = [("o1", "A2"), ("o2", None), ("o3", "C"), ("o4", "D"), ("o5", None)]
    assert emitted(spark, path) == want
    # The commit carries the progress and the run's mark (app id, run number).
    gold = open_table(path)
    meta = json.loads(gold.history(1)[0]["userMetadata"])
    assert meta[STATE_VERSION] == str(table_version(layout.silver("orders"))) and meta[STATE_RUN] == "1"
    assert DeltaLog(path).commit(gold.version()).batch_of(gold_app_id(spec)) == 1

    # Nothing new: nothing joined, no commit.
    version = table_version(path)
    again = run_gold(spark, spec, settings, drain=True)
    assert again.processed == 0 and table_version(path) == version

    # A new order (and a duplicate delivery of o1 under a new offset would be silver's to drop):
    # only the new one is joined, the earlier rows stay as they are.
    append(spark, spec, layout, "orders", [order("o6", "u2", "12:00")], 10)
    third = run_gold(spark, spec, settings, drain=True)
    assert (third.processed, third.matched) == (1, 1)
    assert emitted(spark, path) == sorted([*want, ("o6", "B")])
    assert DeltaLog(path).commit(DeltaLog(path).latest_version()).batch_of(gold_app_id(spec)) == 2


def gold_orders(spark: Any, path: str) -> list[str]:
    """Every order id gold holds, repeats included."""
    return sorted(r[0] for r in spark.read.format("delta").load(path).select("order_id").collect())


def test_pending_and_new_events_are_each_joined_once_also_after_a_silver_backfill(spark: Any, tmp_path: Path) -> None:
    """Runs without drain: an event left pending is read again from silver, new ones come from the
    change feed, those newer than the pending window from both reads of silver; a backfill that
    writes silver's rows again puts them in the change feed a second time."""
    spec = join_spec(TOPICS, "left", name="gold_pending")
    settings = Settings.from_env(tmp_path / "home")
    layout = TableLayout(settings.warehouse, spec.name)
    path = gold_path(layout, spec)
    append(spark, spec, layout, "users", [user("e1", "u1", "A", "10:00"), user("e2", "u9", "Z", "13:00")], 0)
    append(spark, spec, layout, "orders", [order("o1", "u1", "10:30"), order("o2", "u1", "12:00")], 0)
    # The watermark is 12:00 (orders' latest), so events up to 11:00 are closed: o2 stays pending.
    first = run_gold(spark, spec, settings)
    assert (first.processed, first.pending) == (1, 1)

    # Next run re-reads silver from 11:00 on. o3 is new and older than that, o4 new and newer.
    append(spark, spec, layout, "orders", [order("o3", "u1", "10:50"), order("o4", "u1", "11:30")], 10)
    append(spark, spec, layout, "orders", [order("o5", "u1", "14:00")], 20)
    append(spark, spec, layout, "users", [user("e3", "u9", "Z", "15:00")], 10)
    second = run_gold(spark, spec, settings)  # watermark 14:00: closed up to 13:00
    assert (second.processed, second.pending) == (3, 1)
    assert gold_orders(spark, path) == ["o1", "o2", "o3", "o4"]

    # A backfill rewrites the day's orders (the same rows): the change feed inserts them again.
    day = spark.read.format("delta").load(layout.silver("orders")).where("_event_date = '2026-01-01'")
    day = day.localCheckpoint()  # read before the overwrite replaces the files it reads
    day.write.format("delta").mode("overwrite").option("replaceWhere", "_event_date = '2026-01-01'").save(
        layout.silver("orders")
    )
    append(spark, spec, layout, "orders", [order("o6", "u1", "16:00")], 30)
    append(spark, spec, layout, "users", [user("e4", "u9", "Z", "17:00")], 20)
    third = run_gold(spark, spec, settings)  # watermark 16:00: o5 closes, o6 stays pending
    assert (third.processed, third.pending) == (1, 1)
    assert gold_orders(spark, path) == ["o1", "o2", "o3", "o4", "o5"]
    assert run_gold(spark, spec, settings, drain=True).processed == 1
    assert gold_orders(spark, path) == ["o1", "o2", "o3", "o4", "o5", "o6"]
