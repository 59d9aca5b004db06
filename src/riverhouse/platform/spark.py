"""The SparkSession Riverhouse runs on: local by default, any Spark 4 cluster by master URL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def get_spark(master: str = "local[2]", app_name: str = "riverhouse", conf: dict[str, str] | None = None) -> Any:
    """Get (or create) the process's SparkSession with the Kafka source registered."""
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from riverhouse.platform.kafka_source import KafkaDataSource

    log_config = Path(__file__).with_name("log4j2.properties")
    quiet = {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log_config}"}
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULT_CONF, **quiet, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KafkaDataSource)
    return spark
