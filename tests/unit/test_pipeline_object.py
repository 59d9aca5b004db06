"""The engine's entry point without Spark: windows, lazy sessions, errors before start-up, published metadata."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform import publish
from riverhouse.platform.gold.joins import GoldResult
from riverhouse.platform.ingest.stream import IngestResult
from riverhouse.platform.ingest.writer import BatchMetrics
from riverhouse.platform.kafka.lag import PipelineLag
from riverhouse.platform.pipeline import Pipeline, PipelineError, Window
from riverhouse.platform.sink.replace import ReplaceResult
from riverhouse.platform.spec import load_spec, parse_spec
from riverhouse.platform.state.settings import Settings
from tests.conftest import REPO, orders_spec_data


class NoSpark:
    """A spark_factory that records whether anything asked for a session."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return object()


def pipeline(tmp_path: Path, spec: Any = None, **settings: Any) -> tuple[Pipeline, NoSpark]:
    factory = NoSpark()
    base = Settings.from_env(tmp_path / "home").with_(kafka_bootstrap=None, **settings)
    spec = spec or parse_spec(orders_spec_data("orders"))
    return Pipeline(spec, base, log=lambda m: None, spark_factory=factory), factory


def test_a_window_is_utc_and_must_end_after_it_starts() -> None:
    paris = timezone(timedelta(hours=1))
    window = Window(datetime(2026, 1, 2, 1, tzinfo=paris), datetime(2026, 1, 3, 1, tzinfo=paris))
    assert window.start == datetime(2026, 1, 2, tzinfo=UTC) and window.start.tzinfo == UTC
    with pytest.raises(ValueError, match="must end after it starts"):
        Window(datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC))


def test_the_session_is_made_once_and_only_when_needed(tmp_path: Path) -> None:
    target, factory = pipeline(tmp_path)
    assert factory.calls == 0
    first = target.spark
    assert target.spark is first and factory.calls == 1
    given = object()
    assert Pipeline(target.spec, target.settings, spark=given).spark is given


@pytest.mark.parametrize("mode", ["run", "continuous"])
def test_no_local_kafka_is_said_before_spark_starts(tmp_path: Path, mode: str) -> None:
    target, factory = pipeline(tmp_path, kafka_state_dir=tmp_path / "no-kafka")
    with pytest.raises(PipelineError, match="reads the local Kafka, which is not running"):
        target.run() if mode == "run" else target.continuous(threading.Event())
    assert factory.calls == 0


def test_a_pipeline_without_a_join_has_no_gold_step(tmp_path: Path) -> None:
    target, factory = pipeline(tmp_path)
    with pytest.raises(PipelineError, match="has no join or query"):
        target.gold()
    assert factory.calls == 0


def test_a_stream_run_without_an_ingest_publishes_no_silver_rows(tmp_path: Path) -> None:
    # The silver table does not even exist: nothing may be read when the ingest wrote nothing.
    target, _ = pipeline(tmp_path)
    published = publish.silver(target.spec, target.settings, "orders", None)
    assert published.written is not None and published.written.files == () and published.written.window is None
    assert published.metadata["inserted"] == 0 and published.metadata["delta_version"] == -1
    assert published.metadata["duplicates_dropped"] == 0


class Stub(Pipeline):
    """The real publishing code over a canned ingest."""

    def __init__(self, spec: Any, settings: Settings):
        super().__init__(spec, settings, log=lambda m: None, spark_factory=NoSpark())

    def lag(self, sources: list[str] | None = None, closed_is_final: bool = False) -> PipelineLag:
        return PipelineLag(self.name)

    def ingest(
        self, source: str | None = None, on_batch: Any = None, lock_wait_s: float = 0.0, resident: bool = False
    ) -> IngestResult:
        batch = BatchMetrics(batch_id=3, read=4, quarantined=1, inserted=3)
        return IngestResult(self.name, "orders", [batch], 2.0, None, {"t": {"0": 4}})


def test_unknown_versions_and_an_idle_join_are_shown_as_minus_one_and_none(tmp_path: Path) -> None:
    spec = load_spec(REPO / "pipelines" / "orders_enriched.yaml")
    settings = Settings.from_env(tmp_path)
    meta = publish.gold(spec, settings, None, GoldResult(), before=-1).metadata
    assert (meta["delta_version"], meta["watermark"], meta["mode"]) == (-1, "", "stream")


def test_a_window_swap_lists_its_days(tmp_path: Path) -> None:
    spec = parse_spec(orders_spec_data("orders"))
    replaced = ReplaceResult(table="t", days=["2026-01-02", "2026-01-03"], rows=5, caught_up_rows=2)
    window = Window(datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 4, tzinfo=UTC))
    published = publish.clickhouse(spec, Settings.from_env(tmp_path), window, replaced, rows=9)
    assert published.mode == "rebuild"
    # Dagster's conventions: the rows of the swapped window, and the table's rows after it.
    assert (published.metadata["dagster/partition_row_count"], published.metadata["dagster/row_count"]) == (5, 9)
    assert published.metadata["days"] == "2026-01-02, 2026-01-03"
    assert (published.metadata["rows_replaced"], published.metadata["rows_caught_up"]) == (5, 2)
    assert published.metadata["delta_version"] == -1


def test_ingest_metadata_redacts_the_kafka_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = orders_spec_data("orders")
    data["kafka"]["security"] = {"protocol": "SSL", "certificate": "/c.pem", "key": "/k.pem"}
    data["kafka"]["config"] = {
        "client.id": "orders-reader",
        "ssl.key.password": f"${{env:RIVERHOUSE_SECRET_{data['name'].upper()}__KEY_PASSWORD}}",
    }
    monkeypatch.setenv(f"RIVERHOUSE_SECRET_{data['name'].upper()}__KEY_PASSWORD", "hunter2")
    published = Stub(parse_spec(data), Settings.from_env(tmp_path)).publish_ingest("orders")
    assert published.metadata["kafka_config"] == {"client.id": "orders-reader", "ssl.key.password": "***"}
    assert "hunter2" not in repr(published.metadata)
    assert (published.metadata["records_in"], published.metadata["quarantined"]) == (4, 1)
    assert published.metadata["silver_version_after"] == -1  # no silver version yet
    assert published.related["quarantine"]["quarantined"] == 1
