"""HotSpot compiles generated methods however large, in the JVMs that run a Riverhouse parse.

HotSpot leaves a method of more than 8,000 bytes of bytecode to its interpreter
(`DontCompileHugeMethods`, on by default). The record rules in one whole-stage-code method are
that large, so the parse kept them out of whole-stage code, at the price of generating their
projection's code again in every task. With the flag off, the rules run in whole-stage code: 6.4
against 8.2 us a record of JVM CPU in alternated probes (bench/analysis.md, forty-third session).
The parse asks `compiles_huge_methods` which shape to plan; a session whose JVMs Riverhouse did
not start (an engine given by RIVERHOUSE_SPARK_REMOTE without the flag) keeps the other shape.
"""

from __future__ import annotations

from typing import Any

from riverhouse.platform.runtime.spark_defaults import is_local, spark_defaults

FLAG = "-XX:-DontCompileHugeMethods"
REFUSED = "-XX:+DontCompileHugeMethods"  # the user's choice: left as it is
DRIVER = "spark.driver.extraJavaOptions"
EXECUTOR = "spark.executor.extraJavaOptions"


def with_flag(conf: dict[str, str], master: str) -> dict[str, str]:
    """A session's settings with FLAG in the options of the JVMs that run its tasks: the driver's
    (which runs them in local mode), and the executors' on a cluster (beside spark-defaults.conf's
    own executor options, which a setting given to spark-submit would replace)."""
    conf = dict(conf)
    keys = [DRIVER] if is_local(master) else [DRIVER, EXECUTOR]
    for key in keys:
        options = conf.get(key, spark_defaults().get(key, "") if key == EXECUTOR else "")
        if FLAG not in options.split() and REFUSED not in options.split():
            conf[key] = f"{options} {FLAG}".strip()
    return conf


def compiles_huge_methods(spark: Any) -> bool:
    """Do the JVMs that run this session's tasks have FLAG (its settings say so: the driver's options
    in local mode, the executors' on a cluster)? Read through the session, so a Spark Connect one too."""
    master = spark.conf.get("spark.master", "") or ""
    options = spark.conf.get(DRIVER if is_local(master) else EXECUTOR, "") or ""
    return FLAG in options.split()
