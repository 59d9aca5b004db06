"""The SparkSession Riverhouse runs on: local by default, any Spark 4 cluster by master URL."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Small-machine defaults: few shuffle partitions, Arrow for Python <-> JVM.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    # Delta rebuilds a table's snapshot (log replay) in 50 tasks by default: on a 2-core
    # machine that was the largest share of a batch (make bench: 25 s of 61 s); 4 tasks
    # replay the same log in 5 s. A cluster with large logs may raise it in its settings.
    "spark.databricks.delta.snapshotPartitions": "4",
    # Spec SQL runs in these sessions: no `SELECT ... FROM text.`/path`` reads of the driver's files.
    "spark.sql.runSQLOnFiles": "false",
}
# Spark replaces a conf's or a data source option's value with "*********(redacted)" in
# plans, the UI, the event log and its own log lines when the key or the value matches.
# Besides Spark's defaults: the Kafka connector options that hold a secret once Riverhouse
# resolved `${env:...}` (the SASL JAAS line, the client's private key).
REDACTION_CONF: dict[str, str] = {
    "spark.redaction.regex": r"(?i)secret|password|token|access[.]?key|jaas|keystore\.key|ssl\.key",
    "spark.sql.redaction.options.regex": r"(?i)url|jaas|password|secret|token|keystore\.key|ssl\.key",
}


class JavaMissingError(RuntimeError):
    pass


def check_java() -> str:
    """Version line of the Java Spark will use; a clear error when there is none (or too old)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaMissingError(
            "Java was not found. PySpark 4 needs Java 17 or newer: install it "
            "(Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    line = (out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else ""
    try:
        major = int(line.split('"')[1].split(".")[0])
    except (IndexError, ValueError):
        return line
    if major < 17:
        raise JavaMissingError(f"{line}: PySpark 4 needs Java 17 or newer (set JAVA_HOME to one).")
    return line


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    try:
        path = Path(base) / "riverhouse"
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return Path(tempfile.gettempdir())


def local_spark_home(package_dir: Path, version: str = "") -> Path | None:
    """A SPARK_HOME for local mode whose Python workers import pyspark from the installed package.

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on its Python workers' path.
    Python compiles every module it imports from a zip on each import, with no bytecode
    cache, so each worker, planner and streaming-source process spent about 1.3 s (on 2
    cores) compiling pyspark: about 6 s of a cold `riverhouse run`, 1 s of each query
    start. This folder links everything of the pip-installed pyspark but that zip, so
    the workers (the same interpreter, see get_spark) import the very same pyspark from
    site-packages, compiled once at install. None when pyspark is not pip-installed.
    """
    if not (package_dir / "python" / "lib" / "pyspark.zip").exists():
        return None
    digest = hashlib.sha256(f"{package_dir.resolve()}:{version}".encode()).hexdigest()[:12]
    home = _cache_dir() / f"spark-home-{digest}"
    if (home / "bin").exists():
        return home
    building = home.with_name(f"{home.name}.tmp-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    (building / "python" / "lib").mkdir(parents=True)
    for entry in package_dir.iterdir():
        if entry.name != "python":
            (building / entry.name).symlink_to(entry)
    for entry in (package_dir / "python" / "lib").iterdir():
        if entry.name != "pyspark.zip":
            (building / "python" / "lib" / entry.name).symlink_to(entry)
    try:
        building.rename(home)
    except OSError:  # another process made it first
        shutil.rmtree(building, ignore_errors=True)
    return home if (home / "bin").exists() else None


@contextmanager
def _launch_env(master: str) -> Iterator[None]:
    """SPARK_HOME for starting the JVM: the local overlay when it applies, else untouched.

    Only local mode and only when nobody chose a SPARK_HOME or another worker Python:
    cluster managers (YARN) ship `pyspark.zip` to executors from SPARK_HOME.
    """
    import pyspark

    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    overlay = None
    if master.startswith("local") and "SPARK_HOME" not in os.environ and python == sys.executable:
        try:
            overlay = local_spark_home(Path(pyspark.__file__).parent, pyspark.__version__)
        except OSError:
            overlay = None
    if overlay is None:
        yield
        return
    os.environ["SPARK_HOME"] = str(overlay)
    try:
        yield
    finally:
        # The JVM has its own copy; child processes of ours choose for themselves.
        os.environ.pop("SPARK_HOME", None)


def get_spark(master: str = "local[2]", app_name: str = "riverhouse", conf: dict[str, str] | None = None) -> Any:
    """Get (or create) the process's SparkSession: the pinned jars (Kafka connector, Delta), redaction."""
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from riverhouse.platform.runtime.jars import spark_conf

    log_config = Path(__file__).with_name("log4j2.properties")
    quiet = {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log_config}"}
    builder = SparkSession.builder.master(master).appName(app_name)
    # The pinned jars (Spark's Kafka connector, delta-spark) and Delta's extension, on every session.
    for key, value in {**DEFAULT_CONF, **REDACTION_CONF, **spark_conf(), **quiet, **(conf or {})}.items():
        builder = builder.config(key, value)
    with _launch_env(master):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
