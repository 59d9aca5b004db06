"""The freshness scenario's arithmetic: percentiles and the batch profile."""

from __future__ import annotations

import pytest

from riverhouse.platform.ingest.writer import BatchMetrics
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


def test_the_page_renders_a_freshness_run_whose_measured_stretch_had_one_batch() -> None:
    """One batch after the warm-up has no gap to a next one: the page says the rest, it does not fail."""
    from riverhouse_bench.report import _scenario_lines

    batch = BatchMetrics(batch_id=1, read=5_000, started_at=10.0, seconds=1.5, stage_seconds={"read_parse": 0.5})
    profile = freshness_profile([batch], loads=[0.3])
    assert profile["between_batches_s"] is None
    run = {"events": 5_000, "exact": True, "p50_s": 1.0, "p95_s": 2.0, "p99_s": 2.5, "rate": 1000.0, "profile": profile}
    [row] = [line for line in _scenario_lines({"freshness": run}) if line.startswith("| freshness")]
    assert "batches of 5,000 records took 1.50 s (p95 1.50 s), loads 0.30 s" in row, row


def _batches(reads: list[int]) -> list[BatchMetrics]:
    return [
        BatchMetrics(batch_id=i, read=n, started_at=10.0 + 2 * i, seconds=1.5, stage_seconds={"bronze": 0.5})
        for i, n in enumerate(reads)
    ]


def test_the_page_says_when_the_producer_outran_the_pipeline() -> None:
    """A slow hour's run read a growing backlog (batches of 62,000 -> 390,000 records): its percentiles
    are the backlog's age, and the page says so instead of reporting them as the pipeline's freshness."""
    from riverhouse_bench.freshness import fell_behind
    from riverhouse_bench.report import _scenario_lines

    behind = freshness_profile(_batches([60_000, 70_000, 120_000, 200_000, 300_000, 390_000, 380_000, 400_000]), [0.1])
    assert behind["records_first_last_quarter"] == [65_000, 390_000]
    assert fell_behind(behind) == (65_000, 390_000)
    run = {"events": 1, "exact": True, "p50_s": 9.0, "p95_s": 20.0, "p99_s": 25.0, "rate": 20_000.0, "profile": behind}
    [row] = [line for line in _scenario_lines({"freshness": run}) if line.startswith("| freshness")]
    assert "fell behind the producer (batches grew from 65,000 to 390,000 records" in row, row

    # Keeping up: batches about the size of a trigger interval's records, the last one the tail.
    steady = freshness_profile(_batches([36_000, 34_000, 33_000, 28_000, 27_000, 25_000, 26_000, 9_000]), [0.1])
    assert fell_behind(steady) is None
    run = {**run, "profile": steady}
    [row] = [line for line in _scenario_lines({"freshness": run}) if line.startswith("| freshness")]
    assert "fell behind" not in row
