"""An in-process Spark session (`riverhouse run` without an engine): what it shares with the engine's.

One process for the module (a JVM of its own: this process's sessions are the shared engine's),
its findings checked by the tests below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from riverhouse.platform.runtime import local_fs
from riverhouse.platform.runtime.jvm_build import in_spark_jars

SCRIPT = """
import json, sys
from pathlib import Path
from pyspark.sql import functions as F
from riverhouse.platform.ingest.writer import batch_id_column
from riverhouse.platform.runtime.spark import get_spark
from riverhouse.platform.state.settings import Settings

home = sys.argv[1]
spark = get_spark("local[1]", conf=Settings.from_env(home).spark_conf)


def jobs_so_far(store):
    # The status store learns of jobs from the listener bus, on a thread of its own: drain it first, or a
    # job that just ended may be counted after the next mark.
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    return store.jobsList(None).size()


def batch_id_compilations():
    # Janino compilations and Spark jobs of a write whose rows carry the batch id, batch after batch.
    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics
    store = spark.sparkContext._jsc.sc().statusStore()
    rows = spark.range(0, 1000).withColumn("x", F.col("id") * 2)

    def write(column):
        compiled, jobs = metrics.METRIC_COMPILATION_TIME().getCount(), jobs_so_far(store)
        frame = rows if column is None else rows.select("*", column.alias("_batch_id"))
        frame.where("x > 1").write.format("noop").mode("overwrite").save()
        return metrics.METRIC_COMPILATION_TIME().getCount() - compiled, jobs_so_far(store) - jobs

    write(None), write(batch_id_column(1)), write(F.lit(1))  # each plan's first compilations
    found = {"none": write(None), "ours": [write(batch_id_column(b)) for b in (123456789, 987654321)]}
    found["literal"] = [write(F.lit(b)) for b in (123456789, 987654321)]
    values = rows.select(batch_id_column(42).alias("b")).agg(F.min("b"), F.max("b"), F.count("*")).first()
    return {**found, "values": list(values)}


def local_fs():
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    root = Path(home) / "files"
    root.mkdir()
    uri = jvm.java.net.URI("file:///")
    fc = jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf)
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf)
    found = {"context": fc.getDefaultFileSystem().getClass().getName(),
             "filesystem": fs.getClass().getName(), "raw": fs.getRawFileSystem().getClass().getName()}

    def rename(src, dst, overwrite):
        options = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
        options[0] = jvm.org.apache.hadoop.fs.Options.Rename.OVERWRITE if overwrite else jvm.org.apache.hadoop.fs.Options.Rename.NONE
        try:
            fc.rename(jvm.org.apache.hadoop.fs.Path(str(root / src)), jvm.org.apache.hadoop.fs.Path(str(root / dst)), options)
            return "renamed"
        except Exception as exc:
            text = str(exc)
            return next((n for n in ("FileAlreadyExistsException", "FileNotFoundException") if n in text), text[:300])

    (root / "a.tmp").write_text("A")
    (root / "b.json").write_text("B")
    found["onto_existing"] = rename("a.tmp", "b.json", False)
    found["after_refusal"] = {p.name: p.read_text() for p in sorted(root.iterdir())}
    found["to_new_name"] = rename("a.tmp", "c.json", False)
    found["after_rename"] = {p.name: p.read_text() for p in sorted(root.iterdir())}
    found["missing_source"] = rename("gone.tmp", "d.json", False)
    (root / "e.tmp").write_text("E")
    found["overwrite"] = rename("e.tmp", "b.json", True)
    found["after_overwrite"] = {p.name: p.read_text() for p in sorted(root.iterdir())}

    # Delta's log and a streaming checkpoint commit through it: versions in order, no file left over.
    table = str(Path(home) / "table")
    for n in range(3):
        spark.range(n * 10, n * 10 + 10).write.format("delta").mode("append").save(table)
    query = (spark.readStream.format("rate").option("rowsPerSecond", 100).load().selectExpr("value + 1000 AS id")
             .writeStream.format("delta").option("checkpointLocation", str(Path(home) / "ckpt"))
             .trigger(once=True).start(table))
    query.awaitTermination()
    log = sorted(p.name for p in (Path(table) / "_delta_log").iterdir() if not p.name.startswith("."))
    found["log"] = [n for n in log if n.endswith(".json")]
    found["leftovers"] = [n for n in log if n.endswith(".tmp")]
    found["rows"] = spark.read.format("delta").load(table).where("id < 30").count()
    found["offsets"] = sorted(p.name for p in (Path(home) / "ckpt" / "offsets").iterdir() if not p.name.startswith("."))
    return found


def delta_appends():
    # Spark jobs per append_once in a process whose zone is not UTC (the test sets TZ).
    from riverhouse.platform.state.delta_spark import append_once

    store = spark.sparkContext._jsc.sc().statusStore()
    table = str(Path(home) / "appends")
    spark.range(0).write.format("delta").mode("append").save(table)
    jobs = []
    for batch in range(3):
        before = jobs_so_far(store)
        append_once(spark.range(batch * 10, batch * 10 + 10), table, "zone_test", batch)
        jobs.append(jobs_so_far(store) - before)
    zone = spark._jvm.java.util.TimeZone.getDefault().getID()
    return {"jobs": jobs, "zone": zone, "user_timezone": spark._jvm.java.lang.System.getProperty("user.timezone")}


def column_round_trips():
    # py4j round trips to build a Column expression (a small batch builds ~130 of them), after a first one.
    # Only this thread's: py4j's finalizer thread sends the deletes of objects Python freed earlier
    # whenever it wakes (once a second), on connections of its own.
    import threading
    import py4j.clientserver as cs

    calls = []
    send = cs.ClientServerConnection.send_command
    me = threading.get_ident()

    def counted(self, command):
        if threading.get_ident() == me:
            calls.append(command)
        return send(self, command)

    cs.ClientServerConnection.send_command = counted
    try:
        F.abs(F.col("id"))
        before = len(calls)
        F.abs(F.col("id"))
        return {"column": len(calls) - before}
    finally:
        cs.ClientServerConnection.send_command = send


collectors = [b.getName() for b in spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()]
print(json.dumps({"batch_id": batch_id_compilations(), "local_fs": local_fs(), "delta_appends": delta_appends(),
                  "round_trips": column_round_trips(), "collectors": collectors}))
"""


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("in_process")
    env = {k: v for k, v in os.environ.items() if k not in ("RIVERHOUSE_SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env["TZ"] = "America/Los_Angeles"  # a machine outside UTC, as most users' are
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(home)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_in_process_the_batch_id_compiles_nothing_and_runs_no_job(in_process: dict[str, Any]) -> None:
    """A literal batch id makes Spark compile the write's code again every batch; the joined one-row
    frame it replaced cost a broadcast job per batch. Each write here is one job, as without a batch id."""
    found = in_process["batch_id"]
    assert found["none"] == [0, 1]
    assert found["ours"] == [[0, 1], [0, 1]]
    assert all(compiled > 0 for compiled, _ in found["literal"])  # what the count above would see
    assert found["values"] == [42, 42, 1000]


@pytest.mark.skipif(
    not in_spark_jars(local_fs.JAR_NAME),
    reason="riverhouse-hadoop.jar was not built (`make jars` needs a JDK's javac)",
)
def test_sessions_use_the_local_file_system_whose_rename_is_atomic(in_process: dict[str, Any]) -> None:
    found = in_process["local_fs"]
    # Hadoop resolves `file:` to Riverhouse's classes, under FileContext (checkpoints, Delta's
    # log) and FileSystem (the files tasks write).
    assert found["context"] == "riverhouse.hadoop.LocalFs"
    assert found["filesystem"] == "riverhouse.hadoop.LocalFileSystem"
    assert found["raw"] == "riverhouse.hadoop.RawLocalFileSystem"
    # A commit never replaces a file that exists: the refused rename leaves both files as they were.
    assert found["onto_existing"] == "FileAlreadyExistsException"
    assert found["after_refusal"] == {"a.tmp": "A", "b.json": "B"}
    assert found["to_new_name"] == "renamed"
    assert found["after_rename"] == {"b.json": "B", "c.json": "A"}
    assert found["missing_source"] == "FileNotFoundException"
    assert found["overwrite"] == "renamed"
    assert found["after_overwrite"] == {"b.json": "E", "c.json": "A"}
    assert found["log"] == [f"{v:020d}.json" for v in range(4)]
    assert found["leftovers"] == []
    assert found["rows"] == 30
    assert found["offsets"] == ["0"]


def test_on_a_machine_outside_utc_an_append_is_one_spark_job(in_process: dict[str, Any]) -> None:
    """The driver's JVM runs in UTC whatever the machine's zone: in another zone Delta 4.4 rebuilt the
    table's state after every commit to check its checksum, a second Spark job per append."""
    found = in_process["delta_appends"]
    assert found["jobs"] == [1, 1, 1]
    assert (found["zone"], found["user_timezone"]) == ("UTC", "UTC")


def test_in_process_a_column_costs_no_call_site_round_trips(in_process: dict[str, Any]) -> None:
    """PySpark's DataFrame call-site capture is off (runtime/spark.py): with it, each Column function
    looked the origin class up and set and cleared it over py4j, ~8 more round trips each."""
    # col and abs: the class, the member and the call each (16 with the capture on)
    assert in_process["round_trips"]["column"] == 6


def test_an_in_process_local_session_collects_with_the_throughput_collector(in_process: dict[str, Any]) -> None:
    """Its JVM is the driver and the executors: ParallelGC, not G1, whose concurrent marking took ~11%
    of a large-batch dedup run's CPU (runtime/collector.py LOCAL_COLLECTOR). The test's JAVA_TOOL_OPTIONS
    choose no collector, so Riverhouse's is used."""
    assert sorted(in_process["collectors"]) == ["PS MarkSweep", "PS Scavenge"]
