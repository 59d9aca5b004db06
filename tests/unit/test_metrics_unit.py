"""The metrics registry: batch and load figures become the documented series; bad settings are named."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from riverhouse.platform.ingest.writer import BatchMetrics
from riverhouse.platform.runtime import metrics
from tests.conftest import orders_spec

pytestmark = pytest.mark.unit


def series(pipeline: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode()):
        for sample in family.samples:
            if sample.labels.get("pipeline") == pipeline:
                out[(sample.name, sample.labels.get("source", ""))] = sample.value
    return out


def test_batches_and_loads_add_up_per_pipeline_and_source() -> None:
    seen: list[int] = []
    hook = metrics.observed("unit_p", lambda m: seen.append(m.batch_id))
    hook(BatchMetrics(batch_id=0, source="a", read=10, quarantined=1, duplicates_dropped=2, inserted=7, seconds=0.3))
    hook(BatchMetrics(batch_id=1, source="a", read=5, inserted=5, seconds=0.2))
    hook(BatchMetrics(batch_id=0, source="b", read=3, replayed=3, seconds=0.1))
    metrics.observe_load("unit_p", rows=12, seconds=0.5, last_loaded_version=4)
    metrics.observe_load_error("unit_p")
    got = series("unit_p")
    assert seen == [0, 1, 0]  # the wrapped hook still runs
    assert got[("riverhouse_records_read_total", "a")] == 15
    assert got[("riverhouse_records_read_total", "b")] == 3
    assert got[("riverhouse_quarantined_total", "a")] == 1
    assert got[("riverhouse_duplicates_dropped_total", "a")] == 2
    assert got[("riverhouse_silver_inserted_total", "a")] == 12
    assert got[("riverhouse_replayed_total", "b")] == 3
    assert got[("riverhouse_batches_total", "a")] == 2
    assert got[("riverhouse_batch_duration_seconds_count", "a")] == 2
    assert got[("riverhouse_batch_duration_seconds_sum", "a")] == pytest.approx(0.5)
    assert got[("riverhouse_clickhouse_rows_loaded_total", "")] == 12
    assert got[("riverhouse_clickhouse_insert_errors_total", "")] == 1
    assert got[("riverhouse_last_loaded_delta_version", "")] == 4


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RIVERHOUSE_METRICS_PORT", "http", "RIVERHOUSE_METRICS_PORT must be a port number"),
        ("RIVERHOUSE_METRICS_PORT", "70000", "RIVERHOUSE_METRICS_PORT must be a port number"),
        ("RIVERHOUSE_METRICS_LAG_INTERVAL", "0", "RIVERHOUSE_METRICS_LAG_INTERVAL must be a number of seconds"),
    ],
)
def test_bad_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(metrics.MetricsError, match=message):
        metrics.ContinuousMetrics.from_env(orders_spec("t"), None)  # type: ignore[arg-type]


def test_push_is_off_without_a_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIVERHOUSE_METRICS_PUSHGATEWAY", raising=False)
    assert metrics.push(orders_spec("t"), None) is False  # type: ignore[arg-type]
