"""Dagster resources: Spark (dagster-pyspark) and the Riverhouse engine that hands out pipelines.

`RiverhouseSpark` is dagster-pyspark's `PySparkResource` whose session is Riverhouse's own
(the pinned jars, Delta's extension, the restricted SQL settings), made on first use so a
sensor tick never starts a JVM. `Riverhouse` is the one resource assets, checks, sensors and
jobs use: `riverhouse.pipeline(spec, log)` returns the engine's `Pipeline`. It is abstract, the
way Dagster's project_fully_featured example declares its API client: `RiverhouseEngine` is
the real one, and tests substitute a double (tests/dagster_assets/fake_engine.py).

`definitions.py` builds them once from the environment (see `riverhouse.platform.state.settings`).
The ClickHouse DSN, which may hold a password, is passed as `dg.EnvVar("RIVERHOUSE_CLICKHOUSE_DSN")`:
the repository snapshot (the UI's Resources page) then shows the variable's name, never its value.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_pyspark import PySparkResource

from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.runtime.spark import get_spark
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.settings import RESTRICTED_SPARK_CONF, Settings, redact_dsn

SPARK_MASTER = "spark.master"
DSN_VARIABLE = "RIVERHOUSE_CLICKHOUSE_DSN"


class RiverhouseSpark(PySparkResource):
    """Spark: `spark.master` local[2] by default, or any Spark 4 master URL (spark://host:7077...).

    With `spark.remote` (sc://host:port, the engine) every step attaches to that Spark Connect
    server instead; a step's session ends with its process (the engine drops it when idle).
    """

    spark_config: dict[str, Any] = {SPARK_MASTER: "local[2]", **RESTRICTED_SPARK_CONF}

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False  # Riverhouse's subclass, not the library's resource as shipped

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Nothing yet: the session starts when a step first asks for it."""

    @property
    def master(self) -> str:
        return str(self.spark_config.get(SPARK_MASTER, "local[2]"))

    @property
    def conf(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.spark_config.items() if k != SPARK_MASTER}

    @property
    def spark_session(self) -> Any:
        if self._spark_session is None:
            self._spark_session = get_spark(self.master, app_name="riverhouse-dagster", conf=self.conf)
        return self._spark_session


class Riverhouse(dg.ConfigurableResource, ABC):
    """The engine: hands out a pipeline object per spec (ingest, publish, load, rebuild, lag, continuous)."""

    @abstractmethod
    def pipeline(
        self, spec: PipelineSpec, log: Callable[[str], None] = print, warn: Callable[[str], None] | None = None
    ) -> Pipeline: ...


class RiverhouseEngine(Riverhouse):
    """Riverhouse on this deployment: where the Delta tables, checkpoints and ClickHouse are, which Kafka."""

    spark: PySparkResource
    home: str = ".riverhouse"
    warehouse: str = ".riverhouse/warehouse"  # local folder or s3://...
    checkpoints: str = ".riverhouse/checkpoints"  # a local or mounted folder (it holds locks)
    clickhouse_dsn: str  # chdb:///path (embedded engine) or http(s)://user:pass@host:port/db
    kafka_bootstrap: str = ""  # empty: each spec's own ("local" = the local Kafka)
    kafka_state_dir: str = ".riverhouse/kafka"

    def settings(self) -> Settings:
        spark_config = dict(self.spark.spark_config)
        master = str(spark_config.pop(SPARK_MASTER, "local[2]"))
        return Settings(
            home=Path(self.home).resolve(),
            warehouse=self.warehouse if "://" in self.warehouse else str(Path(self.warehouse).resolve()),
            checkpoints=Path(self.checkpoints).resolve(),
            clickhouse_dsn=self.clickhouse_dsn,
            kafka_state_dir=Path(self.kafka_state_dir).resolve(),
            kafka_bootstrap=self.kafka_bootstrap or None,
            spark_master=master,
            spark_conf={k: str(v) for k, v in spark_config.items()},
        )

    def pipeline(
        self, spec: PipelineSpec, log: Callable[[str], None] = print, warn: Callable[[str], None] | None = None
    ) -> Pipeline:
        spark = self.spark
        return Pipeline(spec, self.settings(), log=log, warn=warn, spark_factory=lambda: spark.spark_session)


def clickhouse_dsn_config(dsn: str) -> str | dg.EnvVar:
    """The DSN as resource config: a reference to the environment when it comes from there.

    A DSN with a secret that does not come from the environment is refused: as a literal it
    would be stored in the repository snapshot and shown in the UI.
    """
    if os.environ.get(DSN_VARIABLE) == dsn:
        return dg.EnvVar(DSN_VARIABLE)
    if redact_dsn(dsn) != dsn:
        raise ValueError(
            f"the ClickHouse DSN {redact_dsn(dsn)} holds a secret: set it in {DSN_VARIABLE} so Dagster shows "
            "the variable's name instead of the password"
        )
    return dsn


def resources_from_settings(settings: Settings) -> dict[str, dg.ConfigurableResource]:
    spark = RiverhouseSpark(spark_config={SPARK_MASTER: settings.spark_master, **settings.spark_conf})
    return {
        "riverhouse": RiverhouseEngine(
            spark=spark,
            home=str(settings.home),
            warehouse=str(settings.warehouse),
            checkpoints=str(settings.checkpoints),
            clickhouse_dsn=clickhouse_dsn_config(settings.clickhouse_dsn),
            kafka_bootstrap=settings.kafka_bootstrap or "",
            kafka_state_dir=str(settings.kafka_state_dir),
        ),
    }
