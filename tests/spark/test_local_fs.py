"""Riverhouse's `file:` file system for Hadoop (runtime/local_fs.py): what Spark gets, and its rename's contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from riverhouse.platform.runtime import local_fs
from riverhouse.platform.runtime.jars import spark_jar_files

# In a process of its own: this one's sessions are the shared engine's, and the checks need the
# session's JVM (an in-process session, as `riverhouse run` makes without an engine).
IN_PROCESS = """
import json, sys
from pathlib import Path
from riverhouse.platform.runtime.spark import get_spark
from riverhouse.platform.state.settings import Settings

spark = get_spark("local[1]", conf=Settings.from_env(sys.argv[1]).spark_conf)
jvm = spark._jvm
conf = spark._jsc.hadoopConfiguration()
root = Path(sys.argv[1]) / "files"
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
table = str(Path(sys.argv[1]) / "table")
for n in range(3):
    spark.range(n * 10, n * 10 + 10).write.format("delta").mode("append").save(table)
query = (spark.readStream.format("rate").option("rowsPerSecond", 100).load().selectExpr("value + 1000 AS id")
         .writeStream.format("delta").option("checkpointLocation", str(Path(sys.argv[1]) / "ckpt"))
         .trigger(once=True).start(table))
query.awaitTermination()
log = sorted(p.name for p in (Path(table) / "_delta_log").iterdir() if not p.name.startswith("."))
found["log"] = [n for n in log if n.endswith(".json")]
found["leftovers"] = [n for n in log if n.endswith(".tmp")]
found["rows"] = spark.read.format("delta").load(table).where("id < 30").count()
found["offsets"] = sorted(p.name for p in (Path(sys.argv[1]) / "ckpt" / "offsets").iterdir() if not p.name.startswith("."))
print(json.dumps(found))
"""


@pytest.mark.skipif(
    not any(j.name == local_fs.JAR_NAME for j in spark_jar_files()),
    reason="riverhouse-hadoop.jar was not built (`make jars` needs a JDK's javac)",
)
def test_sessions_use_the_local_file_system_whose_rename_is_atomic(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RIVERHOUSE_SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    proc = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
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
