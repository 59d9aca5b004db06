"""One pipeline run without Dagster: ingest every source, then load ClickHouse."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from riverhouse.platform.clickhouse import load_new_versions
from riverhouse.platform.pipeline import BatchMetrics, ingest
from riverhouse.platform.settings import Settings
from riverhouse.platform.spark import get_spark
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.tables import TableLayout


def run_once(spec: PipelineSpec, settings: Settings, load: bool = True,
             log: Callable[[str], None] = print, spark: Any = None) -> dict[str, Any]:
    started = time.monotonic()
    spark = spark or get_spark(settings.spark_master, conf=settings.spark_conf)

    def on_batch(m: BatchMetrics) -> None:
        log(f"batch {m.batch_id}: read {m.read:,}, quarantined {m.quarantined:,}, "
            f"duplicates dropped {m.duplicates_dropped:,}, inserted {m.inserted:,} ({m.seconds:.1f}s)")

    summary: dict[str, Any] = {"pipeline": spec.name}
    totals = {"read": 0, "quarantined": 0, "duplicates_dropped": 0, "inserted": 0, "replayed": 0, "batches": 0}
    for source in spec.sources:
        result = ingest(spark, spec, settings, source, on_batch=on_batch)
        for key in totals:
            totals[key] += result.summary()[key]
        summary[f"silver_version_{source}"] = result.silver_version
    summary.update(totals)
    if load:
        layout = TableLayout(settings.warehouse, spec.name)
        loaded = load_new_versions(spec, settings.clickhouse_dsn, layout.silver(spec.sink_source_name), log=log)
        summary["clickhouse_rows_loaded"] = loaded.rows_loaded
        summary["delta_versions_loaded"] = len(loaded.versions_loaded)
        summary["last_loaded_version"] = loaded.last_loaded_version
    summary["seconds"] = round(time.monotonic() - started, 3)
    return summary
