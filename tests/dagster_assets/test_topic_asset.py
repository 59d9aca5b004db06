"""Dagster: a Kafka sink is a topic asset downstream of silver/gold, with its check; backfills reach it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from riverhouse.assets import build_pipeline_assets
from riverhouse.demo import check_results, materialization_metadata
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import order, orders_spec_data, produce
from tests.dagster_assets.fake_engine import FakeRiverhouse
from tests.dagster_assets.test_definitions import materialize
from tests.integration.test_topic_sink import committed_records

pytestmark = pytest.mark.dagster


def both_sinks(topic: str, name: str) -> Any:
    data = orders_spec_data(topic, name=name)
    data["quality"] = {"max_rejected_rate": 0.5}
    data["sinks"] = [data.pop("sink"), {"kind": "kafka", "topic": f"{topic}.clean", "key": ["order_id"]}]
    return parse_spec(data)


def test_topic_asset_lineage_and_check() -> None:
    spec = both_sinks("t_orders", "dg_topic_graph")
    assets = build_pipeline_assets(spec)
    graph = dg.Definitions(assets=assets, resources={"riverhouse": FakeRiverhouse()}).resolve_asset_graph()
    key = dg.AssetKey(["topic", spec.name, "t_orders_clean"])
    node = graph.get(key)
    assert node.kinds == {"kafka"} and node.group_name == spec.name
    assert node.parent_keys == {dg.AssetKey(["silver", spec.name, "orders"])}
    assert isinstance(node.partitions_def, dg.TimeWindowPartitionsDefinition)
    assert {c.name for c in graph.asset_check_keys if c.asset_key == key} == {"t_orders_clean_matches_delta"}
    lineage = node.metadata["dagster/column_lineage"]
    assert lineage.deps_by_column["order_id"][0].asset_key == dg.AssetKey(["silver", spec.name, "orders"])
    assert "read_committed" in node.description
    # a topic as the only sink: no ClickHouse asset
    data = orders_spec_data("t_only", name="dg_topic_only")
    data["sink"] = {"kind": "kafka", "topic": "t_only_out"}
    only = parse_spec(data)
    only_assets = build_pipeline_assets(only)
    keys = dg.Definitions(assets=only_assets, resources={"riverhouse": FakeRiverhouse()}).resolve_all_asset_keys()
    assert dg.AssetKey(["topic", only.name, "t_only_out"]) in keys
    assert not any(k.path[0] == "clickhouse" for k in keys)


def test_stream_run_and_backfill_reach_the_topic(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    spec = both_sinks(topic, "dg_topic")
    out = f"{topic}.clean"
    produce(kafka, topic, [order("a", "2026-01-01T00:00:00Z"), order("a", "2026-01-01T00:00:00Z")])
    produce(kafka, topic, [order("b", "2026-01-01T00:01:00Z"), (b"x", b"garbage")])
    result = materialize(spec, settings)
    assert result.success
    meta = materialization_metadata(result)[f"topic/{spec.name}/{topic}_clean"]
    assert (meta["rows_produced"], meta["mode"], meta["ledger_topic"]) == (2, "stream", f"riverhouse-ledger.{out}")
    assert check_results(result)[f"{topic}_clean_matches_delta"] is True
    assert sorted(r.key() for r in committed_records(kafka, out)) == [b"a", b"b"]

    # A row that should not be in silver (written past the pipeline), then a backfill of its day.
    path = TableLayout(settings.warehouse, spec.name).silver("orders")
    rows = open_table(path).to_pyarrow_dataset().to_table()
    stray = rows.filter(pa.compute.equal(rows.column("order_id"), "a"))
    stray = stray.set_column(stray.schema.get_field_index("order_id"), "order_id", pa.array(["stray"]))
    later = pa.array([datetime(2026, 1, 1, 0, 30, tzinfo=UTC)], stray.schema.field("_event_time").type)
    stray = stray.set_column(stray.schema.get_field_index("_event_time"), "_event_time", later)
    write_deltalake(path, stray, mode="append")

    topic_key = dg.AssetKey(["topic", spec.name, f"{topic}_clean"])
    silver_key = dg.AssetKey(["silver", spec.name, "orders"])
    backfill = materialize(
        spec, settings, selection=dg.AssetSelection.keys(silver_key, topic_key), partition_key="2026-01-01"
    )
    assert backfill.success
    meta = materialization_metadata(backfill)[f"topic/{spec.name}/{topic}_clean"]
    assert meta["mode"] == "rebuild" and meta["window"].startswith("2026-01-01T00:00:00+00:00/")
    assert check_results(backfill)[f"{topic}_clean_matches_delta"] is True
    records = committed_records(kafka, out)
    rebuilt = sorted(r.key() for r in records if "riverhouse.rebuild" in dict(r.headers()))
    assert rebuilt == [b"a", b"b"]  # the day's rows again, as the backfill left them: the stray row is gone
    assert sorted(r.key() for r in records if "riverhouse.rebuild" not in dict(r.headers())) == [b"a", b"b", b"stray"]
