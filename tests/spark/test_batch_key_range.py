"""The batch body's key range: what bronze's append observes (valid rows only) reaches silver's lookup.

A range taken from the wrong rows would leave out silver files that hold duplicates; one that never
arrived would leave the lookup unnarrowed. Checked on the body's own expressions and on what it
hands to `insert_new`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.faults import FaultPlan
from riverhouse.platform.ingest import writer as writer_module
from riverhouse.platform.ingest.writer import BatchWriter
from riverhouse.platform.state.checkpoints import BatchChannel
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout
from tests.conftest import orders_spec

pytestmark = pytest.mark.spark
T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


def body(tmp_path: Path) -> BatchWriter:
    spec = orders_spec("key_range_body")
    layout = TableLayout(Settings.from_env(tmp_path / "home").warehouse, spec.name)
    channel = BatchChannel(tmp_path / "checkpoint", run="r1")
    return BatchWriter(spec, spec.sink_source_name, layout, "app", channel, FaultPlan())


def test_the_observed_key_range_is_the_valid_rows_own(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    writer = body(tmp_path)
    assert writer.key_column == "order_id"
    rows = spark.createDataFrame(
        [("ok", "o-5", T0), ("ok", "o-7", T0), ("rejected", "o-1", T0), ("rejected", "o-9", T0), ("ok", None, T0)],
        "_status string, order_id string, _event_time timestamp",
    )
    ok = F.col("_status") == "ok"
    figures = rows.agg(*writer._observed(ok, F.unix_micros(F.when(ok, F.col("_event_time"))))).first().asDict()
    assert (figures["key_lo"], figures["key_hi"], figures["valid"]) == ("o-5", "o-7", 3)


def test_the_key_range_reaches_silvers_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = body(tmp_path)
    handed: list[Any] = []

    def insert_new(*args: Any, **kwargs: Any) -> Any:
        handed.append((args[-1], kwargs.get("columns")))
        raise RuntimeError("stop here")

    monkeypatch.setattr(writer_module, "insert_new", insert_new)
    monkeypatch.setattr(writer, "_silver_max_micros", lambda: 0)
    micros = int(T0.timestamp() * 1_000_000)
    figures = {"read": 3, "valid": 3, "lo": micros, "hi": micros, "key_lo": "o-5", "key_hi": "o-7"}
    with pytest.raises(RuntimeError, match="stop here"):
        writer._write_silver(object(), 0, writer_module.BatchMetrics(batch_id=0), figures)
    # The silver columns go with it, so the lookup does not ask the engine for them.
    assert handed == [(("order_id", "o-5", "o-7"), writer.silver_columns)]
