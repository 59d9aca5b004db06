"""The batch id joins each micro-batch as data: the generated code stays the same from batch to batch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
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


# Without an engine the body runs in the run's own Spark session: a process of its own here, since
# this one's sessions are the engine's.
IN_PROCESS = """
import json, re, sys
from pyspark.sql import functions as F
from riverhouse.platform.ingest.writer import batch_row
from riverhouse.platform.runtime.spark import get_spark
from riverhouse.platform.state.settings import Settings

spark = get_spark("local[1]", conf=Settings.from_env(sys.argv[1]).spark_conf)
def code(batch_id):
    df = spark.range(0, 100).crossJoin(F.broadcast(batch_row(spark, batch_id)))
    text = spark._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "codegen")
    return re.sub(sys.argv[2], "", text)
first, second = code(123456789), code(987654321)
print(json.dumps({"same": first == second, "literal": "123456789" in first, "local": "LocalTableScan" in first,
                  "rdd": "ExistingRDD" in first}))
"""


def test_in_process_the_batch_id_is_a_local_row_too(tmp_path: Path) -> None:
    """A Python list became an RDD in an in-process session: each write of a batch ran a job to broadcast it."""
    env = {k: v for k, v in os.environ.items() if k not in ("RIVERHOUSE_SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    proc = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, str(tmp_path), IDS.pattern],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"same": True, "literal": False, "local": True, "rdd": False}
