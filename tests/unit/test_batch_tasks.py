"""How many tasks a batch runs in: one per slot, two per slot for a batch of many offsets (from
the offsets Spark wrote in the checkpoint before running the batch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from riverhouse.platform.ingest.writer import BatchWriter
from riverhouse.platform.kafka.client import batch_records
from riverhouse.platform.state.checkpoints import BatchChannel

pytestmark = pytest.mark.unit

OFFSETS_HEADER = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'


def checkpoint(tmp_path: Path, first: str, *ends: str) -> Path:
    """A Kafka query's checkpoint as Spark writes it: sources/0/0 (a NUL byte, a version line, the
    first offsets), then offsets/<n> per batch (a version line, metadata, the end offsets)."""
    spark = tmp_path / "spark"
    (spark / "sources" / "0").mkdir(parents=True)
    (spark / "sources" / "0" / "0").write_text(f"\0v1\n{first}")
    (spark / "offsets").mkdir()
    for n, end in enumerate(ends):
        (spark / "offsets" / str(n)).write_text(OFFSETS_HEADER + end)
    return spark


def test_a_batch_spans_its_end_offsets_minus_the_batch_befores(tmp_path: Path) -> None:
    spark = checkpoint(
        tmp_path,
        '{"orders":{"0":0,"1":5}}',
        '{"orders":{"0":100,"1":105}}',
        '{"orders":{"0":160,"1":125,"2":7}}',  # partition 2 appeared: not counted from an unknown start
    )
    assert batch_records(spark, 0) == 200
    assert batch_records(spark, 1) == 60 + 20
    assert batch_records(spark, 2) is None  # Spark has not planned it
    assert batch_records(tmp_path / "elsewhere", 0) is None  # a checkpoint this process cannot see


def writer_at(root: Path, slots: int) -> BatchWriter:
    writer = BatchWriter.__new__(BatchWriter)  # the rule needs only the channel and the slots
    writer.channel = BatchChannel(root)
    writer.slots = slots
    return writer


def test_a_large_batch_runs_in_two_tasks_per_slot_a_small_one_in_one(tmp_path: Path) -> None:
    checkpoint(
        tmp_path,
        '{"orders":{"0":0,"1":0}}',
        '{"orders":{"0":110000,"1":110000}}',  # the bench's 220,000-record batch
        '{"orders":{"0":113500,"1":113500}}',  # a 7,000-record one
        '{"orders":{"0":163500,"1":163499}}',  # 99,999: just under 50,000 a slot on 2 slots
    )
    writer = writer_at(tmp_path, slots=2)
    assert [writer._tasks(n) for n in (0, 1, 2)] == [4, 2, 2]
    assert writer_at(tmp_path, slots=8)._tasks(0) == 8  # 27,500 a slot on 8 slots: one task each
    assert writer._tasks(3) == 2  # not planned yet (or not visible here): one task per slot
