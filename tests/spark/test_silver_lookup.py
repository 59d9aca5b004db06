"""Silver's lookup: a sort-merge anti join when silver's rows in range are few for the batch, two
broadcast joins otherwise; the same rows either way, checked against the rule written out here.

The rule: a row the in-batch dedup keeps is appended unless silver holds a row with the same key
whose event time is within the window of it (either side).
"""

from __future__ import annotations

import random
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform.ingest import dedup
from riverhouse.platform.ingest.dedup import dedup_batch, dedup_in_batch, insert_new, merge_join, not_in_silver
from riverhouse.platform.state.delta_log import overlapping, records_of
from riverhouse.platform.state.tables import ensure_delta_table, silver_properties, spark_schema
from tests.conftest import orders_spec
from tests.spark.test_silver_dedup import SCHEMA, T0, WINDOW, batch

pytestmark = pytest.mark.spark


def new_silver(spark: Any, path: Path) -> str:
    ensure_delta_table(spark, str(path), SCHEMA, ["_event_date"], silver_properties(orders_spec("t").sink_source))
    return str(path)


def frame(spark: Any, events: list[tuple[str, timedelta, int]]) -> Any:
    return spark.createDataFrame(batch(events).to_pylist(), spark_schema(SCHEMA))


def run(spark: Any, silver: str, events: list[tuple[str, timedelta, int]], batch_id: int, rows: int | None) -> Any:
    times = [T0 + at for _, at, _ in events]
    keys = [key for key, _, _ in events]
    bounds = (min(times) - WINDOW, max(times) + WINDOW)
    return insert_new(
        silver,
        frame(spark, events),
        ["order_id"],
        WINDOW,
        bounds,
        "app",
        batch_id,
        key_range=("order_id", min(keys), max(keys)),
        valid_rows=rows,
    )


def stored(spark: Any, silver: str) -> list[tuple[str, Any, int]]:
    rows = spark.read.format("delta").load(silver).select("order_id", "_event_time", "_offset").collect()
    # The sessions' zone is UTC: Spark hands out its timestamps without one.
    return sorted((r[0], r[1].replace(tzinfo=UTC), r[2]) for r in rows)


def expected_after(before: list[tuple[str, Any, int]], events: list[tuple[str, timedelta, int]]) -> list[tuple]:
    """Silver after the batch, by the rule: the reference walk's rows minus those a stored row
    duplicates (same key, event times within the window)."""
    kept = dedup_in_batch(batch(events), ["order_id"], WINDOW).to_pylist()
    fresh = [
        (r["order_id"], r["_event_time"], r["_offset"])
        for r in kept
        if not any(k == r["order_id"] and abs(t - r["_event_time"]) <= WINDOW for k, t, _ in before)
    ]
    return sorted(before + fresh)


@pytest.mark.parametrize("seed", [3, 11])
def test_both_plans_append_the_rows_the_rule_gives(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """One silver, the same batch through each plan (chosen by sizes), against the rule. The batch
    spans less than the window, so its rows are the window pass's cache; silver's rows in range
    are fewer than twice the batch's, so the merge is chosen when the batch's size is given."""
    rng = random.Random(seed)
    keys = [f"k{i:02d}" for i in range(25)]
    history = [(rng.choice(keys), timedelta(minutes=rng.randint(-100, 150)), i) for i in range(40)]
    events = [(rng.choice(keys), timedelta(minutes=rng.randint(0, 50)), 100 + i) for i in range(60)]
    plans: list[bool] = []  # the plan of each lookup that had silver files to read
    real = dedup.not_in_silver

    def spy(
        spark: Any, path: str, unique: Any, key: list[str], window: timedelta, files: list[str], merge: bool
    ) -> Any:
        if files:
            plans.append(merge)
        return real(spark, path, unique, key, window, files, merge)

    monkeypatch.setattr(dedup, "not_in_silver", spy)
    builds: list[str] = []  # the caches computed by a job of their own before the lookup
    real_build = dedup._build

    def build(cached: Any, name: str) -> None:
        builds.append(name)
        real_build(cached, name)

    monkeypatch.setattr(dedup, "_build", build)
    results = []
    for name, rows in [("merge", len(events)), ("broadcast", None)]:
        silver = new_silver(spark, tmp_path / name)
        run(spark, silver, history, 0, len(history))
        before = stored(spark, silver)
        run(spark, silver, events, 1, rows)
        after = stored(spark, silver)
        assert after == expected_after(before, events), name
        assert len(after) < len(before) + len(events)  # the seed gives duplicates to leave out
        results.append(after)
    assert plans == [True, False]
    # The batch spans less than the window: no count of long keys computed its cache, so the merge's
    # batch got a job of its own for it (else the append's one task computes it); the broadcast's did not.
    assert len(builds) == 1
    assert results[0] == results[1]


def test_the_merge_plan_shuffles_only_silvers_side(spark: Any, tmp_path: Path) -> None:
    """The merge reuses the window pass's partitioning and order: one exchange (silver's rows), no
    broadcast; the other plan broadcasts and sort-merges nothing."""
    silver = new_silver(spark, tmp_path / "silver")
    run(spark, silver, [("a", timedelta(0), 0), ("b", timedelta(minutes=5), 1)], 0, 2)
    events = [("a", timedelta(minutes=10), 2), ("c", timedelta(minutes=20), 3), ("c", timedelta(minutes=30), 4)]
    files = overlapping(silver, "_event_time", T0 - WINDOW, T0 + 2 * WINDOW, "_event_date").paths
    in_batch = dedup_batch(frame(spark, events), ["order_id"], WINDOW, span_micros=0, read_twice=True)
    try:
        for merge in (True, False):
            fresh = not_in_silver(spark, silver, in_batch.unique, ["order_id"], WINDOW, files, merge)
            if hasattr(fresh, "_jdf"):  # an in-process session
                plan = fresh._jdf.queryExecution().executedPlan().toString()
            else:
                plan = fresh._explain_string(mode="simple")
            # Two exchanges in all: the window pass's (inside the cache) and silver's rows; a third
            # would be the batch shuffled again.
            if merge:
                assert "SortMergeJoin" in plan and "LeftAnti" in plan and "Broadcast" not in plan, plan
                assert plan.count("Exchange") == 2 and plan.count("Exchange hashpartitioning(_s_order_id") == 1, plan
            else:
                assert "SortMergeJoin" not in plan and plan.count("BroadcastHashJoin") == 2, plan
            assert sorted((r["order_id"], r["_offset"]) for r in fresh.collect()) == [("c", 3)]
    finally:
        in_batch.release()


def test_the_plan_follows_the_sizes_and_the_batchs_partitioning() -> None:
    assert merge_join(stored_rows=200, batch_rows=100, by_key=True)
    assert not merge_join(stored_rows=201, batch_rows=100, by_key=True)
    assert not merge_join(stored_rows=0, batch_rows=100, by_key=False)  # the walked keys' union: no reuse
    assert not merge_join(stored_rows=None, batch_rows=100, by_key=True)  # a file without statistics
    assert not merge_join(stored_rows=10, batch_rows=None, by_key=True)  # the batch's size not known


def test_the_rows_in_range_come_from_the_logs_statistics(spark: Any, tmp_path: Path) -> None:
    silver = new_silver(spark, tmp_path / "silver")
    run(spark, silver, [("a", timedelta(0), 0), ("b", timedelta(minutes=5), 1)], 0, 2)
    run(spark, silver, [("c", timedelta(days=3), 2)], 1, 1)
    assert overlapping(silver, "_event_time", T0 - WINDOW, T0 + WINDOW, "_event_date").records == 2
    assert overlapping(silver, "_event_time", T0 - WINDOW, T0 + timedelta(days=4), "_event_date").records == 3
    assert overlapping(silver, "_event_time", T0 + timedelta(days=9), None, "_event_date").records == 0
    adds = pa.table({"path": ["x", "y"], "num_records": pa.array([5, None], pa.int64())})
    assert records_of(adds) is None and records_of(adds.slice(0, 1)) == 5
