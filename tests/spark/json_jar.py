"""The marks of a test of Riverhouse's SQL functions (jvm/src/riverhouse/json, `riverhouse-json.jar`)."""

from __future__ import annotations

import pytest

from riverhouse.platform.runtime.jvm_build import JSON_JAR, in_spark_jars

NEEDS_JSON_JAR = [
    pytest.mark.spark,
    pytest.mark.skipif(
        not in_spark_jars(JSON_JAR),
        reason=f"{JSON_JAR} was not built (`make jars` needs a JDK's javac)",
    ),
]
