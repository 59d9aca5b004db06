"""An event whose values make the join's query fail (ANSI mode) is rejected with the error; the others go on.

Before, a division by zero on one closed event failed every gold run from then on with Spark's
stack trace: the pipeline stopped at that event for good.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.errors import PipelineError
from riverhouse.platform.gold.joins import gold_path, gold_quarantine_path, run_gold
from riverhouse.platform.gold.rebuild import rebuild_gold
from riverhouse.platform.spec import PipelineSpec, parse_spec
from riverhouse.platform.state.delta_spark import table_version
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout
from tests.integration.test_joins import ORDER_FIELDS, USER_FIELDS
from tests.spark.test_gold_run import append, at, order, user

pytestmark = pytest.mark.spark


def spec_with(select: str, name: str, **order_fields: str) -> PipelineSpec:
    return parse_spec(
        {
            "name": name,
            "sources": {
                "orders": {"topic": f"{name}_o", "fields": {**ORDER_FIELDS, **order_fields}, "key": ["order_id"], "event_time": {"field": "created_at"}},
                "users": {"topic": f"{name}_u", "fields": USER_FIELDS, "key": ["event_id"], "event_time": {"field": "created_at"}},
            },
            "query": f"SELECT o.order_id, {select}, u.name AS user_name FROM orders o LEFT JOIN users u ON o.user_id = u.uid",
            "state": {"ttl": "1h"},
            "sink": {"table": f"{name}_out", "order_by": ["order_id"]},
        }
    )  # fmt: skip


def rows_of(spark: Any, path: str, *columns: str) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in spark.read.format("delta").load(path).select(*columns).collect()), key=str)


def test_events_the_query_fails_on_are_rejected_with_the_error_and_the_rest_emitted(spark: Any, tmp_path: Path) -> None:
    # A map among the outputs: Spark cannot hash one, and the search must still compute every column.
    spec = spec_with("100 / o.amount AS per_unit, o.attrs AS attrs", "poison_div", attrs="map<string,string>")
    settings = Settings.from_env(tmp_path / "home")
    layout = TableLayout(settings.warehouse, spec.name)
    amounts = {"o1": 4, "o2": 0, "o3": 5, "o4": 0, "o5": 10}
    orders = [
        {**order(oid, "u1", f"10:{i:02d}"), "amount": amount, "attrs": {"k": oid}}
        for i, (oid, amount) in enumerate(amounts.items())
    ]
    append(spark, spec, layout, "users", [user("e1", "u1", "A", "10:00")], 0)
    append(spark, spec, layout, "orders", orders, 0)

    result = run_gold(spark, spec, settings, drain=True)
    gold = gold_path(layout, spec)
    assert (result.processed, result.emitted, result.rejected) == (5, 3, 2)
    # A rejected event's query columns are NULL (its values were not read); `_left_key` names it.
    assert [r[0] for r in rows_of(spark, gold, "attrs")] == [None, None, {"k": "o1"}, {"k": "o3"}, {"k": "o5"}]
    assert rows_of(spark, gold, "_left_key", "_status", "order_id", "per_unit") == [
        ("o1", "emitted", "o1", 25.0),
        ("o2", "rejected", None, None),
        ("o3", "emitted", "o3", 20.0),
        ("o4", "rejected", None, None),
        ("o5", "emitted", "o5", 10.0),
    ]
    quarantined = rows_of(spark, gold_quarantine_path(layout, spec), "_left_key", "_left_offset", "_reason")
    assert [q[:2] for q in quarantined] == [("o2", 1), ("o4", 3)]
    assert {q[2] for q in quarantined} == {
        "the query fails on this event: [DIVIDE_BY_ZERO] Division by zero. Use `try_divide` to tolerate divisor "
        "being 0 and return NULL instead."  # Spark's advice to turn ANSI mode off is left out
    }

    # Nothing is pending: the next run joins nothing and writes nothing.
    version = table_version(gold)
    again = run_gold(spark, spec, settings, drain=True)
    assert again.processed == 0 and table_version(gold) == version

    # A backfill of the window joins them again with the same outcome: nothing changes.
    rebuilt = rebuild_gold(spark, spec, settings, at("09:00"), at("12:00"), log=lambda m: None)
    assert (rebuilt.rows, rebuilt.changed) == (5, False)


def test_a_query_that_fails_without_any_event_value_stops_with_a_clear_error(spark: Any, tmp_path: Path) -> None:
    # COALESCE turns the rejected events' NULLs into the zero again: no event can be singled out.
    spec = spec_with("100 / COALESCE(o.amount, 0) AS per_unit", "poison_all")
    settings = Settings.from_env(tmp_path / "home")
    layout = TableLayout(settings.warehouse, spec.name)
    append(spark, spec, layout, "users", [user("e1", "u1", "A", "10:00")], 0)
    append(spark, spec, layout, "orders", [{**order("o1", "u1", "10:00"), "amount": 0}], 0)
    with pytest.raises(PipelineError, match=r"the query fails even where an event's values are NULL .*DIVIDE_BY_ZERO"):
        run_gold(spark, spec, settings, drain=True)
    assert table_version(gold_path(layout, spec)) == 0  # nothing written: gold as created
