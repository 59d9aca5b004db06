"""The gold step's identity bookkeeping (Arrow and a real delta-rs table, no Spark session).

A driving event may come both from the change feed and from the re-read of pending
events, and one already in gold may be read again: each must be joined once.
"""

from __future__ import annotations

import random
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from riverhouse.platform.gold.joins import IDENTITY, _dedupe_identity, _not_processed

pytestmark = pytest.mark.unit
DAY = date(2026, 3, 1)


def driving(ids: list[tuple[str, int, int]], days: list[int] | None = None) -> pa.Table:
    """Silver-like rows: Kafka identity, event date, and a payload naming the row's position."""
    days = days or [0] * len(ids)
    return pa.table(
        {
            "_topic": pa.array([i[0] for i in ids], pa.string()),
            "_partition": pa.array([i[1] for i in ids], pa.int32()),
            "_offset": pa.array([i[2] for i in ids], pa.int64()),
            "_event_date": pa.array([DAY + timedelta(days=d) for d in days], pa.date32()),
            "row": pa.array(range(len(ids)), pa.int64()),
        }
    )


def write_gold(path: Path, ids: list[tuple[str, int, int]], days: list[int]) -> str:
    write_deltalake(
        str(path),
        pa.table(
            {
                IDENTITY[0]: pa.array([i[0] for i in ids], pa.string()),
                IDENTITY[1]: pa.array([i[1] for i in ids], pa.int32()),
                IDENTITY[2]: pa.array([i[2] for i in ids], pa.int64()),
                "_left_event_date": pa.array([DAY + timedelta(days=d) for d in days], pa.date32()),
            }
        ),
        partition_by=["_left_event_date"],
    )
    return str(path)


def test_dedupe_keeps_the_first_of_each_identity_in_order() -> None:
    ids = [("a", 0, 1), ("a", 0, 2), ("a", 0, 1), ("a", 1, 1), ("b", 0, 1), ("a", 1, 1), ("b", 0, 2)]
    assert _dedupe_identity(driving(ids)).column("row").to_pylist() == [0, 1, 3, 4, 6]


def test_dedupe_matches_a_first_seen_reference_on_random_rows() -> None:
    rng = random.Random(5)
    ids = [(rng.choice("xyz"), rng.randrange(3), rng.randrange(200)) for _ in range(3000)]
    seen: set[tuple[str, int, int]] = set()
    expected = []
    for position, ident in enumerate(ids):
        if ident not in seen:
            seen.add(ident)
            expected.append(position)
    assert len(expected) < len(ids)
    assert _dedupe_identity(driving(ids)).column("row").to_pylist() == expected


def test_not_processed_drops_what_gold_holds_from_the_earliest_date_on(tmp_path: Path) -> None:
    gold = write_gold(tmp_path / "gold", [("a", 0, 1), ("a", 0, 3), ("b", 1, 9), ("a", 0, 5)], days=[1, 1, 2, 0])
    closed = driving(
        [("a", 0, 1), ("a", 0, 2), ("a", 0, 3), ("a", 1, 1), ("b", 1, 9), ("a", 0, 5)], days=[1, 1, 1, 1, 2, 1]
    )
    # ("a", 0, 5) is in gold on a day before the earliest closed event's: not read, so kept.
    assert _not_processed(closed, gold).column("row").to_pylist() == [1, 3, 5]


def test_not_processed_without_gold_or_overlap_keeps_everything(tmp_path: Path) -> None:
    closed = driving([("a", 0, 1), ("a", 0, 2)])
    assert _not_processed(closed, str(tmp_path / "missing")).equals(closed)
    gold = write_gold(tmp_path / "gold", [("z", 0, 1)], days=[0])
    assert _not_processed(closed, gold).column("row").to_pylist() == [0, 1]


def test_not_processed_matches_a_set_reference_on_random_rows(tmp_path: Path) -> None:
    rng = random.Random(11)
    done = list({(rng.choice("xy"), rng.randrange(2), rng.randrange(300)) for _ in range(400)})
    gold = write_gold(tmp_path / "gold", done, days=[0] * len(done))
    ids = [(rng.choice("xy"), rng.randrange(2), rng.randrange(300)) for _ in range(1000)]
    expected = [i for i, ident in enumerate(ids) if ident not in set(done)]
    assert 0 < len(expected) < len(ids)
    assert _not_processed(driving(ids), gold).column("row").to_pylist() == expected
