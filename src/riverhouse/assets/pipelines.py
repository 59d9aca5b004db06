"""Dagster assets built from pipeline specs (thin: the work is in riverhouse.platform).

Per pipeline and source:
  kafka/<pipeline>/<source>        external asset: the topic (kind kafka)
  bronze|quarantine|silver/<p>/<s> one multi-asset: one triggered Spark run (kinds spark, delta)
  clickhouse/<pipeline>/<table>    the exactly-once load of new silver versions (kind clickhouse)
Checks: silver has unique keys within the dedup window (blocking: a failure stops
the ClickHouse load), and ClickHouse matches what the ledger says was loaded.
"""


from typing import Any

import dagster as dg

from riverhouse.platform.clickhouse import expected_columns, load_new_versions, table_stats
from riverhouse.platform.pipeline import ingest
from riverhouse.platform.quality import duplicate_keys_within_window
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.tables import TableLayout, silver_schema
from riverhouse.resources import (
    ClickHouseResource,
    KafkaResource,
    SparkResource,
    WarehouseResource,
    settings_from,
)

CLICKHOUSE_POOL = "clickhouse"


def asset_key(layer: str, spec: PipelineSpec, table: str) -> dg.AssetKey:
    return dg.AssetKey([layer, spec.name, table])


def _column_schema(columns: list[tuple[str, str]]) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name=n, type=t) for n, t in columns])


def _column_lineage(spec: PipelineSpec, source: str) -> dg.TableColumnLineage:
    silver = asset_key("silver", spec, source)
    return dg.TableColumnLineage(
        deps_by_column={
            f.name: [dg.TableColumnDep(asset_key=silver, column_name=f.name)] for f in spec.sink_source.fields
        }
    )


def build_pipeline_assets(spec: PipelineSpec) -> tuple[list[Any], list[dg.AssetChecksDefinition]]:
    assets: list[Any] = []
    checks: list[dg.AssetChecksDefinition] = []
    owners = list(spec.owners)
    for source_name, src in spec.sources.items():
        topic_key = asset_key("kafka", spec, source_name)
        bronze_key = asset_key("bronze", spec, source_name)
        quarantine_key = asset_key("quarantine", spec, source_name)
        silver_key = asset_key("silver", spec, source_name)
        assets.append(
            dg.AssetSpec(
                key=topic_key,
                description=f"Kafka topic `{src.topic}` (JSON, key {', '.join(src.key)}).",
                group_name=spec.name,
                kinds={"kafka"},
                owners=owners,
                metadata={"topic": src.topic},
            )
        )
        silver_columns = [(f.name, str(f.type)) for f in silver_schema(src)]
        window = str(src.dedup.window) if src.dedup else "none"
        specs = [
            dg.AssetSpec(
                key=bronze_key, deps=[topic_key], group_name=spec.name, kinds={"spark", "delta"},
                owners=owners,
                description=f"Every record of `{src.topic}` as received, with Kafka coordinates and parse status.",
            ),
            dg.AssetSpec(
                key=quarantine_key, deps=[bronze_key], group_name=spec.name, kinds={"spark", "delta"},
                owners=owners,
                description="Records that failed parsing or validation, with the raw value and the reason.",
            ),
            dg.AssetSpec(
                key=silver_key, deps=[bronze_key], group_name=spec.name, kinds={"spark", "delta"},
                owners=owners,
                description=(
                    f"`{source_name}` deduplicated on {', '.join(src.dedup_key)} within {window} "
                    "(Delta MERGE insert-if-absent, one commit per Spark batch)."
                ),
                metadata={"dagster/column_schema": _column_schema(silver_columns)},
            ),
        ]
        assets.append(_ingest_asset(spec, source_name, specs))
        if src.dedup:
            checks.append(_unique_keys_check(spec, source_name))

    sink_key = asset_key("clickhouse", spec, spec.sink.table)
    assets.append(_clickhouse_asset(spec, sink_key))
    checks.append(_clickhouse_check(spec, sink_key))
    return assets, checks


def _ingest_asset(spec: PipelineSpec, source_name: str, specs: list[dg.AssetSpec]) -> dg.AssetsDefinition:
    src = spec.sources[source_name]

    @dg.multi_asset(
        name=f"ingest_{spec.name}_{source_name}",
        specs=specs,
        description=f"Read `{src.topic}` up to its current end (Spark availableNow) into bronze, quarantine and silver.",
    )
    def ingest_source(
        context: dg.AssetExecutionContext,
        spark: SparkResource,
        kafka: KafkaResource,
        warehouse: WarehouseResource,
        clickhouse: ClickHouseResource,
    ):
        settings = settings_from(kafka, warehouse, clickhouse, spark)

        def log_batch(m: Any) -> None:
            context.log.info(
                f"batch {m.batch_id}: read {m.read}, quarantined {m.quarantined}, "
                f"duplicates dropped {m.duplicates_dropped}, inserted {m.inserted} ({m.seconds:.1f}s)"
            )

        result = ingest(spark.session(), spec, settings, source_name, on_batch=log_batch)
        summary = result.summary()
        layout = TableLayout(settings.warehouse, spec.name)
        seconds = max(result.seconds, 1e-6)
        yield dg.MaterializeResult(
            asset_key=specs[0].key,
            metadata={
                "records_in": summary["read"],
                "batches": summary["batches"],
                "end_offsets": dg.MetadataValue.json(summary["end_offsets"]),
                "records_per_second": round(summary["read"] / seconds, 1),
                "path": layout.bronze(source_name),
            },
        )
        yield dg.MaterializeResult(
            asset_key=specs[1].key,
            metadata={"quarantined": summary["quarantined"], "path": layout.quarantine(source_name)},
        )
        yield dg.MaterializeResult(
            asset_key=specs[2].key,
            metadata={
                "records_in": summary["read"],
                "inserted": summary["inserted"],
                "duplicates_dropped": summary["duplicates_dropped"],
                "quarantined": summary["quarantined"],
                "replayed": summary["replayed"],
                "delta_version": summary["silver_version"] if summary["silver_version"] is not None else -1,
                "path": layout.silver(source_name),
            },
        )

    return ingest_source


def _clickhouse_asset(spec: PipelineSpec, sink_key: dg.AssetKey) -> dg.AssetsDefinition:
    silver_key = asset_key("silver", spec, spec.sink_source_name)

    @dg.asset(
        key=sink_key,
        deps=[silver_key],
        group_name=spec.name,
        kinds={"clickhouse"},
        owners=list(spec.owners),
        pool=CLICKHOUSE_POOL,
        description=(
            f"ClickHouse table `{spec.sink.table}`: new silver Delta versions loaded exactly once "
            "(deduplication tokens per chunk + a ledger of loaded versions)."
        ),
        metadata={
            "dagster/column_schema": _column_schema(expected_columns(spec)),
            "dagster/column_lineage": _column_lineage(spec, spec.sink_source_name),
        },
    )
    def clickhouse_table(
        context: dg.AssetExecutionContext,
        spark: SparkResource,
        kafka: KafkaResource,
        warehouse: WarehouseResource,
        clickhouse: ClickHouseResource,
    ) -> dg.MaterializeResult:
        settings = settings_from(kafka, warehouse, clickhouse, spark)
        layout = TableLayout(settings.warehouse, spec.name)
        result = load_new_versions(spec, settings.clickhouse_dsn, layout.silver(spec.sink_source_name),
                                   log=context.log.warning)
        summary = result.summary()
        return dg.MaterializeResult(
            metadata={
                "rows_loaded": summary["rows_loaded"],
                "delta_versions_loaded": summary["versions_loaded"],
                "chunks": summary["chunks"],
                "delta_version": summary["delta_version"] if summary["delta_version"] is not None else -1,
                "last_loaded_version": summary["last_loaded_version"] if summary["last_loaded_version"] is not None else -1,
            }
        )

    return clickhouse_table


def _unique_keys_check(spec: PipelineSpec, source_name: str) -> dg.AssetChecksDefinition:
    src = spec.sources[source_name]
    assert src.dedup is not None
    window = src.dedup.window

    @dg.asset_check(
        asset=asset_key("silver", spec, source_name),
        name=f"{source_name}_has_unique_keys_within_window",
        blocking=True,
        description=f"No two silver rows share {', '.join(src.dedup_key)} within {window}.",
    )
    def unique_keys(warehouse: WarehouseResource) -> dg.AssetCheckResult:
        layout = TableLayout(warehouse.root, spec.name)
        count, sample = duplicate_keys_within_window(layout.silver(source_name), src.dedup_key, window)
        return dg.AssetCheckResult(
            passed=count == 0,
            metadata={"duplicate_rows": count, "sample": dg.MetadataValue.json(sample)},
        )

    return unique_keys


def _clickhouse_check(spec: PipelineSpec, sink_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=sink_key,
        name=f"{spec.sink.table}_matches_delta",
        pool=CLICKHOUSE_POOL,
        description=(
            "ClickHouse holds exactly the rows the ledger says were loaded from Delta, "
            "with no duplicate keys."
        ),
    )
    def matches_delta(clickhouse: ClickHouseResource) -> dg.AssetCheckResult:
        stats = table_stats(clickhouse.dsn, spec)
        passed = stats["rows"] == stats["ledger_rows"] and stats["duplicate_keys"] == 0
        return dg.AssetCheckResult(passed=passed, metadata={k: v for k, v in stats.items()})

    return matches_delta

