"""spark_plain's and small_batches' arithmetic, and the fast/warm-engine targets (issues 25, 26)."""

from __future__ import annotations

import pytest

from riverhouse.platform.ingest.writer import BatchMetrics
from riverhouse.platform.pipeline import batch_line
from riverhouse_bench.batches import batch_figures, batch_lines
from riverhouse_bench.common import orders_spec
from riverhouse_bench.plain import plain_schema, progress_figures
from riverhouse_bench.results import plain_ratio, targets

pytestmark = pytest.mark.unit


def _verdict(scenarios: dict, start: str) -> tuple[str, str, bool | None]:
    [match] = [(m, v, ok) for name, m, v, ok in targets({"scenarios": scenarios}) if name.startswith(start)]
    return match


def test_the_plain_jobs_schema_is_the_orders_fields_with_their_types() -> None:
    assert plain_schema() == "order_id STRING, user_id STRING, amount INT, price DOUBLE, created_at TIMESTAMP"


def test_progress_figures_time_the_run_from_its_first_trigger_with_rows() -> None:
    started_at = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    progress = [
        {"timestamp": "2027-01-15T08:00:02.500Z", "numInputRows": 7000, "durationMs": {"triggerExecution": 2400}},
        {"timestamp": "2027-01-15T08:00:05.000Z", "numInputRows": 3000, "durationMs": {"triggerExecution": 1500}},
        {"timestamp": "2027-01-15T08:00:06.600Z", "numInputRows": 0, "durationMs": {"triggerExecution": 100}},
    ]
    figures = progress_figures(progress, started_at, started_at + 7.0)
    assert figures["read"] == 10_000 and figures["batches"] == 2
    assert figures["query_startup_s"] == 2.5
    assert figures["steady_seconds"] == 4.5  # 7.0 - 2.5
    assert figures["batch_s"] == [2.4, 1.5]  # the empty last trigger is not a batch
    assert progress_figures([], started_at, started_at + 1)["batches"] == 0


def test_batch_lines_read_the_engines_own_progress_line() -> None:
    spec = orders_spec("p", "t")
    line = batch_line(spec, BatchMetrics(batch_id=12, read=7_000, inserted=6_400, duplicates_dropped=600, seconds=1.23))
    [parsed] = batch_lines([(5.0, line), (5.5, "loaded 6,400 rows into ClickHouse")])
    assert parsed == {"batch_id": 12, "read": 7_000, "s": 1.2, "at": 5.0}


def test_batch_figures_prefer_the_summarys_seconds_and_keep_cycles_seen_live() -> None:
    lines = [
        (10.0 + 2 * i, f"batch {i}: read 7,000, quarantined 0, duplicates dropped 0, inserted 7,000 (1.5s)")
        for i in range(4)
    ]
    lines.append((18.5, "batch 4: read 0, quarantined 0, duplicates dropped 0, inserted 0 (0.1s)"))
    from_log = batch_figures({}, lines)
    assert from_log["batches"] == 4  # the empty batch is left out
    assert from_log["per_batch_s"] == [1.5, 1.5, 1.5, 1.5] and from_log["batch_s_from"].startswith("log")
    assert from_log["cycle_s"]["p50"] == 2.0
    exact = batch_figures({"batch_seconds": [1.234, 1.5, 1.75, 1.125]}, lines)
    assert exact["batch_s_from"] == "summary" and exact["batch_s"]["max"] == 1.75
    # Lines that all arrive when the run ends say nothing about the cycle.
    late = [(30.0 + 0.001 * i, text) for i, (_, text) in enumerate(lines)]
    assert batch_figures({}, late)["cycle_s"] is None


def test_the_plain_ratio_and_the_fast_engine_targets() -> None:
    scenarios = {
        "riverhouse_dedup": {"events_per_s": 10_000.0, "events_per_s_excluding_startup": 64_000.0},
        "spark_plain": {"events_per_s": 40_000.0, "events_per_s_excluding_startup": 75_000.0},
        "small_batches": {"records_per_batch": 7_000, "median_batch_s": 1.25},
    }
    assert plain_ratio(scenarios) == {"warm": 0.8533, "cold": 0.25}
    assert _verdict(scenarios, "riverhouse_dedup steady >= 0.8x spark_plain") == ("0.85x", "met", True)
    assert _verdict(scenarios, "riverhouse_dedup >= 60,000")[2] is True
    assert _verdict(scenarios, "small_batches: a 7,000-record batch") == ("1.25 s", "missed: 80% of the target", False)
    assert plain_ratio({"riverhouse_dedup": {"events_per_s": 1.0}}) == {"warm": None, "cold": None}


def test_triggered_start_is_judged_on_the_warm_runs_only() -> None:
    cold_only = {"triggered_start": {"p50_first_batch_s": None, "cold_p50_first_batch_s": 25.0}}
    assert _verdict(cold_only, "triggered_start: trigger -> first batch in silver <= 3 s") == ("not measured", "", None)
    warm = {"triggered_start": {"p50_first_batch_s": 2.5, "p95_first_batch_s": 6.0}}
    assert _verdict(warm, "triggered_start: trigger -> first batch in silver <= 3 s")[2] is True
    assert _verdict(warm, "triggered_start: trigger -> first batch in silver <= 5 s p95")[1:] == (
        "missed: 83% of the target",
        False,
    )


def test_the_page_shows_the_ratio_the_batch_seconds_and_the_missing_warm_runs() -> None:
    from riverhouse_bench.sections import engine_lines, triggered_lines

    scenarios = {
        "riverhouse_dedup": {"events": 550_000, "events_per_s": 9_000.0, "events_per_s_excluding_startup": 17_000.0},
        "spark_plain": {"events": 550_000, "events_per_s": 37_600.0, "events_per_s_excluding_startup": 75_700.0},
        "small_batches": {
            "events": 140_000,
            "records_per_batch": 7_000,
            "batches": 20,
            "batch_s": {"p50": 6.1, "p95": 7.4, "max": 7.9},
            "batch_s_from": "summary",
            "cycle_s": None,
            "warmup": {"batches": 5},
            "seconds": 131.0,
            "query_startup_s": 9.5,
            "load_seconds": 20.0,
        },
        "triggered_start": {
            "events_per_run": 7_000,
            "engine": None,
            "cold": {"runs": 2, "spread": {"first_batch_s": {"p50": 21.5, "p95": 24.0}}},
            "warm": None,
            "warm_skipped": "no warm engine: set RIVERHOUSE_SPARK_REMOTE",
        },
    }
    page = "\n".join(engine_lines(scenarios) + triggered_lines(scenarios))
    assert "riverhouse_dedup / spark_plain: 0.22x warm, 0.24x cold." in page
    assert "| batch s | 6.10 | 7.40 | 7.90 |" in page and "| cycle s | - | - | - |" in page
    assert "| trigger -> first batch committed in silver | 21.50 | 24.00 | - | - |" in page
    assert "Warm runs not measured: no warm engine" in page
    assert engine_lines({}) == [] and triggered_lines({}) == []
