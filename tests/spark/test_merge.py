"""Silver dedup against a real Delta table: window-bounded insert-if-absent, once per batch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from riverhouse.platform.dedup import compact_lookup_days, insert_if_absent
from riverhouse.platform.tables import (
    committed,
    ensure_table,
    open_table,
    read_inserts,
    silver_schema,
)
from tests.conftest import orders_spec

pytestmark = pytest.mark.spark
T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
WINDOW = timedelta(hours=1)


def batch(events: list[tuple[str, timedelta, int]]) -> pa.Table:
    schema = silver_schema(orders_spec("t").sink_source)
    times = [T0 + e[1] for e in events]
    data = {
        "order_id": [e[0] for e in events],
        "user_id": ["u"] * len(events),
        "amount": [1] * len(events),
        "price": [1.0] * len(events),
        "created_at": times,
        "_event_time": times,
        "_event_date": [t.date() for t in times],
        "_topic": ["t"] * len(events),
        "_partition": [0] * len(events),
        "_offset": [e[2] for e in events],
        "_kafka_timestamp": times,
        "_batch_id": [0] * len(events),
    }
    return pa.table(data, schema=schema)


def silver_ids(path: str) -> list[tuple[str, int]]:
    table = open_table(path).to_pyarrow_dataset().to_table(columns=["order_id", "_offset"])
    return sorted(zip(table.column("order_id").to_pylist(), table.column("_offset").to_pylist(), strict=True))


def test_merge_is_window_bounded_and_committed_once(tmp_path: Path) -> None:
    path = str(tmp_path / "silver")
    schema = silver_schema(orders_spec("t").sink_source)
    table = ensure_table(path, schema, ["_event_date"], cdf=True)
    out = insert_if_absent(
        table, batch([("a", timedelta(0), 0), ("b", timedelta(0), 1)]), ["order_id"], WINDOW, "app", 0
    )
    assert out.inserted == 2 and committed(table, "app", 0)
    # a: 30 minutes later is a duplicate; b: 2 hours later is outside the window -> new; c: new
    out = insert_if_absent(
        open_table(path),
        batch([("a", timedelta(minutes=30), 2), ("b", timedelta(hours=2), 3), ("c", timedelta(0), 4)]),
        ["order_id"],
        WINDOW,
        "app",
        1,
    )
    assert out.inserted == 2
    assert silver_ids(path) == [("a", 0), ("b", 1), ("b", 3), ("c", 4)]
    # An event *earlier* than the stored one but inside the window is a duplicate too.
    out = insert_if_absent(open_table(path), batch([("c", timedelta(minutes=-20), 5)]), ["order_id"], WINDOW, "app", 2)
    assert out.inserted == 0
    assert not committed(open_table(path), "app", 3)
    assert not committed(open_table(path), "other-app", 0)


def test_replaying_a_merge_creates_no_duplicate(tmp_path: Path) -> None:
    path = str(tmp_path / "silver")
    table = ensure_table(path, silver_schema(orders_spec("t").sink_source), ["_event_date"], cdf=True)
    rows = batch([("a", timedelta(0), 0), ("b", timedelta(days=3), 1)])
    insert_if_absent(table, rows, ["order_id"], WINDOW, "app", 0)
    again = insert_if_absent(open_table(path), rows, ["order_id"], WINDOW, "app", 0)
    assert again.inserted == 0
    assert silver_ids(path) == [("a", 0), ("b", 1)]


def test_merge_predicate_prunes_partitions_outside_the_window(tmp_path: Path) -> None:
    path = str(tmp_path / "silver")
    ensure_table(path, silver_schema(orders_spec("t").sink_source), ["_event_date"], cdf=True)
    for day in range(6):
        insert_if_absent(
            open_table(path), batch([(f"d{day}", timedelta(days=day), day)]), ["order_id"], WINDOW, "app", day
        )
    files_before = len(open_table(path).file_uris())
    out = insert_if_absent(
        open_table(path),
        batch([("x", timedelta(days=5), 99), ("d5", timedelta(days=5), 98)]),
        ["order_id"],
        WINDOW,
        "app",
        6,
    )
    # Only the partitions within a day of day 5 are read (days 4 and 5: 2 files), not the six days,
    # and the stored d5 is still found there.
    assert out.files_scanned == 2 and files_before == 6
    assert out.inserted == 1
    assert ("d5", 98) not in silver_ids(path) and ("x", 99) in silver_ids(path)


def test_compaction_keeps_rows_dedup_and_the_change_feed(tmp_path: Path) -> None:
    """OPTIMIZE of the lookup's days: fewer files, same rows, no change-feed rows, replays still skipped."""
    path = str(tmp_path / "silver")
    schema = silver_schema(orders_spec("t").sink_source)
    ensure_table(path, schema, ["_event_date"], cdf=True)
    for i in range(6):  # six batches -> six small files in the day
        insert_if_absent(open_table(path), batch([(f"k{i}", timedelta(minutes=i), i)]), ["order_id"], WINDOW, "app", i)
    before = open_table(path)
    assert len(before.file_uris()) == 6
    rows_before, version_before = silver_ids(path), before.version()

    done = compact_lookup_days(before, batch([("k9", timedelta(0), 9)]), WINDOW)

    after = open_table(path)
    assert done["files_removed"] == 6 and len(after.file_uris()) == done["files_added"] == 1
    assert after.version() == version_before + 1
    assert silver_ids(path) == rows_before
    # The loader reads the change feed: the OPTIMIZE commit must add no rows to it.
    assert read_inserts(path, after.version(), after.version(), ["order_id"]).num_rows == 0
    # The last batch id survives the compaction (a replayed batch is still skipped) ...
    assert committed(after, "app", 5)
    # ... and the lookup still finds stored keys in the compacted file.
    out = insert_if_absent(
        after, batch([("k3", timedelta(minutes=20), 30), ("new", timedelta(0), 31)]), ["order_id"], WINDOW, "app", 6
    )
    assert out.inserted == 1 and out.files_scanned == 1
