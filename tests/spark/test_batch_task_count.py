"""A batch of many offsets is read, parsed and written in two tasks per slot, a small one in one
(ingest/writer.BatchWriter._tasks): the count follows the offsets Spark wrote in the checkpoint,
and the rows are the same either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.faults import FaultPlan
from riverhouse.platform.ingest.stream import ensure_source_tables
from riverhouse.platform.ingest.writer import LARGE_BATCH_RECORDS_PER_SLOT, BatchWriter
from riverhouse.platform.state.checkpoints import BatchChannel
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import orders_spec
from tests.spark.test_batch_round_trips import kafka_batch
from tests.unit.test_batch_tasks import checkpoint

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("large", [True, False])
def test_a_large_batch_is_written_in_twice_as_many_tasks(spark: Any, tmp_path: Path, large: bool) -> None:
    spec = orders_spec(f"batch_tasks_{large}")
    source = spec.sink_source_name
    layout = TableLayout(Settings.from_env(tmp_path / "home").warehouse, spec.name)
    ensure_source_tables(spark, spec, layout, source)
    root = tmp_path / "checkpoint"
    # What Spark wrote before the batch: a span of offsets over (or under) the large-batch mark.
    span = 3 * LARGE_BATCH_RECORDS_PER_SLOT * 8 if large else 600
    checkpoint(root, '{"orders":{"0":0}}', f'{{"orders":{{"0":{span}}}}}')
    writer = BatchWriter(spec, source, layout, "app", BatchChannel(root, run="r1"), FaultPlan())
    ids = [f"o{i:04d}" for i in range(400)]
    batch = kafka_batch(spark, [*ids, *ids[::2]], 0).repartition(8)  # Kafka's 8 partitions
    assert writer._process(batch, 0).inserted == 400
    assert writer.slots is not None and writer.slots * 2 <= 8
    # One bronze file per task: every record of the batch falls on one day.
    bronze_files = len(open_table(layout.bronze(source)).file_uris())
    assert bronze_files == (2 * writer.slots if large else writer.slots)
    silver = open_table(layout.silver(source)).to_pyarrow_table(columns=["order_id"]).column("order_id")
    assert sorted(silver.to_pylist()) == ids
