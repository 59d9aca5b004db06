"""What a micro-batch and a gold run ask of the engine beyond their jobs, and what they cache.

Under Spark Connect every schema lookup, `persist` and streaming check is a round trip in which
the engine analyses the batch's plan (20-100 ms each, bench/analysis.md). A batch body asks only
to cache what two jobs read (its rows; the dedup's aggregate when silver is looked up) and to
release it. The rows written are checked too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from riverhouse.platform.faults import FaultPlan
from riverhouse.platform.ingest.parse import parse_records
from riverhouse.platform.ingest.stream import ensure_source_tables
from riverhouse.platform.ingest.writer import BatchWriter
from riverhouse.platform.runtime.spark import is_connect
from riverhouse.platform.state.checkpoints import BatchChannel
from riverhouse.platform.state.delta_spark import observe_batch
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import orders_spec

pytestmark = pytest.mark.spark
T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


@pytest.fixture
def analysed(spark: Any) -> Iterator[list[str]]:
    """The methods of every plan-analysis request the client sends the engine while the test runs."""
    if not is_connect(spark):
        pytest.skip("round trips to the engine: Spark Connect only (RIVERHOUSE_TEST_ENGINE=local runs in-process)")
    from pyspark.sql.connect.client.core import SparkConnectClient

    calls: list[str] = []
    original = SparkConnectClient._analyze

    def counting(self: Any, method: str, **kwargs: Any) -> Any:
        calls.append(method)
        return original(self, method, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SparkConnectClient, "_analyze", counting)
        yield calls


def kafka_batch(spark: Any, ids: list[str], first_offset: int) -> Any:
    """A parsed micro-batch as the streaming query hands it to the body: orders 100 ms apart."""
    values = [
        json.dumps(
            {
                "order_id": order_id,
                "user_id": "u1",
                "amount": 1,
                "price": 9.5,
                "created_at": (T0 + timedelta(milliseconds=100 * (first_offset + i))).isoformat(),
            }
        ).encode()
        for i, order_id in enumerate(ids)
    ]
    n = len(values)
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    table = pa.table(
        {
            "topic": ["orders"] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "timestamp": pa.array([T0] * n, pa.timestamp("us", tz="UTC")),
            "key": pa.array([i.encode() for i in ids], pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.array([[]] * n, headers),
        }
    )
    spec = orders_spec("round_trips")
    return parse_records(spark.createDataFrame(table), spec.sink_source)


def test_a_batch_body_asks_the_engine_only_to_cache_and_release_its_rows(
    spark: Any, analysed: list[str], tmp_path: Path
) -> None:
    spec = orders_spec("round_trips")
    layout = TableLayout(Settings.from_env(tmp_path / "home").warehouse, spec.name)
    ensure_source_tables(spark, spec, layout, spec.sink_source_name)
    channel = BatchChannel(tmp_path / "checkpoint", run="r1")
    writer = BatchWriter(spec, spec.sink_source_name, layout, "app", channel, FaultPlan())

    # An empty silver: the batch's rows are cached and released, and nothing else is asked (no
    # schema lookup, no streaming check; the dedup's aggregate is read once, by the append).
    first = kafka_batch(spark, [f"o{i:04d}" for i in range(40)], 0)
    analysed.clear()
    assert writer._process(first, 0).inserted == 40
    assert sorted(analysed) == ["persist", "unpersist"]

    # Duplicates of the newest rows silver holds, and new keys: silver's last file is looked up,
    # so the aggregate is read twice (the lookup's semi join, the append) and cached too.
    second = kafka_batch(spark, [*(f"o{i:04d}" for i in range(30, 60)), "o0045"], 40)
    analysed.clear()
    metrics = writer._process(second, 1)
    assert (metrics.inserted, metrics.duplicates_dropped) == (20, 11)
    assert sorted(analysed) == ["persist", "persist", "unpersist", "unpersist"]

    # Keys past every silver file's range, one of them twice in the batch: no lookup, one cache.
    third = kafka_batch(spark, [*(f"o{i:04d}" for i in range(60, 80)), "o0070"], 71)
    analysed.clear()
    metrics = writer._process(third, 2)
    assert (metrics.inserted, metrics.duplicates_dropped) == (20, 1)
    assert sorted(analysed) == ["persist", "unpersist"]

    ids = open_table(layout.silver(spec.sink_source_name)).to_pyarrow_table(columns=["order_id"]).column("order_id")
    assert sorted(ids.to_pylist()) == [f"o{i:04d}" for i in range(80)]


def test_an_observed_write_of_a_batch_skips_the_streaming_check_and_still_gets_its_metrics(
    spark: Any, analysed: list[str], tmp_path: Path
) -> None:
    from pyspark.errors import PySparkAssertionError
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    rows = spark.range(0, 25).withColumn("even", (F.col("id") % 2) == 0)
    observation = Observation("rh_test_observe_batch")
    observed = observe_batch(rows, observation, [F.count(F.lit(1)).alias("n"), F.sum(F.col("even").cast("int"))])
    observed.write.format("parquet").save(str(tmp_path / "out"))
    assert "is_streaming" not in analysed
    assert observation.get == {"n": 25, "sum(CAST(even AS INT))": 13}
    with pytest.raises(PySparkAssertionError, match="REUSE_OBSERVATION"):
        observe_batch(rows, observation, [F.count(F.lit(1))])


def test_a_gold_run_caches_its_candidates_and_its_rows_and_releases_both(
    spark: Any, analysed: list[str], tmp_path: Path
) -> None:
    """The driving events a gold run considers are read by two jobs (their counts, the join): cached
    once, so silver's new files are read and their duplicates dropped once; released after."""
    from riverhouse.platform.gold.joins import gold_path, run_gold
    from tests.integration.test_joins import join_spec
    from tests.spark.test_gold_run import TOPICS, append, emitted, order, user

    spec = join_spec(TOPICS, "left", name="gold_round_trips")
    settings = Settings.from_env(tmp_path / "home")
    layout = TableLayout(settings.warehouse, spec.name)
    append(spark, spec, layout, "users", [user("e1", "u1", "A", "10:00")], 0)
    append(spark, spec, layout, "orders", [order("o1", "u1", "10:30"), order("o2", "u2", "10:40")], 0)
    run_gold(spark, spec, settings, drain=True)  # creates gold's tables (their schema is analysed once)

    append(spark, spec, layout, "orders", [order("o3", "u1", "10:50")], 10)
    analysed.clear()
    result = run_gold(spark, spec, settings, drain=True)
    assert (result.processed, result.matched) == (1, 1)
    assert sorted(analysed) == ["persist", "persist", "unpersist", "unpersist"]
    assert emitted(spark, gold_path(layout, spec)) == [("o1", "A"), ("o2", None), ("o3", "A")]
