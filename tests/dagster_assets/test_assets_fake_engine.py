"""The Dagster layer alone, on a test double of the Riverhouse resource (no Kafka, Spark or ClickHouse).

What could break here is the wiring: which window each asset hands the engine (None in a
stream run, the partition's window in a backfill), what a stream run's silver step gets
from this run's ingest, config reaching the engine, blocking checks stopping the load, and
the sensor's decisions on the engine's lag.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from riverhouse.assets import build_pipeline_assets
from riverhouse.assets.orchestration import lag_sensor
from riverhouse.assets.pipelines import MODE_TAG, live_partition_key
from riverhouse.demo import check_results, materialization_metadata
from riverhouse.platform.spec import OrchestrationSpec, SensorSpec, load_spec
from tests.conftest import REPO
from tests.dagster_assets.fake_engine import FakeRiverhouse

pytestmark = pytest.mark.dagster

DEDUP = REPO / "pipelines" / "orders_dedup.yaml"
JOIN = REPO / "pipelines" / "orders_enriched.yaml"
DAY = "2026-01-02T00:00:00+00:00/2026-01-03T00:00:00+00:00"


def run(
    spec: Any,
    engine: FakeRiverhouse,
    partition_key: str | None = None,
    tags: dict[str, str] | None = None,
    selection: Any = None,
    run_config: dict[str, Any] | None = None,
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        build_pipeline_assets(spec),
        resources={"riverhouse": engine},
        selection=selection,
        partition_key=partition_key or live_partition_key(spec),
        tags=tags or {},
        run_config=run_config or {},
        raise_on_error=False,
    )


def partitioned(spec: Any) -> dg.AssetSelection:
    """Silver of every source, gold and ClickHouse: what a backfill of a partition selects."""
    silver = [dg.AssetKey(["silver", spec.name, source]) for source in spec.sources]
    tables = [dg.AssetKey([layer, spec.name, spec.sink.table]) for layer in ("gold", "clickhouse")]
    return dg.AssetSelection.assets(*silver, *tables)


def test_a_stream_run_publishes_what_this_runs_ingest_wrote() -> None:
    spec = load_spec(DEDUP)
    result = run(spec, FakeRiverhouse(), tags={MODE_TAG: "stream"})
    assert result.success
    meta = materialization_metadata(result)
    silver = meta[f"silver/{spec.name}/orders"]
    assert silver["window"] == "none"
    assert silver["ingested_records"] == 10  # the ingest step's metadata of this very run
    assert meta[f"clickhouse/{spec.name}/{spec.sink.table}"]["window"] == "none"
    assert meta[f"bronze/{spec.name}/orders"]["records_in"] == 10
    assert meta[f"quarantine/{spec.name}/orders"]["quarantined"] == 1
    assert all(check_results(result).values()) and len(check_results(result)) == 4


def test_without_a_mode_tag_a_run_with_the_ingest_is_a_stream_run() -> None:
    spec = load_spec(DEDUP)
    result = run(spec, FakeRiverhouse(), partition_key="2026-01-02")
    assert result.success
    assert materialization_metadata(result)[f"silver/{spec.name}/orders"]["window"] == "none"


def test_a_partition_without_the_ingest_rebuilds_its_window_and_config_reaches_the_engine() -> None:
    spec = load_spec(JOIN)
    gold_op = "__".join(["gold", spec.name, spec.sink.table])
    result = run(
        spec,
        FakeRiverhouse(),
        partition_key="2026-01-02",
        selection=partitioned(spec),
        run_config={"ops": {gold_op: {"config": {"drain": True}}}},
    )
    assert result.success
    meta = materialization_metadata(result)
    assert not any(key.startswith("bronze/") for key in meta)
    for source in spec.sources:
        assert meta[f"silver/{spec.name}/{source}"]["window"] == DAY
        assert meta[f"silver/{spec.name}/{source}"]["ingested_records"] == -1
    assert meta[f"gold/{spec.name}/{spec.sink.table}"] == {"window": DAY, "drain": True}
    assert meta[f"clickhouse/{spec.name}/{spec.sink.table}"]["window"] == DAY


def test_a_joins_sources_are_ingested_in_one_step_and_a_selection_reads_its_sources_only() -> None:
    spec = load_spec(JOIN)
    result = run(spec, FakeRiverhouse(), tags={MODE_TAG: "stream"})
    assert result.success
    ingest_steps = {e.step_key for e in result.all_events if e.is_step_start and e.step_key.startswith("ingest_")}
    assert ingest_steps == {f"ingest_{spec.name}"}  # both sources, side by side in one step
    meta = materialization_metadata(result)
    for source in spec.sources:
        assert meta[f"bronze/{spec.name}/{source}"]["source"] == source
        assert meta[f"silver/{spec.name}/{source}"]["ingested_records"] == 10
    assert {f"{s}_rejected_rate_is_below_0_05" for s in spec.sources} <= set(check_results(result))
    # One source's bronze alone: only that source is read, and only its check runs.
    bronze = dg.AssetKey(["bronze", spec.name, "user_events"])
    alone = dg.materialize(
        build_pipeline_assets(spec),
        resources={"riverhouse": FakeRiverhouse()},
        selection=[bronze],
        raise_on_error=False,
    )
    assert alone.success
    assert set(materialization_metadata(alone)) == {f"bronze/{spec.name}/user_events"}
    assert set(check_results(alone)) == {"user_events_rejected_rate_is_below_0_05"}


def test_the_rebuild_tag_rebuilds_even_with_the_ingest_in_the_run() -> None:
    spec = load_spec(DEDUP)
    result = run(spec, FakeRiverhouse(), partition_key="2026-01-02", tags={MODE_TAG: "rebuild"})
    assert result.success
    assert materialization_metadata(result)[f"clickhouse/{spec.name}/{spec.sink.table}"]["window"] == DAY


def test_a_failing_blocking_silver_check_stops_the_clickhouse_load() -> None:
    spec = load_spec(DEDUP)
    result = run(spec, FakeRiverhouse(failing=["silver"]), tags={MODE_TAG: "stream"})
    assert not result.success
    meta = materialization_metadata(result)
    assert f"silver/{spec.name}/orders" in meta
    assert f"clickhouse/{spec.name}/{spec.sink.table}" not in meta
    assert check_results(result)["orders_passes_expectations"] is False


def test_the_lag_sensor_decides_on_the_engines_lag() -> None:
    spec = load_spec(DEDUP)
    spec = spec.model_copy(update={"orchestration": OrchestrationSpec(sensor=SensorSpec(min_lag=3))})
    sensor = lag_sensor(spec)

    def tick(lag: int) -> Any:
        with dg.build_sensor_context(
            resources={"riverhouse": FakeRiverhouse(lag=lag)}, instance=dg.DagsterInstance.ephemeral()
        ) as context:
            return sensor(context)

    idle = tick(0)
    assert isinstance(idle, dg.SkipReason) and "no new records" in idle.skip_message
    waiting = tick(5)
    assert isinstance(waiting, dg.RunRequest)
    assert waiting.tags["riverhouse/lag"] == "5" and waiting.tags[MODE_TAG] == "stream"
    assert waiting.run_key == f"{spec.name}@{spec.sink_source.topic}/0=5"
