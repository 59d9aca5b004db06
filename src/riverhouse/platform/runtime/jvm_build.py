"""Riverhouse's own JVM classes (jvm/src/riverhouse/*), compiled at install into jvm/lib/spark.

Two jars, each from one package and against the jar of pyspark/jars its classes need:

- `riverhouse-hadoop.jar` (jvm/src/riverhouse/hadoop, against Hadoop's client API): Hadoop's
  local file system without a child process per rename (runtime/local_fs.py);
- `riverhouse-json.jar` (jvm/src/riverhouse/json, against Jackson): one strict pass per record,
  which spares most records the variant parse (ingest/parse.py, `_surely_strict`).

Best effort, as both only make things faster: without a JDK's javac neither is made, sessions
keep Hadoop's classes and every record gets the variant parse (the same results).
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

from riverhouse.platform.runtime.jars import spark_jar_files
from riverhouse.platform.runtime.local_fs import JAR_NAME as HADOOP_JAR

JSON_JAR = "riverhouse-json.jar"
SOURCES = Path(__file__).resolve().parents[4] / "jvm" / "src" / "riverhouse"
# jar -> (its package under jvm/src/riverhouse, the pyspark/jars file its classes compile against)
JARS = {
    HADOOP_JAR: ("hadoop", "hadoop-client-api-*.jar"),
    JSON_JAR: ("json", "jackson-core-*.jar"),
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
    for jar, (package, api_glob) in JARS.items():
        api = sorted((Path(pyspark.__file__).parent / "jars").glob(api_glob))
        sources = sorted(str(p) for p in (SOURCES / package).rglob("*.java"))
        if not api or not sources:
            print(f"    {jar}: nothing to compile (sources: {len(sources)}, {api_glob}: {len(api)})", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory(prefix="riverhouse-javac-") as classes:
            cmd = [javac, "--release", "17", "-nowarn", "-cp", str(api[-1]), "-d", classes, *sources]
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
