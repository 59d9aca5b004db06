"""Riverhouse's own JVM classes (jvm/src/riverhouse/*), compiled at install into jvm/lib/spark.

Two jars, each from one package and against the jars of pyspark/jars its classes need:

- `riverhouse-hadoop.jar` (jvm/src/riverhouse/hadoop, against Hadoop's client API): Hadoop's
  local file system without a child process per rename (runtime/local_fs.py);
- `riverhouse-json.jar` (jvm/src/riverhouse/json, against Jackson and Spark's SQL jars): a session
  extension with two SQL functions over a record's bytes, one strict pass that spares most records
  the variant parse (`riverhouse_json_sure`) and Spark's `from_json` without its per-record reader
  (`riverhouse_from_json`) (ingest/parse.py, `has_json_functions`).

Best effort, as both only make things faster: without a JDK's javac neither is made, sessions
keep Hadoop's classes, every record gets the variant parse and `from_json` (the same results).
`make jars` runs `python -m riverhouse.platform.runtime.jvm_build build jvm/lib/spark`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from riverhouse.platform.runtime.jars import JSON_JAR, spark_jar_files
from riverhouse.platform.runtime.local_fs import JAR_NAME as HADOOP_JAR

SOURCES = Path(__file__).resolve().parents[4] / "jvm" / "src" / "riverhouse"
# The pyspark/jars files riverhouse-json.jar's classes compile against (docker/Dockerfile fetches
# the same artifacts at pyspark's versions: tests/unit/test_docker_wiring.py).
JSON_API = (
    "jackson-core-*.jar",
    "jackson-databind-*.jar",
    "spark-sql_*.jar",
    "spark-catalyst_*.jar",
    "spark-sql-api_*.jar",
    "spark-unsafe_*.jar",
    "spark-common-utils_*.jar",
    "scala-library-*.jar",
    "kryo-shaded-*.jar",
)
# jar -> (its package under jvm/src/riverhouse, the pyspark/jars files its classes compile against)
JARS = {
    HADOOP_JAR: ("hadoop", ("hadoop-client-api-*.jar",)),
    JSON_JAR: ("json", JSON_API),
}


def in_spark_jars(jar: str) -> bool:
    """Was this jar of Riverhouse's own built into the Spark jars that sessions get?"""
    return any(j.name == jar for j in spark_jar_files())


def _javac() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").exists():
        return str(Path(java_home) / "bin" / "javac")
    return shutil.which("javac")


def build(out_dir: Path) -> list[Path]:
    """Compile each package into `out_dir`/<jar>; the jars made (why not the others: on stderr)."""
    import pyspark

    javac = _javac()
    if javac is None:
        print("    no javac (a JDK's compiler) found: Riverhouse's own classes are not built", file=sys.stderr)
        return []
    made = []
    shipped = Path(pyspark.__file__).parent / "jars"
    for jar, (package, api_globs) in JARS.items():
        found = {pattern: sorted(shipped.glob(pattern)) for pattern in api_globs}
        api = [str(paths[-1]) for paths in found.values() if paths]
        sources = sorted(str(p) for p in (SOURCES / package).rglob("*.java"))
        if len(api) < len(api_globs) or not sources:
            absent = ", ".join(pattern for pattern, paths in found.items() if not paths) or "none"
            print(
                f"    {jar}: nothing to compile (sources: {len(sources)}; absent from pyspark/jars: {absent})",
                file=sys.stderr,
            )
            continue
        with tempfile.TemporaryDirectory(prefix="riverhouse-javac-") as classes:
            cmd = [javac, "--release", "17", "-nowarn", "-cp", os.pathsep.join(api), "-d", classes, *sources]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"    {jar}: javac failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            target = Path(out_dir) / jar
            with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(Path(classes).rglob("*.class")):
                    archive.write(path, path.relative_to(classes).as_posix())
        made.append(target)
    return made


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        built = build(Path(sys.argv[2]))
        print(f"    built: {', '.join(j.name for j in built) or 'nothing'} (Riverhouse's own classes)")
    else:
        sys.exit("usage: python -m riverhouse.platform.runtime.jvm_build build FOLDER")
