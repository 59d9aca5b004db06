"""Dagster resources: where Spark runs, which Kafka, which warehouse, which ClickHouse.

Each is a `dg.ConfigurableResource`; `definitions.py` builds them once from the
environment (see `riverhouse.platform.settings`). Secrets (a ClickHouse DSN with
a password) should be passed as `dg.EnvVar` so they never appear in the UI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from riverhouse.platform.settings import Settings
from riverhouse.platform.spark import get_spark


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


def resources_from_settings(settings: Settings) -> dict[str, dg.ConfigurableResource]:
    return {
        "spark": SparkResource(master=settings.spark_master, conf=dict(settings.spark_conf)),
        "kafka": KafkaResource(
            bootstrap_servers=settings.kafka_bootstrap or "", local_state_dir=str(settings.kafka_state_dir)
        ),
        "warehouse": WarehouseResource(root=str(settings.warehouse), checkpoints=str(settings.checkpoints)),
        "clickhouse": ClickHouseResource(dsn=settings.clickhouse_dsn),
    }
