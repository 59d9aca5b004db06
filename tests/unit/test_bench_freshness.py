"""The freshness scenario's arithmetic: percentiles and the batch profile."""

from __future__ import annotations

import pytest

from riverhouse.platform.ingest.stream import BatchMetrics
from riverhouse_bench.freshness import freshness_profile, percentiles

pytestmark = pytest.mark.unit


def test_percentiles_are_nearest_rank_of_the_sorted_values() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 100 .. 1, unsorted on purpose
    assert percentiles(values) == {"p50": 51.0, "p95": 96.0, "p99": 100.0}
    assert percentiles([]) == {}


def test_profile_reports_batch_sizes_times_and_the_gaps_between_batches() -> None:
    batches = [
        BatchMetrics(batch_id=1, read=20_000, started_at=10.0, seconds=1.0, stage_seconds={"read_parse": 0.6}),
        BatchMetrics(batch_id=2, read=30_000, started_at=11.5, seconds=2.0, stage_seconds={"read_parse": 1.5}),
        BatchMetrics(batch_id=3, read=10_000, started_at=13.75, seconds=0.5, stage_seconds={"read_parse": 0.2}),
    ]
    profile = freshness_profile(batches, loads=[0.2, 0.4])
    assert profile["batches"] == 3
    assert profile["records"] == {"p50": 20_000.0, "p95": 30_000.0, "p99": 30_000.0, "max": 30_000.0}
    # gaps: 11.5 - (10 + 1) = 0.5 and 13.75 - (11.5 + 2) = 0.25
    assert profile["between_batches_s"]["max"] == 0.5
    assert profile["between_batches_s"]["p50"] == 0.5
    assert profile["stage_s"]["read_parse"]["max"] == 1.5
    assert profile["load_s"]["max"] == 0.4
    assert [row[0] for row in profile["per_batch"]] == [20_000, 30_000, 10_000]
    assert freshness_profile([], [])["batch_s"] is None
