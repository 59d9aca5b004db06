"""The batch id joins each micro-batch as data: the generated code stays the same from batch to batch."""

from __future__ import annotations

import re
from typing import Any

from pyspark.sql import functions as F

from riverhouse.platform.ingest.writer import batch_row

IDS = re.compile(r"#\d+L?|plan_id=\d+|\[id=\d+\]")  # numbered afresh in every plan


def _batch(spark: Any, batch_id: int) -> Any:
    rows = spark.range(0, 100).withColumn("x", F.col("id") * 2)
    return rows.crossJoin(F.broadcast(batch_row(spark, batch_id))).where("x > 1")


def test_under_the_engine_the_batch_id_is_not_in_the_generated_code(spark: Any) -> None:
    first, second = (IDS.sub("", _batch(spark, b)._explain_string(mode="codegen")) for b in (123456789, 987654321))
    # A literal would be written into the code: every batch would compile its stages again.
    assert "123456789" not in first and first == second
    assert "LocalTableScan" in first
    assert _batch(spark, 42).agg(F.min("_batch_id"), F.max("_batch_id"), F.count("*")).first() == (42, 42, 99)


# In-process (no engine), the batch id is a local row too: tests/spark/test_in_process_session.py.
