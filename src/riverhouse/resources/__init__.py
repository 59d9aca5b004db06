"""Dagster resources: where Spark runs, which Kafka, which warehouse, which ClickHouse.

Each is a `dg.ConfigurableResource`; `definitions.py` builds them once from the
environment (see `riverhouse.platform.state.settings`). The ClickHouse DSN, which may hold a
password, is passed as `dg.EnvVar("RIVERHOUSE_CLICKHOUSE_DSN")`: the repository snapshot
(the UI's Resources page) then shows the variable's name, never its value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg

from riverhouse.platform.runtime.spark import get_spark
from riverhouse.platform.state.settings import Settings, redact_dsn


class SparkResource(dg.ConfigurableResource):
    """Spark: `local[2]` by default, or any Spark 4 master URL (spark://host:7077...)."""

    master: str = "local[2]"
    conf: dict[str, str] = {}

    def session(self) -> Any:
        return get_spark(self.master, app_name="riverhouse-dagster", conf=self.conf)


class KafkaResource(dg.ConfigurableResource):
    """Kafka bootstrap override; empty means each spec's own (\"local\" = the local Kafka)."""

    bootstrap_servers: str = ""
    local_state_dir: str = ".riverhouse/kafka"


class WarehouseResource(dg.ConfigurableResource):
    """Delta tables root (local folder or s3://...) and the Spark checkpoints folder."""

    root: str = ".riverhouse/warehouse"
    checkpoints: str = ".riverhouse/checkpoints"


class ClickHouseResource(dg.ConfigurableResource):
    """ClickHouse DSN: chdb:///path (embedded engine) or http(s)://user:pass@host:port/db."""

    dsn: str


def settings_from(
    kafka: KafkaResource, warehouse: WarehouseResource, clickhouse: ClickHouseResource, spark: SparkResource
) -> Settings:
    home = Path(warehouse.root).resolve().parent
    return Settings(
        home=home,
        warehouse=warehouse.root if "://" in warehouse.root else str(Path(warehouse.root).resolve()),
        checkpoints=Path(warehouse.checkpoints).resolve(),
        clickhouse_dsn=clickhouse.dsn,
        kafka_state_dir=Path(kafka.local_state_dir).resolve(),
        kafka_bootstrap=kafka.bootstrap_servers or None,
        spark_master=spark.master,
    )


DSN_VARIABLE = "RIVERHOUSE_CLICKHOUSE_DSN"


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
    return {
        "spark": SparkResource(master=settings.spark_master, conf=dict(settings.spark_conf)),
        "kafka": KafkaResource(
            bootstrap_servers=settings.kafka_bootstrap or "", local_state_dir=str(settings.kafka_state_dir)
        ),
        "warehouse": WarehouseResource(root=str(settings.warehouse), checkpoints=str(settings.checkpoints)),
        "clickhouse": ClickHouseResource(dsn=clickhouse_dsn_config(settings.clickhouse_dsn)),
    }
