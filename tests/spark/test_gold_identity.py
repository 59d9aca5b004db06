"""The gold step's identity bookkeeping in Spark (a real Delta gold table under tmp_path).

A driving event may come both from the change feed and from the re-read of pending
events, and one already in gold may be read again: each must be joined once.
"""

from __future__ import annotations

import random
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.gold.joins import IDENTITY, dedupe_identity, not_processed

pytestmark = pytest.mark.spark
DAY = date(2026, 3, 1)
DRIVING = "_topic string, _partition int, _offset long, _event_date date, row long"


def driving(spark: Any, ids: list[tuple[str, int, int]], days: list[int] | None = None) -> Any:
    """Silver-like rows: Kafka identity, event date, and a payload naming the row's position."""
    days = days or [0] * len(ids)
    rows = [(t, p, o, DAY + timedelta(days=d), i) for i, ((t, p, o), d) in enumerate(zip(ids, days, strict=True))]
    return spark.createDataFrame(rows, DRIVING)


def gold(spark: Any, path: Path, ids: list[tuple[str, int, int]], days: list[int]) -> Any:
    rows = [(t, p, o, DAY + timedelta(days=d)) for (t, p, o), d in zip(ids, days, strict=True)]
    schema = f"{IDENTITY[0]} string, {IDENTITY[1]} int, {IDENTITY[2]} long, _left_event_date date"
    spark.createDataFrame(rows, schema).write.format("delta").partitionBy("_left_event_date").save(str(path))
    return spark.read.format("delta").load(str(path))


def positions(df: Any) -> list[int]:
    return sorted(r["row"] for r in df.select("row").collect())


def test_dedupe_keeps_one_row_per_identity(spark: Any) -> None:
    rng = random.Random(5)
    ids = [(rng.choice("xyz"), rng.randrange(3), rng.randrange(200)) for _ in range(3000)]
    out = dedupe_identity(driving(spark, ids))
    got = [(r["_topic"], r["_partition"], r["_offset"]) for r in out.collect()]
    assert len(got) == len(set(got)) == len(set(ids)) < len(ids)


def test_not_processed_drops_what_gold_holds_from_the_earliest_date_on(spark: Any, tmp_path: Path) -> None:
    done = gold(spark, tmp_path / "gold", [("a", 0, 1), ("a", 0, 3), ("b", 1, 9), ("a", 0, 5)], days=[1, 1, 2, 0])
    closed = driving(
        spark, [("a", 0, 1), ("a", 0, 2), ("a", 0, 3), ("a", 1, 1), ("b", 1, 9), ("a", 0, 5)], days=[1, 1, 1, 1, 2, 1]
    )
    # ("a", 0, 5) is in gold on a day before the earliest closed event's: not read, so kept.
    assert positions(not_processed(closed, done, DAY + timedelta(days=1))) == [1, 3, 5]


def test_not_processed_matches_a_set_reference_on_random_rows(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(11)
    held = list({(rng.choice("xy"), rng.randrange(2), rng.randrange(300)) for _ in range(400)})
    done = gold(spark, tmp_path / "gold", held, days=[0] * len(held))
    ids = [(rng.choice("xy"), rng.randrange(2), rng.randrange(300)) for _ in range(1000)]
    expected = [i for i, ident in enumerate(ids) if ident not in set(held)]
    assert 0 < len(expected) < len(ids)
    assert positions(not_processed(driving(spark, ids), done, DAY)) == expected
