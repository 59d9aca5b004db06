"""Which of the bench's steady runs is reported: the median one, the lower of an even count."""

from __future__ import annotations

import pytest

from riverhouse_bench.common import median_run

pytestmark = pytest.mark.unit


def runs(*seconds: float) -> list[dict[str, float]]:
    return [{"steady_seconds": s, "order": i} for i, s in enumerate(seconds)]


def test_an_odd_count_reports_the_middle_run() -> None:
    assert median_run(runs(9.0, 5.0, 7.0), "steady_seconds") == {"steady_seconds": 7.0, "order": 2}


def test_an_even_count_reports_the_lower_of_the_two_middle_runs() -> None:
    assert median_run(runs(6.0, 4.0), "steady_seconds")["steady_seconds"] == 4.0
    assert median_run(runs(8.0, 2.0, 6.0, 4.0), "steady_seconds")["steady_seconds"] == 4.0


def test_one_run_is_its_own_median() -> None:
    assert median_run(runs(3.5), "steady_seconds")["order"] == 0
