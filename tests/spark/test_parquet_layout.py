"""How a batch's Parquet files are laid out: the settings every session and the engine carry.

Timestamps are INT64 microseconds (Spark's default, INT96, is converted value by value and
dictionary-encoded as 12-byte binaries), and a record's raw key and value are written without
a dictionary (they are unique per record: Parquet built a dictionary per page only to drop
it). The static part reaches an engine only through its start, so this runs against the shared
engine too (bench/analysis.md has the figures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from riverhouse.platform.faults import FaultPlan
from riverhouse.platform.ingest.stream import ensure_source_tables
from riverhouse.platform.ingest.writer import BatchWriter
from riverhouse.platform.state.checkpoints import BatchChannel
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import orders_spec
from tests.spark.test_batch_round_trips import kafka_batch

pytestmark = pytest.mark.spark


def column_chunks(table_path: str) -> dict[str, tuple[str, set[str]]]:
    """Each column's physical type and encodings, over every data file of the table's latest version."""
    table = open_table(table_path)
    assert table is not None
    found: dict[str, tuple[str, set[str]]] = {}
    for uri in table.file_uris():
        meta = pq.ParquetFile(uri.removeprefix("file://")).metadata
        for group in range(meta.num_row_groups):
            for index in range(meta.num_columns):
                chunk = meta.row_group(group).column(index)
                kind, encodings = found.get(chunk.path_in_schema, (chunk.physical_type, set()))
                found[chunk.path_in_schema] = (kind, encodings | set(chunk.encodings))
    return found


def test_a_batch_writes_timestamps_as_int64_and_raw_payloads_without_a_dictionary(spark: Any, tmp_path: Path) -> None:
    spec = orders_spec("parquet_layout")
    source = spec.sink_source_name
    layout = TableLayout(Settings.from_env(tmp_path / "home").warehouse, spec.name)
    ensure_source_tables(spark, spec, layout, source)
    writer = BatchWriter(spec, source, layout, "app", BatchChannel(tmp_path / "checkpoint", run="r1"), FaultPlan())
    # Every third order twice: a dictionary would pay off for none of the raw values but these copies.
    ids = [f"o{i:04d}" for i in range(300)]
    assert writer._process(kafka_batch(spark, [*ids, *ids[::3]], 0), 0).inserted == 300

    bronze = column_chunks(layout.bronze(source))
    silver = column_chunks(layout.silver(source))
    for name in ("_event_time", "_kafka_timestamp"):
        assert bronze[name][0] == "INT64", name
        assert silver[name][0] == "INT64", name
    assert silver["created_at"][0] == "INT64"
    for name in ("_value", "_key"):
        assert not any("DICTIONARY" in e for e in bronze[name][1]), (name, bronze[name])
    # Columns with few values keep their dictionary: the setting names the raw payloads only.
    assert any("DICTIONARY" in e for e in bronze["_status"][1])
    # The rows read back as the instants they were written as.
    times = open_table(layout.silver(source)).to_pyarrow_table(columns=["created_at"]).column("created_at")
    assert min(times.to_pylist()).isoformat() == "2026-01-01T12:00:00+00:00"
