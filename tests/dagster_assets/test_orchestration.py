"""Sensors, schedules, Great Expectations checks and time-window backfills, for real."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from riverhouse.assets.orchestration import lag_sensor, pipeline_schedule
from riverhouse.demo import check_results, materialization_metadata
from riverhouse.platform.kafka.client import METADATA_TIMEOUT_S
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import OrchestrationSpec, SensorSpec, parse_spec
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from riverhouse.resources import resources_from_settings
from tests.conftest import order, orders_spec, produce
from tests.dagster_assets.test_definitions import materialize, tolerant

pytestmark = pytest.mark.dagster


def with_sensor(spec: Any, **sensor: Any) -> Any:
    orch = OrchestrationSpec(sensor=SensorSpec(**sensor))
    return spec.model_copy(update={"orchestration": orch})


def evaluate(sensor: dg.SensorDefinition, settings: Settings, cursor: str | None) -> tuple[Any, str | None]:
    with dg.build_sensor_context(
        cursor=cursor, resources=resources_from_settings(settings), instance=dg.DagsterInstance.ephemeral()
    ) as context:
        result = sensor(context)
        return result, context.cursor


def test_lag_sensor_requests_runs_by_lag_and_by_delay(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    spec = with_sensor(orders_spec(topic, name="sensed"), min_lag=5, max_delay="1h")
    sensor = lag_sensor(spec)
    produce(kafka, topic, [order("a", "2026-01-01T00:00:00Z")])  # creates the topic
    result, cursor = evaluate(sensor, settings, None)
    assert isinstance(result, dg.SkipReason)
    assert "1 records waiting (below min_lag 5)" in result.skip_message
    assert json.loads(cursor)["lag"] == 1

    produce(kafka, topic, [order(f"o{i}", "2026-01-01T00:00:00Z") for i in range(6)])
    result, cursor = evaluate(sensor, settings, cursor)
    assert isinstance(result, dg.RunRequest)
    assert result.tags["riverhouse/lag"] == "7" and result.tags["riverhouse/trigger"] == "min_lag"
    assert result.run_key.startswith("sensed@" + topic)
    assert result.partition_key == datetime.now(UTC).strftime("%Y-%m-%d")
    # Same end offsets, same run key: a second tick cannot start a second run for the same data.
    again, _ = evaluate(sensor, settings, cursor)
    assert again.run_key == result.run_key

    # Below min_lag, but the oldest record has waited longer than max_delay.
    slow = with_sensor(spec, min_lag=1000, max_delay="30s")
    stale = json.dumps({"pending_since": time.time() - 60})
    result, cursor = evaluate(lag_sensor(slow), settings, stale)
    assert isinstance(result, dg.RunRequest) and result.tags["riverhouse/trigger"] == "max_delay"
    assert json.loads(cursor)["pending_since"] is None

    # After a run has read everything, there is nothing to do.
    assert materialize(tolerant(spec), settings).success
    result, cursor = evaluate(sensor, settings, cursor)
    assert isinstance(result, dg.SkipReason) and "no new records" in result.skip_message


def test_lag_sensor_retries_the_offsets_of_a_failed_run(kafka: str, topic: str, settings: Settings) -> None:
    """A failed run (say, its worker was killed) is requested again under a new key, though nothing new arrived."""
    spec = with_sensor(orders_spec(topic, name="retried"), min_lag=1)
    sensor = lag_sensor(spec)
    produce(kafka, topic, [order(f"o{i}", "2026-01-01T00:00:00Z") for i in range(3)])
    instance = dg.DagsterInstance.ephemeral()

    def tick(cursor: str | None) -> tuple[Any, str | None]:
        resources = resources_from_settings(settings)
        with dg.build_sensor_context(cursor=cursor, resources=resources, instance=instance) as context:
            return sensor(context), context.cursor

    first, cursor = tick(None)
    assert isinstance(first, dg.RunRequest) and "#retry" not in first.run_key

    @dg.op
    def killed() -> None:
        raise RuntimeError("the run worker was killed")

    @dg.job
    def stand_in() -> None:
        killed()

    # A run that carries the requested key and failed, as the daemon records one.
    stand_in.execute_in_process(instance=instance, tags={"dagster/run_key": first.run_key}, raise_on_error=False)
    retry, cursor = tick(cursor)
    assert isinstance(retry, dg.RunRequest) and retry.run_key == first.run_key + "#retry1"
    # The retry itself still running or done: the same key again, never a third run of these offsets.
    again, _ = tick(cursor)
    assert again.run_key == retry.run_key


def test_lag_sensor_reports_unreachable_kafka(settings: Settings, topic: str) -> None:
    spec = orders_spec(topic, name="sensed_down")
    down = settings.with_(kafka_bootstrap="127.0.0.1:9")  # nothing listens on the discard port
    started = time.monotonic()
    result, _ = evaluate(lag_sensor(spec), down, None)
    assert isinstance(result, dg.SkipReason)
    assert "Kafka is unreachable" in result.skip_message and "Connection refused" in result.skip_message
    # A closed port is an answer: the tick skips without waiting out the metadata timeout.
    assert time.monotonic() - started < METADATA_TIMEOUT_S, result.skip_message


def test_schedule_requests_a_stream_run_for_its_tick(topic: str) -> None:
    spec = orders_spec(topic, name="scheduled")
    spec = spec.model_copy(update={"orchestration": OrchestrationSpec(schedule="*/15 * * * *")})
    schedule = pipeline_schedule(spec)
    assert schedule is not None and schedule.cron_schedule == "*/15 * * * *"
    tick = datetime(2026, 1, 2, 3, 15, tzinfo=UTC)
    request = schedule(dg.build_schedule_context(scheduled_execution_time=tick))
    assert request.partition_key == "2026-01-02"
    assert request.tags["riverhouse/mode"] == "stream"
    assert request.run_key == f"scheduled@{tick.isoformat()}"
    assert pipeline_schedule(orders_spec(topic)) is None  # no cron, no schedule


def test_gx_check_fails_on_out_of_range_values_and_stops_the_load(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    base = orders_spec(topic, name="gx_ranges")
    data = base.model_dump(mode="json", exclude_none=True)
    data["sources"]["orders"]["fields"] = [
        {**f, "min": 1, "max": 100} if f["name"] == "amount" else f for f in data["sources"]["orders"]["fields"]
    ]
    spec = parse_spec(data)
    produce(
        kafka, topic, [order("a", "2026-01-01T00:00:00Z", amount=5), order("b", "2026-01-01T00:00:00Z", amount=500)]
    )
    result = materialize(spec, settings)
    assert not result.success
    evaluation = {e.check_name: e for e in result.get_asset_check_evaluations()}["orders_passes_expectations"]
    assert not evaluation.passed
    failures = evaluation.metadata["failures"].value
    assert failures[0]["expectation"] == "expect_column_values_to_be_between"
    assert failures[0]["column"] == "amount" and failures[0]["sample"] == ["500"]
    assert not [k for k in materialization_metadata(result) if k.startswith("clickhouse/")]
    assert evaluation.metadata["rows_validated"].value == 2

    # The suite runs on Spark over what the step wrote: a second run's one new row, not silver's three.
    produce(kafka, topic, [order("c", "2026-01-01T00:01:00Z", amount=7)])
    again = {e.check_name: e for e in materialize(spec, settings).get_asset_check_evaluations()}
    assert again["orders_passes_expectations"].passed
    assert again["orders_passes_expectations"].metadata["rows_validated"].value == 1


def test_rejected_rate_check_stops_a_run_full_of_garbage(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    spec = orders_spec(topic, name="gx_rejects")
    produce(kafka, topic, [order("a", "2026-01-01T00:00:00Z"), (b"x", b"garbage"), (b"y", b"{")])
    result = materialize(spec, settings)
    assert not result.success
    assert check_results(result)["orders_rejected_rate_is_below_0_05"] is False
    keys = materialization_metadata(result)
    assert "silver/gx_rejects/orders" not in keys and not [k for k in keys if k.startswith("clickhouse/")]


def _ch_rows(settings: Settings, spec: Any) -> list[tuple[str, str]]:
    with open_client(settings.clickhouse_dsn) as client:
        return sorted(client.query(f"SELECT order_id, toString(_event_date) FROM {qualified_table(spec)}").result_rows)


def test_backfill_rebuilds_exactly_its_window_and_is_idempotent(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    spec = orders_spec(topic, name="backfilled")
    start = datetime(2026, 1, 1, 23, 40, tzinfo=UTC)
    events, expected = [], {}
    for i in range(60):  # one event a minute across midnight, a duplicate of every 4th
        ts = start + timedelta(minutes=i)
        events.append(order(f"o{i}", ts.isoformat().replace("+00:00", "Z"), amount=i + 1))
        expected[f"o{i}"] = ts.date().isoformat()
        if i % 4 == 0:
            events.append(order(f"o{i}", (ts + timedelta(minutes=3)).isoformat().replace("+00:00", "Z")))
    produce(kafka, topic, events)
    instance = dg.DagsterInstance.ephemeral()
    assert materialize(spec, settings, instance=instance).success
    want = sorted(expected.items())
    assert _ch_rows(settings, spec) == want
    # The stream run wrote both days: neither looks missing (nor would "Materialize missing" rebuild it).
    written = instance.get_materialized_partitions(dg.AssetKey(["clickhouse", spec.name, spec.sink.table]))
    assert {"2026-01-01", "2026-01-02"} <= written and "2026-01-03" not in written, written

    # Damage day 2 in both stores: its silver rows deleted, ClickHouse holding half of them.
    layout = TableLayout(settings.warehouse, spec.name)
    silver = open_table(layout.silver("orders"))
    day2 = silver.to_pyarrow_dataset().to_table(
        filter=pc.field("_event_date") == pa.scalar(datetime(2026, 1, 2).date(), pa.date32())
    )
    silver.delete("_event_date = '2026-01-02'")
    with open_client(settings.clickhouse_dsn) as client:
        client.command(
            f"ALTER TABLE {qualified_table(spec)} DELETE WHERE _event_date = '2026-01-02' "
            "AND toInt32(substring(order_id, 2)) % 2 = 0 SETTINGS mutations_sync = 1"
        )
    assert _ch_rows(settings, spec) != want

    selection = dg.AssetSelection.keys(
        dg.AssetKey(["silver", spec.name, "orders"]), dg.AssetKey(["clickhouse", spec.name, spec.sink.table])
    )
    result = materialize(spec, settings, selection=selection, partition_key="2026-01-02")
    assert result.success
    meta = materialization_metadata(result)
    assert meta["silver/backfilled/orders"]["mode"] == "rebuild"
    assert meta["silver/backfilled/orders"]["rows"] == day2.num_rows
    assert meta["silver/backfilled/orders"]["dagster/partition_row_count"] == day2.num_rows
    assert meta["silver/backfilled/orders"]["changed"] is True
    rebuilt = (
        open_table(layout.silver("orders"))
        .to_pyarrow_dataset()
        .to_table(filter=pc.field("_event_date") == pa.scalar(datetime(2026, 1, 2).date(), pa.date32()))
    )
    key = ["_topic", "_partition", "_offset"]
    assert (
        rebuilt.select(key)
        .sort_by([(k, "ascending") for k in key])
        .equals(day2.select(key).sort_by([(k, "ascending") for k in key]))
    )
    assert _ch_rows(settings, spec) == want
    assert meta[f"clickhouse/backfilled/{spec.sink.table}"]["dagster/row_count"] == len(want)
    assert check_results(result)["backfilled_orders_matches_delta"] is True
    # The expectations read the rebuilt window (day 2's rows as silver now holds them).
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["orders_passes_expectations"].metadata["rows_validated"].value == day2.num_rows
    version = open_table(layout.silver("orders")).version()

    # The same backfill again changes nothing: no new Delta version, the same ClickHouse rows.
    again = materialize(spec, settings, selection=selection, partition_key="2026-01-02")
    assert again.success
    assert materialization_metadata(again)["silver/backfilled/orders"]["changed"] is False
    assert open_table(layout.silver("orders")).version() == version
    assert _ch_rows(settings, spec) == want

    # The stream goes on; the rebuilt day is not loaded a second time.
    produce(kafka, topic, [order("late", "2026-01-02T00:30:00Z"), order("o45", "2026-01-02T00:26:00Z")])
    assert materialize(spec, settings).success
    assert _ch_rows(settings, spec) == sorted([*want, ("late", "2026-01-02")])


def test_backfill_of_a_join_pipeline_rebuilds_gold_and_clickhouse(
    spark: Any, kafka: str, topic: str, settings: Settings
) -> None:
    from riverhouse.demo import materialize_pipeline
    from riverhouse.platform.gold.joins import gold_path
    from tests.integration.test_joins import ch_rows, join_spec, semantics_events, topics_for

    topics = topics_for(topic)
    semantics_events(kafka, topics)
    spec = join_spec(topics, "left", name="bf_join")
    assert materialize_pipeline(spec, settings, drain=True).success
    want = ch_rows(settings, spec)
    assert len(want) == 5
    path = gold_path(TableLayout(settings.warehouse, spec.name), spec)
    before = open_table(path).to_pyarrow_dataset().to_table().sort_by("_left_offset")

    # Gold loses the day; ClickHouse loses two of its rows.
    open_table(path).delete("_left_event_date = '2026-01-01'")
    with open_client(settings.clickhouse_dsn) as client:
        client.command(
            f"ALTER TABLE {qualified_table(spec)} DELETE WHERE order_id IN ('o1', 'o4') SETTINGS mutations_sync = 1"
        )
    selection = dg.AssetSelection.keys(
        dg.AssetKey(["gold", spec.name, spec.sink.table]), dg.AssetKey(["clickhouse", spec.name, spec.sink.table])
    )
    result = materialize(spec, settings, selection=selection, partition_key="2026-01-01")
    assert result.success
    meta = materialization_metadata(result)[f"gold/bf_join/{spec.sink.table}"]
    assert (meta["mode"], meta["rows"], meta["changed"]) == ("rebuild", 5, True)
    after = open_table(path).to_pyarrow_dataset().to_table().select(before.schema.names).sort_by("_left_offset")
    assert after.equals(before.cast(after.schema))
    assert ch_rows(settings, spec) == want
    assert check_results(result)["bf_join_out_matches_delta"] is True


def test_continuous_job_runs_until_its_time_is_up(spark: Any, kafka: str, topic: str, settings: Settings) -> None:
    from riverhouse.assets.orchestration import continuous_job

    spec = orders_spec(topic, name="cont_job")
    produce(kafka, topic, [order(f"o{i}", "2026-01-01T00:00:00Z") for i in range(30)] * 2)
    job = continuous_job(spec)
    result = job.execute_in_process(
        run_config={"ops": {"cont_job_continuous": {"config": {"run_for_seconds": 15}}}},
        resources=resources_from_settings(settings),
    )
    assert result.success
    with open_client(settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT count(), uniqExact(order_id) FROM {qualified_table(spec)}").result_rows[0]
    assert rows == (30, 30)
