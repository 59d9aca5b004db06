"""A table's rows within a time range, read from the files its Delta log chooses: what Delta's own reader returns.

Gold's windowed lookups read silver this way (delta_spark.read_between): Delta's reader rebuilds a
version's state in a Spark job before a filtered scan. The reference here is Delta's reader itself.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import DateType, IntegerType, StringType, StructField, StructType, TimestampType

from riverhouse.platform.state.delta_spark import between, read_at, read_between

pytestmark = pytest.mark.spark

SCHEMA = StructType(
    [
        StructField("k", StringType()),
        StructField("_event_time", TimestampType()),
        StructField("v", IntegerType()),
        StructField("_event_date", DateType()),
    ]
)
DAY0 = datetime(2026, 1, 1, tzinfo=UTC)


def _append(spark: Any, path: str, first: int, hours: list[int]) -> None:
    rows = [
        (f"k{first + i}", DAY0 + timedelta(hours=h), first + i, (DAY0 + timedelta(hours=h)).date())
        for i, h in enumerate(hours)
    ]
    spark.createDataFrame(rows, SCHEMA).write.format("delta").partitionBy("_event_date").mode("append").save(path)


def _rows(frame: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(row) for row in frame.collect())


def test_read_between_returns_what_delta_reads_at_each_version(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "silver")
    _append(spark, path, 0, [1, 5, 23, 25, 30])  # version 0: two days
    _append(spark, path, 10, [2, 26, 49, 50])  # version 1: a third day
    _append(spark, path, 20, [3, 47, 70])  # version 2: a fourth
    spans = [
        (DAY0 + timedelta(hours=4), DAY0 + timedelta(hours=26)),  # cuts into two days
        (DAY0 + timedelta(hours=24), DAY0 + timedelta(hours=24, minutes=59)),  # one day, one file, no row
        (DAY0 - timedelta(days=1), DAY0 + timedelta(days=5)),  # everything
        (DAY0 + timedelta(hours=26), None),  # no end
    ]
    for version in (0, 1, 2):
        delta = read_at(spark, path, version)
        for lo, hi in spans:
            expected = delta.where(between("_event_time", "_event_date", lo, hi))
            got = read_between(spark, path, version, "_event_time", "_event_date", lo, hi)
            assert got.schema == expected.schema  # same columns, same order, the date from the folders
            assert _rows(got) == _rows(expected), (version, lo, hi)
    everything = read_between(spark, path, 2, "_event_time", "_event_date", *spans[2])
    assert len(_rows(everything)) == 12


def test_read_between_with_no_file_in_range_is_empty_with_the_schema(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "silver")
    _append(spark, path, 0, [1, 2])
    later = DAY0 + timedelta(days=30)
    got = read_between(spark, path, 0, "_event_time", "_event_date", later, later + timedelta(hours=1))
    assert got.schema == read_at(spark, path, 0).schema
    assert got.count() == 0
