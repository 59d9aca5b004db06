"""What the engine that writes the class-data archive runs before it exits (runtime/class_archive.py).

An archive holds the classes its JVM loaded. An engine that only started holds Spark's, its
Connect server's and Delta's catalog's, but not those of the work every run's first batch does:
JSON parsing, a window, Parquet's writer, Delta's transaction log, a broadcast anti-join, a streaming query
whose batches a `foreachBatch` body handles. A new engine loaded those (~thousands of classes) from
the jars, parsed and verified them, on its first batch. This runs that work once, on a few hundred
rows in a scratch folder, so the archive holds them too. Only the class set matters: nothing it
writes is kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROWS = 300
TIMEOUT_S = 300
KEYS, STREAM_KEYS = 60, 90  # the table's first write has 60 keys, the stream's batch 90
SCHEMA = "id string, n long, amount decimal(10,2), ts timestamp, tags array<string>"


def train(url: str, scratch: Path) -> None:
    """Run the first-batch work on the engine at `url`, in `scratch` (an empty folder)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from riverhouse.platform.runtime.spark import release_session

    events, stream = _events(scratch / "events", KEYS), _events(scratch / "stream", STREAM_KEYS)
    session = ConnectSession.builder.remote(url).create()
    try:
        silver = str(scratch / "silver")
        _deduplicated(session.read.text(events)).write.format("delta").save(silver)
        query = (  # its batch's keys beyond KEYS are new: appended
            session.readStream.format("text")
            .load(stream)
            .writeStream.foreachBatch(_append_batch(silver))
            .option("checkpointLocation", str(scratch / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        if not query.awaitTermination(TIMEOUT_S):  # a hung stream must not hang `make install`
            query.stop()
            raise RuntimeError(f"the training's streaming query did not end within {TIMEOUT_S} s")
        _joined(session.read.format("delta").load(silver), session.read.text(stream)).collect()
    finally:
        release_session(session)


def _events(folder: Path, keys: int) -> str:
    """A JSON-lines file of ROWS events over `keys` keys, in `folder`."""
    folder.mkdir(parents=True)
    lines = (
        json.dumps({"id": f"k{i % keys}", "n": i, "amount": "1.50", "ts": "2026-01-01T00:00:00Z", "tags": ["a"]})
        for i in range(ROWS)
    )
    (folder / "part-0.json").write_text("\n".join(lines) + "\n")
    return str(folder)


def _deduplicated(raw: Any) -> Any:
    """Parse the JSON lines and keep the last row of each id (a window, as dedup does)."""
    from pyspark.sql.connect import functions as F
    from pyspark.sql.connect.window import Window

    parsed = raw.select(F.from_json("value", SCHEMA).alias("r")).select("r.*")
    latest = Window.partitionBy("id").orderBy(F.col("n").desc())
    return parsed.withColumn("_rn", F.row_number().over(latest)).where("_rn = 1").drop("_rn")


def _joined(silver: Any, raw: Any) -> Any:
    """A LEFT JOIN within a time window, then a sum per key (as gold's join and tally do); 90 rows."""
    from pyspark.sql.connect import functions as F

    right = _deduplicated(raw).select(F.col("id").alias("r_id"), F.col("ts").alias("r_ts"), "amount")
    window = (F.col("r_id") == F.col("id")) & F.col("r_ts").between(
        F.col("ts") - F.expr("INTERVAL 1 HOUR"), F.col("ts")
    )
    return silver.select("id", "ts").join(right, window, "left").groupBy("id").agg(F.sum("amount"))


def _append_batch(silver: str) -> Any:
    def append(batch: Any, batch_id: int) -> None:  # in the engine's foreachBatch worker
        from pyspark.sql.connect import functions as F

        rows = _deduplicated(batch)
        known = batch.sparkSession.read.format("delta").load(silver).select(F.col("id").alias("s_id"))
        fresh = rows.join(F.broadcast(known), F.col("id") == F.col("s_id"), "left_anti")  # as silver's dedup
        fresh.write.format("delta").mode("append").save(silver)

    return append
