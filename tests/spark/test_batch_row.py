"""The batch id is a value of each micro-batch's rows: the generated code stays the same from batch to batch."""

from __future__ import annotations

import re
from typing import Any

from pyspark.sql import functions as F

from riverhouse.platform.ingest.writer import batch_id_column

GENERATED = re.compile(r"^/\* \d+ \*/")  # a line of generated source in an explain's codegen text


def _batch(spark: Any, batch_id: int, column: Any = None) -> Any:
    rows = spark.range(0, 100).withColumn("x", F.col("id") * 2)
    column = batch_id_column(batch_id) if column is None else column
    return rows.select("*", column.alias("_batch_id")).where("x > 1")


def _code(frame: Any) -> str:
    """The Java source Spark generates for the plan (not the plan's text, which names every value)."""
    text = frame._explain_string(mode="codegen")
    return "\n".join(line for line in text.splitlines() if GENERATED.match(line))


def test_under_the_engine_the_batch_id_is_not_in_the_generated_code(spark: Any) -> None:
    first, second = (_code(_batch(spark, b)) for b in (123456789, 987654321))
    # A literal would be written into the code: every batch would compile its stages again.
    assert first and "123456789" not in first and first == second
    literal = [_code(_batch(spark, b, F.lit(b))) for b in (123456789, 987654321)]
    assert "123456789" in literal[0] and literal[0] != literal[1]  # what the check above would see
    assert _batch(spark, 42).agg(F.min("_batch_id"), F.max("_batch_id"), F.count("*")).first() == (42, 42, 99)
    assert dict(_batch(spark, 7).dtypes)["_batch_id"] == "bigint"


# In-process (no engine), the compilations themselves are counted: tests/spark/test_in_process_session.py.
