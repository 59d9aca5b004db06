"""Riverhouse's `file:` file system for Hadoop (jvm/src/riverhouse/hadoop): built at install, set in every session.

Without Hadoop's native library, Hadoop's local file system starts a child process for two
things Spark and Delta do on every commit and every new file: `readlink`, twice per rename
(Spark's streaming checkpoint, Delta's commit and checksum files, each renamed from a temporary
file), and `chmod` for each file a task creates. In the driver of a steady 7,000-record batch
that was ~0.25 s of ~1.4 (bench/analysis.md). The classes under jvm/src/riverhouse/hadoop are
Hadoop's local file system with those two steps done through java.nio: a rename made with
`link(2)` (atomic, and it refuses a name that exists, which Hadoop's check-then-rename only
approximates) and permissions set without a process.

`make jars` compiles them into jvm/lib/spark/riverhouse-hadoop.jar (runtime/jvm_build.py: javac,
against pyspark's own Hadoop). Best effort: without a JDK's javac the jar is not made, and
sessions keep Hadoop's classes (the same results, more processes).

Local mode only (runtime/spark.session_conf): Hadoop resolves `file:` while spark-submit starts,
before `spark.jars` are loaded, so the jar must be on the driver JVM's own class path, and in
local mode the executors are that JVM. A cluster's executors keep Hadoop's classes: their class
path is the cluster's, and a cluster's tables live in a shared store (s3a:, hdfs:) anyway.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

JAR_NAME = "riverhouse-hadoop.jar"
# Hadoop reads the class of a scheme's file system from these settings (spark.hadoop.* reach
# every Hadoop configuration Spark makes, on the driver and the executors).
CONF = {
    "spark.hadoop.fs.file.impl": "riverhouse.hadoop.LocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "riverhouse.hadoop.LocalFs",
}
CLASS_PATH = "spark.driver.extraClassPath"


def conf(jars: list[Path]) -> dict[str, str]:
    """The settings that put Riverhouse's local file system in place, when `jars` holds it."""
    jar = next((j for j in jars if j.name == JAR_NAME), None)
    return {**CONF, CLASS_PATH: str(jar)} if jar else {}


def on_class_path(settings: dict[str, str]) -> dict[str, str]:
    """`settings` with the jar kept on the driver's class path while they name its classes.

    A class path of the user's own (RIVERHOUSE_SPARK_CONF) replaces ours in the merge; without
    the jar on it, the JVM would fail to start, so the jar is added to theirs.
    """
    jars = [Path(p) for p in settings.get("spark.jars", "").split(",") if p]
    jar = next((str(j) for j in jars if j.name == JAR_NAME), None)
    if jar is None or not any(settings.get(k) == v for k, v in CONF.items()):
        return settings
    entries = [e for e in settings.get(CLASS_PATH, "").split(os.pathsep) if e]
    if jar not in entries:
        entries.append(jar)
    return {**settings, CLASS_PATH: os.pathsep.join(entries)}


def loadable(settings: dict[str, str], context: Any) -> dict[str, str]:
    """`settings` without the file system's, when `context` (a SparkContext already running in
    this process, started by someone else) cannot load its classes: a session made on it keeps
    Hadoop's, instead of failing at its first write."""
    if context is None or not any(settings.get(k) == v for k, v in CONF.items()):
        return settings
    try:
        context._jvm.java.lang.Class.forName(CONF["spark.hadoop.fs.AbstractFileSystem.file.impl"])
    except Exception:  # py4j's ClassNotFoundException
        return {k: v for k, v in settings.items() if k not in CONF}
    return settings
