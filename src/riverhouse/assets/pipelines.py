"""Dagster assets built from pipeline specs (thin: the work is in riverhouse.platform).

Per pipeline and source:
  kafka/<pipeline>/<source>        external asset: the topic (kind kafka)
  bronze|quarantine|silver/<p>/<s> one multi-asset: one triggered Spark run (kinds spark, delta)
  clickhouse/<pipeline>/<table>    the exactly-once load of new silver versions (kind clickhouse)
Checks: silver has unique keys within the dedup window (blocking: a failure stops
the ClickHouse load), and ClickHouse matches what the ledger says was loaded.
"""


import re
from typing import Any

import dagster as dg

from riverhouse.platform.clickhouse import (
    expected_columns,
    load_new_versions,
    sink_table_path,
    table_stats,
)
from riverhouse.platform.joins import gold_path, run_gold
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


FLAT_COLUMN = re.compile(r"`?([A-Za-z_][A-Za-z0-9_]*?)__([A-Za-z_][A-Za-z0-9_]*)`?")


def _column_lineage(spec: PipelineSpec) -> dg.TableColumnLineage:
    """Which silver columns each ClickHouse column is computed from."""
    if not spec.is_join:
        silver = asset_key("silver", spec, spec.sink_source_name)
        return dg.TableColumnLineage(
            deps_by_column={f.name: [dg.TableColumnDep(asset_key=silver, column_name=f.name)]
                            for f in spec.sink_source.fields}
        )
    plan = spec.plan
    aliases = {plan.driving_alias: plan.driving_source, **{s.alias: s.source for s in plan.steps}}
    deps: dict[str, list[dg.TableColumnDep]] = {}
    for name, expr in plan.projections:
        refs = {(aliases[a], c) for a, c in FLAT_COLUMN.findall(expr) if a in aliases}
        deps[name] = [dg.TableColumnDep(asset_key=asset_key("silver", spec, src), column_name=c)
                      for src, c in sorted(refs)]
    return dg.TableColumnLineage(deps_by_column=deps)


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

    upstream = asset_key("silver", spec, spec.sink_source_name)
    if spec.is_join:
        upstream = asset_key("gold", spec, spec.sink.table)
        assets.append(_gold_asset(spec, upstream))
        checks.append(_one_row_per_left_event_check(spec, upstream))
    sink_key = asset_key("clickhouse", spec, spec.sink.table)
    assets.append(_clickhouse_asset(spec, sink_key, upstream))
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
                "kafka_config": dg.MetadataValue.json(spec.kafka.redacted_config()),
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


class GoldConfig(dg.Config):
    drain: bool = False  # close every pending join window now (bounded replays, backfills, demos)


def _gold_asset(spec: PipelineSpec, gold_key: dg.AssetKey) -> dg.AssetsDefinition:
    plan = spec.plan
    kind = "SQL query" if spec.query else f"{spec.join.type} temporal join" if spec.join else ""

    @dg.asset(
        key=gold_key,
        deps=[asset_key("silver", spec, name) for name in spec.sources],
        group_name=spec.name,
        kinds={"spark", "delta"},
        owners=list(spec.owners),
        description=(
            f"{kind} of {', '.join(spec.sources)} (driving stream `{plan.driving_source}`): each driving event "
            "emitted exactly once, when its window closes."
        ),
    )
    def gold_table(
        context: dg.AssetExecutionContext,
        config: GoldConfig,
        spark: SparkResource,
        kafka: KafkaResource,
        warehouse: WarehouseResource,
        clickhouse: ClickHouseResource,
    ) -> dg.MaterializeResult:
        settings = settings_from(kafka, warehouse, clickhouse, spark)
        result = run_gold(spark.session(), spec, settings, drain=config.drain)
        summary = result.summary()
        context.log.info(f"join: {summary}")
        return dg.MaterializeResult(
            metadata={
                "processed": summary["processed"],
                "emitted": summary["emitted"],
                "join_hit_rate": summary["hit_rate"],
                "unmatched_left": summary["unmatched_left"],
                "unmatched_inner": summary["unmatched_inner"],
                "late_matches": summary["late_matches"],
                "quarantined": summary["rejected"],
                "filtered": summary["filtered"],
                "pending": summary["pending"],
                "watermark": summary["watermark"] or "",
                "delta_version": summary["gold_version"] if summary["gold_version"] is not None else -1,
                "path": gold_path(TableLayout(settings.warehouse, spec.name), spec),
            }
        )

    return gold_table


def _one_row_per_left_event_check(spec: PipelineSpec, gold_key: dg.AssetKey) -> dg.AssetChecksDefinition:
    plan = spec.plan
    driving = spec.sources[plan.driving_source]
    window = driving.dedup.window if driving.dedup else plan.close_after

    @dg.asset_check(
        asset=gold_key,
        name=f"{spec.sink.table}_has_one_row_per_left_event",
        blocking=True,
        description=(f"No fan-out: at most one emitted row per {plan.driving_source} key "
                     f"({', '.join(driving.dedup_key)}) within {window}."),
    )
    def one_row_per_left_event(warehouse: WarehouseResource) -> dg.AssetCheckResult:
        path = gold_path(TableLayout(warehouse.root, spec.name), spec)
        count, sample = duplicate_keys_within_window(path, ["_left_key"], window, time_column="_left_event_time",
                                                     emitted_only=True)
        return dg.AssetCheckResult(passed=count == 0,
                                   metadata={"duplicate_rows": count, "sample": dg.MetadataValue.json(sample)})

    return one_row_per_left_event


def _clickhouse_asset(spec: PipelineSpec, sink_key: dg.AssetKey, upstream: dg.AssetKey) -> dg.AssetsDefinition:
    @dg.asset(
        key=sink_key,
        deps=[upstream],
        group_name=spec.name,
        kinds={"clickhouse"},
        owners=list(spec.owners),
        pool=CLICKHOUSE_POOL,
        description=(
            f"ClickHouse table `{spec.sink.table}`: new silver Delta versions loaded exactly once "
            "(deduplication tokens per chunk + a ledger of loaded versions)."
        ),
        metadata={
            **({} if spec.is_join else {"dagster/column_schema": _column_schema(expected_columns(spec))}),
            "dagster/column_lineage": _column_lineage(spec),
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
        result = load_new_versions(spec, settings.clickhouse_dsn, sink_table_path(spec, settings.warehouse),
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

