"""The bench's targets: which run each target reads, and the verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from riverhouse_bench.results import targets

pytestmark = pytest.mark.unit


def _verdicts(scenarios: dict) -> dict[str, tuple[str, str, bool | None]]:
    return {name: (measured, verdict, met) for name, measured, verdict, met in targets({"scenarios": scenarios})}


def _find(verdicts: dict, start: str) -> tuple[str, str, bool | None]:
    [match] = [v for name, v in verdicts.items() if name.startswith(start)]
    return match


def test_query_vs_final_is_judged_at_the_largest_raw_row_count() -> None:
    verdicts = _verdicts(
        {
            "query_vs_final": {"events": 220_000, "speedup": 1.2},
            "query_vs_final_2000000": {"events": 2_200_000, "speedup": 3.5},
        }
    )
    measured, verdict, met = _find(verdicts, "query_vs_final")
    assert measured == "3.5x" and verdict == "met" and met is True
    assert "2,200,000 raw rows" in next(n for n in verdicts if n.startswith("query_vs_final"))


def test_dedup_state_uses_the_largest_key_count_and_lower_is_better() -> None:
    verdicts = _verdicts(
        {
            "dedup_state": {"keys": 1_000_000, "bytes_per_key": 400.0},
            "dedup_state_10000000": {"keys": 10_000_000, "bytes_per_key": 125.0},
        }
    )
    measured, verdict, met = _find(verdicts, "dedup_state")
    assert (measured, verdict, met) == ("125.0 bytes/key", "missed: 80% of the target", False)


def test_a_target_missed_by_a_hair_does_not_read_as_one_hundred_percent() -> None:
    verdicts = _verdicts({"small_batches": {"median_batch_s": 1.001}, "freshness": {"p95_s": 3.004}})
    assert _find(verdicts, "small_batches:") == ("1.00 s", "missed: 99.9% of the target (1.001)", False)
    assert _find(verdicts, "freshness p95")[1:] == ("missed: 99.9% of the target (3.004)", False)
    assert _find(_verdicts({"small_batches": {"median_batch_s": 1.25}}), "small_batches:")[1] == (
        "missed: 80% of the target"
    )


def test_scale_ratio_cluster_and_unmeasured_targets() -> None:
    verdicts = _verdicts(
        {
            "scale_local": {"ratio": 1.36},
            "cluster": {"exact": True, "tasks_by_executor": {"0": 40, "1": 38}, "events_per_s_excluding_startup": 5e4},
        }
    )
    assert _find(verdicts, "scale_local")[1:] == ("missed: 80% of the target", False)
    assert _find(verdicts, "standalone cluster")[:2] == ("2 executors, 50,000 events/s", "met")
    assert _find(verdicts, "riverhouse_dedup >= 100,000") == ("not measured", "", None)
    broken = _verdicts({"cluster": {"error": "RuntimeError: no worker", "exact": False}})
    assert _find(broken, "standalone cluster")[2] is False


def test_the_product_never_imports_the_bench() -> None:
    """The bench lives in bench/, outside the installed package: no module of the product imports it."""
    src = Path(__file__).resolve().parents[2] / "src" / "riverhouse"
    importers = [
        p
        for p in src.rglob("*.py")
        if "import riverhouse_bench" in p.read_text() or "from riverhouse_bench" in p.read_text()
    ]
    assert importers == []
    assert not (src / "bench.py").exists()
