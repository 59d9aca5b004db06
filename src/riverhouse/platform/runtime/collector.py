"""The driver JVM's garbage collector: the one Riverhouse picks, unless the user's options pick one."""

from __future__ import annotations

import os
import re

from riverhouse.platform.runtime.spark_defaults import spark_defaults

# The collector of an in-process local session's JVM, which is the driver and the executors at
# once: the throughput collector. With 500,000-record batches G1's concurrent marking (26 cycles
# a run, as the batch's cache moved to the old generation) and its refinement threads took ~11% of
# the JVM's CPU on two cores; ParallelGC has neither: a dedup run used 45-46 JVM CPU s against
# 50-54, and ran 7-17% faster (bench/analysis.md). A micro-batch's pause matters little beside its
# seconds of work. Not added when the user's options choose a collector (two are an error).
LOCAL_COLLECTOR = "-XX:+UseParallelGC"
COLLECTOR_RE = re.compile(r"-XX:\+Use\w*GC\b")


DRIVER_OPTIONS = ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions")


def collector_chosen(conf: dict[str, str]) -> bool:
    """Whether the driver JVM's options already choose a garbage collector (the settings' options,
    spark-defaults.conf's, which spark-submit adds, or JAVA_TOOL_OPTIONS): a JVM refuses to start
    with two, so Riverhouse then adds none."""
    defaults = spark_defaults()
    options = [source.get(key, "") for source in (conf, defaults) for key in DRIVER_OPTIONS]
    return bool(COLLECTOR_RE.search(" ".join([*options, os.environ.get("JAVA_TOOL_OPTIONS", "")])))


def with_local_collector(settings: dict[str, str]) -> dict[str, str]:
    """An in-process local session's settings with LOCAL_COLLECTOR in the driver's options, unless
    they (or JAVA_TOOL_OPTIONS) choose a collector already."""
    if collector_chosen(settings):
        return settings
    key = "spark.driver.extraJavaOptions"
    return {**settings, key: f"{settings.get(key, '')} {LOCAL_COLLECTOR}".strip()}
