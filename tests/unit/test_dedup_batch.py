"""The in-batch dedup walk (Arrow; Spark runs it on keys spanning more than a window), no Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from riverhouse.platform.ingest.dedup import dedup_in_batch

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rows(events: list[tuple[str, float, int, int]]) -> pa.Table:
    """(key, minutes after T0, partition, offset)."""
    return pa.table(
        {
            "k": [e[0] for e in events],
            "_event_time": pa.array([T0 + timedelta(minutes=e[1]) for e in events], pa.timestamp("us", tz="UTC")),
            "_topic": ["t"] * len(events),
            "_partition": pa.array([e[2] for e in events], pa.int32()),
            "_offset": pa.array([e[3] for e in events], pa.int64()),
        }
    )


def kept(table: pa.Table) -> list[tuple[str, int]]:
    return sorted(zip(table.column("k").to_pylist(), table.column("_offset").to_pylist(), strict=True))


def test_first_by_event_time_wins_then_offset() -> None:
    table = rows([("a", 5, 0, 1), ("a", 1, 0, 7), ("a", 1, 0, 3), ("b", 0, 1, 2)])
    assert kept(dedup_in_batch(table, ["k"], timedelta(hours=1))) == [("a", 3), ("b", 2)]


def test_events_further_apart_than_the_window_are_both_kept() -> None:
    table = rows([("a", 0, 0, 0), ("a", 30, 0, 1), ("a", 61, 0, 2), ("a", 90, 0, 3), ("a", 125, 0, 4)])
    # kept: 0; 30 dup of 0; 61 > 0+60 kept; 90 dup of 61; 125 > 61+60 kept
    assert kept(dedup_in_batch(table, ["k"], timedelta(hours=1))) == [("a", 0), ("a", 2), ("a", 4)]


def test_composite_keys() -> None:
    table = rows([("a", 0, 0, 0), ("a", 1, 0, 1)]).append_column("k2", pa.array(["x", "y"]))
    assert len(dedup_in_batch(table, ["k", "k2"], timedelta(hours=1))) == 2
    assert len(dedup_in_batch(table, ["k"], timedelta(hours=1))) == 1
