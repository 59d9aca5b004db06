"""The Delta tables Riverhouse creates: every kind checkpoints its log every 100 commits, not Delta's 10.

A checkpoint is written by the batch whose commit reaches the interval: Delta rebuilds the table's
state with a Spark job and rewrites it as Parquet, seconds inside that batch (measured on
quarantine: a small batch took 7.6 s where the others took 3-4 s). Read from the log each creation wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.gold.joins import ensure_gold_tables, gold_path, gold_quarantine_path
from riverhouse.platform.ingest.stream import ensure_source_tables
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout
from tests.conftest import orders_spec
from tests.integration.test_joins import join_spec

pytestmark = pytest.mark.spark


def interval(path: str) -> str | None:
    return DeltaLog(path).metadata().get("configuration", {}).get("delta.checkpointInterval")


def test_every_table_checkpoints_every_100_commits(spark: Any, tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home")
    spec = orders_spec("props_orders")
    layout = TableLayout(settings.warehouse, spec.name)
    ensure_source_tables(spark, spec, layout, spec.sink_source_name)
    source = spec.sink_source_name
    for path in (layout.bronze(source), layout.quarantine(source), layout.silver(source)):
        assert interval(path) == "100", path
    joined = join_spec({"orders": "props_orders", "users": "props_users"}, "left", name="props_join")
    gold_layout = TableLayout(settings.warehouse, joined.name)
    ensure_gold_tables(spark, joined, gold_layout)
    for path in (gold_path(gold_layout, joined), gold_quarantine_path(gold_layout, joined)):
        assert interval(path) == "100", path


def stats_columns(path: str) -> str | None:
    return DeltaLog(path).metadata().get("configuration", {}).get("delta.dataSkippingStatsColumns")


AVRO_KEYED = {"type": "record", "name": "R", "fields": [{"name": "k", "type": "string"}, {"name": "n", "type": "long"}]}


@pytest.mark.parametrize(
    ("key_type", "avro", "stats"),
    [("string", False, True), ("long", False, True), ("timestamp", False, False), ("string", True, True)],
)
def test_silver_keeps_statistics_of_a_key_whose_range_narrows_the_lookup(
    spark: Any, tmp_path: Path, key_type: str, avro: bool, stats: bool
) -> None:
    """A string or integer dedup key, JSON's or Avro's, gets min/max statistics in silver (the ingest
    reads only the files whose key range overlaps a batch's); a key of another type does not pay
    for them."""
    from riverhouse.platform.spec import parse_spec

    source: dict[str, Any] = {
        "topic": "t",
        "key": ["k"],
        "fields": [{"name": "k", "type": key_type}, {"name": "n", "type": "long"}],
        "dedup": {"window": "1h"},
    }
    if avro:
        source.update(format="avro", avro_schema=AVRO_KEYED, schema_registry={"url": "http://127.0.0.1:1"})
        del source["fields"]
    spec = parse_spec(
        {
            "name": f"props_key_{key_type}_{'avro' if avro else 'json'}",
            "sources": {"s": source},
            "sink": {"table": "t", "order_by": ["k"]},
        }
    )
    layout = TableLayout(Settings.from_env(tmp_path / "home").warehouse, spec.name)
    ensure_source_tables(spark, spec, layout, "s")
    expected = "_event_time,_kafka_timestamp" + (",k" if stats else "")
    assert stats_columns(layout.silver("s")) == expected
    assert stats_columns(layout.bronze("s")) == "_event_time"
