"""One pipeline run without Dagster: ingest every source, then load ClickHouse."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from riverhouse.platform.clickhouse import load_new_versions, sink_table_path
from riverhouse.platform.joins import run_gold
from riverhouse.platform.pipeline import BatchMetrics, ingest
from riverhouse.platform.settings import Settings
from riverhouse.platform.spark import get_spark
from riverhouse.platform.spec import PipelineSpec


def run_once(spec: PipelineSpec, settings: Settings, load: bool = True,
             log: Callable[[str], None] = print, spark: Any = None, drain: bool = False) -> dict[str, Any]:
    """Ingest every source, run the join (join pipelines), load ClickHouse; returns the counts."""
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
    if spec.is_join:
        gold = run_gold(spark, spec, settings, drain=drain)
        log(f"join: {gold.processed:,} driving events closed, {gold.emitted:,} emitted "
            f"({gold.matched:,} matched, {gold.unmatched_left:,} unmatched left), {gold.rejected:,} quarantined, "
            f"{gold.pending:,} waiting for their window to close")
        summary.update({f"join_{k}": v for k, v in gold.summary().items() if k not in ("seconds",)})
    if load:
        loaded = load_new_versions(spec, settings.clickhouse_dsn, sink_table_path(spec, settings.warehouse), log=log)
        summary["clickhouse_rows_loaded"] = loaded.rows_loaded
        summary["delta_versions_loaded"] = len(loaded.versions_loaded)
        summary["last_loaded_version"] = loaded.last_loaded_version
    summary["seconds"] = round(time.monotonic() - started, 3)
    return summary
