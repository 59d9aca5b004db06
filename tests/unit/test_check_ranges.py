"""The windowed duplicate-key check reads only what a duplicate of the written rows can be."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from riverhouse.platform.quality.checks import checked_ranges

pytestmark = pytest.mark.unit

H = timedelta(hours=1)


def at(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 1, day, hour, tzinfo=UTC)


def test_each_span_is_widened_by_the_window_and_overlaps_merge() -> None:
    spans = [(at(5, 10), at(5, 11)), (at(1), at(1, 2)), (at(1, 3), at(1, 4))]
    # Jan 1 00:00-02:00 and 03:00-04:00 overlap once widened by an hour; Jan 5 stays apart.
    assert checked_ranges(spans, H) == [(at(1) - H, at(1, 5)), (at(5, 9), at(5, 12))]


def test_nothing_written_checks_nothing() -> None:
    assert checked_ranges([], H) == []
