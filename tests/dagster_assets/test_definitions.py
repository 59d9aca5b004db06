"""Dagster: definitions load, materializing the pipeline runs it for real, checks gate the load."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from riverhouse.assets import build_pipeline_assets
from riverhouse.assets.pipelines import MODE_TAG, RUN_BUDGET, live_partition_key
from riverhouse.definitions import build_definitions
from riverhouse.demo import check_results, materialization_metadata
from riverhouse.platform.sink.clickhouse import table_stats
from riverhouse.platform.spec import QualitySpec, load_spec, load_specs
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from riverhouse.resources import resources_from_settings
from tests.conftest import REPO, order, orders_spec, produce

pytestmark = pytest.mark.dagster


def test_definitions_load_with_lineage_kinds_and_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIVERHOUSE_PIPELINES", str(REPO / "pipelines"))
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    specs = load_specs(REPO / "pipelines")
    for spec in specs:
        for source in spec.sources:
            kafka_key = dg.AssetKey(["kafka", spec.name, source])
            bronze = dg.AssetKey(["bronze", spec.name, source])
            silver = dg.AssetKey(["silver", spec.name, source])
            assert graph.get(kafka_key).kinds == {"kafka"}
            assert graph.get(bronze).kinds == {"spark", "delta"}
            assert kafka_key in graph.get(bronze).parent_keys
            assert bronze in graph.get(silver).parent_keys
            assert graph.get(silver).group_name == spec.name
        sink = dg.AssetKey(["clickhouse", spec.name, spec.sink.table])
        assert graph.get(sink).kinds == {"clickhouse"}
        if not spec.is_join:
            assert dg.AssetKey(["silver", spec.name, spec.sink_source_name]) in graph.get(sink).parent_keys
        assert defs.resolve_job_def(f"{spec.name}_job") is not None
        if spec.is_join:
            gold = dg.AssetKey(["gold", spec.name, spec.sink.table])
            # Lineage: every source's topic flows into the joined table.
            assert graph.get(gold).parent_keys == {dg.AssetKey(["silver", spec.name, s]) for s in spec.sources}
            assert gold in graph.get(sink).parent_keys
    check_names = {key.name for key in graph.asset_check_keys}
    assert {
        "orders_has_unique_keys_within_window",
        "orders_matches_delta",
        "orders_passes_expectations",
        "orders_rejected_rate_is_below_0_05",
    } <= check_names
    for spec in specs:
        assert defs.resolve_sensor_def(f"{spec.name}_kafka_lag_sensor") is not None
        assert defs.resolve_job_def(f"{spec.name}_continuous_job") is not None
        silver = graph.get(dg.AssetKey(["silver", spec.name, next(iter(spec.sources))]))
        assert isinstance(silver.partitions_def, dg.TimeWindowPartitionsDefinition)
        assert graph.get(dg.AssetKey(["clickhouse", spec.name, spec.sink.table])).owners == list(spec.owners)
    for key in graph.get_all_asset_keys():
        assert graph.get(key).description, f"{key} has no description"


def test_table_assets_carry_dagsters_table_conventions(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """dagster/table_name (Delta by path as Spark names it, ClickHouse as database.table), a code
    reference to the line of the spec that declares the table, and freshness from the sensor."""
    monkeypatch.setenv("RIVERHOUSE_PIPELINES", str(REPO / "pipelines"))
    settings = Settings.from_env(tmp_path / "home").with_(clickhouse_dsn="http://127.0.0.1:8123/analytics")
    graph = build_definitions(settings=settings).resolve_asset_graph()
    for path in sorted((REPO / "pipelines").glob("*.yaml")):
        spec = load_spec(path)
        lines = path.read_text().splitlines()
        layout = TableLayout(settings.warehouse, spec.name)
        silver = graph.get(dg.AssetKey(["silver", spec.name, next(iter(spec.sources))]))
        assert silver.metadata["dagster/table_name"] == f"delta.`{layout.silver(next(iter(spec.sources)))}`"
        [ref] = silver.metadata["dagster/code_references"].code_references
        assert ref.file_path == str(path.resolve()) and lines[ref.line_number - 1].startswith("sources:")
        sink = graph.get(dg.AssetKey(["clickhouse", spec.name, spec.sink.table]))
        database = spec.sink.database or "analytics"  # a sink without one lands in the DSN's database
        assert sink.metadata["dagster/table_name"] == f"{database}.{spec.sink.table}"
        [ref] = sink.metadata["dagster/code_references"].code_references
        assert lines[ref.line_number - 1].startswith(("sink:", "sinks:")), lines[ref.line_number - 1]
        sensor = spec.orchestration.sensor
        assert sink.freshness_policy.fail_window.to_timedelta() == sensor.max_delay + sensor.interval + RUN_BUDGET
        # Freshness is what the sink promises; the layers before it carry none.
        assert silver.freshness_policy is None


def materialize(
    spec: Any,
    settings: Settings,
    selection: Any = None,
    partition_key: str | None = None,
    instance: dg.DagsterInstance | None = None,
) -> dg.ExecuteInProcessResult:
    """A stream run (or, with `partition_key`, a rebuild run of that partition)."""
    return dg.materialize(
        build_pipeline_assets(spec, settings),
        resources=resources_from_settings(settings),
        selection=selection,
        partition_key=partition_key or live_partition_key(spec),
        tags={MODE_TAG: "rebuild" if partition_key else "stream"},
        raise_on_error=False,
        instance=instance,
    )


def tolerant(spec: Any, rate: float = 0.5) -> Any:
    return spec.model_copy(update={"quality": QualitySpec(max_rejected_rate=rate)})


def test_materialize_runs_the_pipeline_with_metadata(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    spec = tolerant(orders_spec(topic, name="dg_orders"))
    produce(
        kafka,
        topic,
        [
            order("a", "2026-01-01T00:00:00Z"),
            order("a", "2026-01-01T00:00:00Z"),
            order("b", "2026-01-01T00:01:00Z"),
            (b"x", b"garbage"),
        ],
    )
    instance = dg.DagsterInstance.ephemeral()
    result = materialize(spec, settings, instance=instance)
    assert result.success
    meta = materialization_metadata(result)
    bronze = meta["bronze/dg_orders/orders"]
    assert (bronze["records_in"], bronze["inserted"], bronze["duplicates_dropped"], bronze["quarantined"]) == (
        4,
        2,
        1,
        1,
    )
    assert bronze["lag_before"] == 4  # what Kafka held beyond the committed offsets
    assert meta["silver/dg_orders/orders"]["inserted"] == 2
    assert meta["silver/dg_orders/orders"]["mode"] == "stream"
    assert meta["clickhouse/dg_orders/dg_orders_orders"]["rows_loaded"] == 2
    assert meta["silver/dg_orders/orders"]["dagster/row_count"] == 2
    assert meta["clickhouse/dg_orders/dg_orders_orders"]["dagster/row_count"] == 2
    # Launched for today's partition, the run wrote 2026-01-01's: both are materialized, no other day.
    for key in (["silver", "dg_orders", "orders"], ["clickhouse", "dg_orders", "dg_orders_orders"]):
        materialized = instance.get_materialized_partitions(dg.AssetKey(key))
        assert materialized == {"2026-01-01", live_partition_key(spec)}, (key, materialized)
    assert bronze["end_offsets"]  # Kafka offsets reached
    assert check_results(result) == {
        "orders_has_unique_keys_within_window": True,
        "orders_passes_expectations": True,
        "orders_rejected_rate_is_below_0_5": True,
        "dg_orders_orders_matches_delta": True,
    }

    again = materialize(spec, settings)
    assert again.success
    meta = materialization_metadata(again)
    assert meta["bronze/dg_orders/orders"]["records_in"] == 0
    assert meta["clickhouse/dg_orders/dg_orders_orders"]["rows_loaded"] == 0
    assert meta["clickhouse/dg_orders/dg_orders_orders"]["dagster/row_count"] == 2
    assert table_stats(settings.clickhouse_dsn, spec)["rows"] == 2


def test_failing_blocking_check_stops_the_clickhouse_load(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    spec = orders_spec(topic, name="dg_blocked")
    produce(kafka, topic, [order("a", "2026-01-01T00:00:00Z"), order("b", "2026-01-01T00:00:00Z")])
    sink_key = dg.AssetKey(["clickhouse", spec.name, spec.sink.table])
    first = materialize(spec, settings, selection=dg.AssetSelection.all() - dg.AssetSelection.keys(sink_key))
    assert first.success
    # Crafted bad data, written straight into silver: a second "a" ten minutes later; and a "b"
    # twice on 2026-01-03, where nothing the next run writes is within the window (1 h) of it.
    path = TableLayout(settings.warehouse, spec.name).silver("orders")
    table = open_table(path)
    rows = table.to_pyarrow_dataset().to_table()

    def copy_of(order_id: str, at: datetime) -> pa.Table:
        row = rows.filter(pa.compute.equal(rows.column("order_id"), order_id))
        moved = {"_event_time": pa.array([at], row.schema.field("_event_time").type)}
        moved["_event_date"] = pa.array([at.date()], row.schema.field("_event_date").type)
        for name, value in moved.items():
            row = row.set_column(row.schema.get_field_index(name), name, value)
        return row

    far = datetime(2026, 1, 3, 0, 0, tzinfo=UTC)
    bad = pa.concat_tables(
        [
            copy_of("a", datetime(2026, 1, 1, 0, 10, tzinfo=UTC)),
            copy_of("b", far),
            copy_of("b", far + timedelta(minutes=5)),
        ]
    )
    write_deltalake(table, bad, mode="append")
    # The next run writes 2026-01-01 again: the check reads what it wrote +- the window, not all of silver.
    produce(kafka, topic, [order("c", "2026-01-01T00:30:00Z")])

    result = materialize(spec, settings)
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    failed = checks["orders_has_unique_keys_within_window"]
    assert not failed.passed
    assert failed.metadata["duplicate_rows"].value == 1  # "a"; the "b" pair is outside what was checked
    assert "'a'" in str(failed.metadata["sample"].value) and "'b'" not in str(failed.metadata["sample"].value)
    loaded = [k for k in materialization_metadata(result) if k.startswith("clickhouse/")]
    assert loaded == []  # the blocking check stopped the load


def test_materialize_join_pipeline_with_drain(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    from riverhouse.demo import materialize_pipeline
    from tests.integration.test_joins import join_spec, o, topics_for, u

    topics = topics_for(topic)
    produce(kafka, topics["users"], [u("e1", "u1", "Ann", "10:00"), u("e1", "u1", "Ann", "10:00")])
    produce(kafka, topics["orders"], [o("o1", "u1", "10:10"), o("o2", "u2", "10:10")])
    spec = join_spec(topics, "left", name="dg_join")
    result = materialize_pipeline(spec, settings, drain=True)
    assert result.success
    gold = materialization_metadata(result)["gold/dg_join/dg_join_out"]
    assert (gold["processed"], gold["emitted"], gold["unmatched_left"]) == (2, 2, 1)
    assert gold["join_hit_rate"] == 0.5
    assert gold["dagster/row_count"] == 2  # the gold table after the step: both driving orders, emitted once
    assert materialization_metadata(result)["clickhouse/dg_join/dg_join_out"]["rows_loaded"] == 2
    assert check_results(result)["dg_join_out_has_one_row_per_left_event"] is True
