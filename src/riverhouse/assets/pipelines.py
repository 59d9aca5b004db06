"""Dagster assets built from pipeline specs (thin: the work is in riverhouse.platform).

Per pipeline and source:
  kafka/<pipeline>/<source>        external asset: the topic (kind kafka)
  bronze|quarantine/<p>/<s>        one multi-asset: a triggered Spark run that also writes silver
  silver/<p>/<s>                   time-partitioned (daily or hourly)
  gold/<p>/<table>                 join pipelines, time-partitioned
  clickhouse/<p>/<table>           time-partitioned
Two kinds of run touch the partitioned assets:
  stream run   the ingest asset ran in the same run (the job, sensor, schedule, "Materialize
               all"): silver/gold/ClickHouse publish what the stream wrote, everywhere in time.
  rebuild run  a backfill, or a partition materialized without the ingest asset: the
               partition's window is recomputed from bronze and swapped into ClickHouse.
Checks that guard ClickHouse are blocking (Great Expectations suites from the spec and
the windowed unique-key scan); the reconciliation check runs after the load.
"""

import re
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from riverhouse.platform.backfill import rebuild_gold, rebuild_silver, replace_clickhouse_window
from riverhouse.platform.gold.joins import gold_path, run_gold
from riverhouse.platform.ingest.stream import ingest
from riverhouse.platform.kafka.lag import pipeline_lag
from riverhouse.platform.quality.checks import duplicate_keys_within_window, reconcile_per_day
from riverhouse.platform.quality.expectations import validate_rejected_rate, validate_silver
from riverhouse.platform.runner import load_sink
from riverhouse.platform.sink.clickhouse import expected_columns
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.tables import (
    TableLayout,
    bronze_schema,
    open_table,
    plain_strings,
    read_inserts,
    silver_schema,
)
from riverhouse.resources import (
    ClickHouseResource,
    KafkaResource,
    SparkResource,
    WarehouseResource,
    settings_from,
)

CLICKHOUSE_POOL = "clickhouse"
MODE_TAG = "riverhouse/mode"


def asset_key(layer: str, spec: PipelineSpec, table: str) -> dg.AssetKey:
    return dg.AssetKey([layer, spec.name, table])


def partitions_def(spec: PipelineSpec) -> dg.TimeWindowPartitionsDefinition:
    """Daily (default) or hourly UTC windows; the current, still open window is included."""
    orch = spec.orchestration
    if orch.partitions == "hourly":
        return dg.HourlyPartitionsDefinition(start_date=f"{orch.partitions_start.isoformat()}-00:00", end_offset=1)
    return dg.DailyPartitionsDefinition(start_date=orch.partitions_start.isoformat(), end_offset=1)


def live_partition_key(spec: PipelineSpec, now: datetime | None = None) -> str:
    """The partition holding `now`: what a stream run is recorded against."""
    parts = partitions_def(spec)
    now = (now or datetime.now(UTC)).astimezone(UTC)
    start = now.replace(minute=0, second=0, microsecond=0)
    if spec.orchestration.partitions == "daily":
        start = start.replace(hour=0)
    return start.strftime(parts.fmt)


def _column_schema(columns: list[tuple[str, str]]) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name=n, type=t) for n, t in columns])


FLAT_COLUMN = re.compile(r"`?([A-Za-z_][A-Za-z0-9_]*?)__([A-Za-z_][A-Za-z0-9_]*)`?")


def _column_lineage(spec: PipelineSpec) -> dg.TableColumnLineage:
    """Which silver columns each ClickHouse column is computed from."""
    if not spec.is_join:
        silver = asset_key("silver", spec, spec.sink_source_name)
        return dg.TableColumnLineage(
            deps_by_column={
                f.name: [dg.TableColumnDep(asset_key=silver, column_name=f.name)] for f in spec.sink_source.fields
            }
        )
    plan = spec.plan
    aliases = {plan.driving_alias: plan.driving_source, **{s.alias: s.source for s in plan.steps}}
    deps: dict[str, list[dg.TableColumnDep]] = {}
    for name, expr in plan.projections:
        refs = {(aliases[a], c) for a, c in FLAT_COLUMN.findall(expr) if a in aliases}
        deps[name] = [
            dg.TableColumnDep(asset_key=asset_key("silver", spec, src), column_name=c) for src, c in sorted(refs)
        ]
    return dg.TableColumnLineage(deps_by_column=deps)


def _ingested_in_this_run(
    context: dg.AssetExecutionContext, spec: PipelineSpec, sources: list[str]
) -> dict[str, dict[str, Any]]:
    """Ingest metadata of the given sources' bronze assets materialized in this run."""
    out: dict[str, dict[str, Any]] = {}
    for name in sources:
        event = context.instance.get_latest_materialization_event(asset_key("bronze", spec, name))
        if event is not None and event.run_id == context.run_id and event.asset_materialization is not None:
            out[name] = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    return out


def _is_stream_run(context: dg.AssetExecutionContext, spec: PipelineSpec) -> bool:
    """A stream run publishes what the stream wrote; anything else rebuilds its partition window."""
    if context.run.tags.get(MODE_TAG) in ("stream", "rebuild"):
        return context.run.tags[MODE_TAG] == "stream"
    if context.run.tags.get("dagster/backfill"):
        return False
    return bool(_ingested_in_this_run(context, spec, list(spec.sources)))


def _window(context: dg.AssetExecutionContext) -> tuple[datetime, datetime]:
    window = context.partition_time_window
    return window.start.astimezone(UTC), window.end.astimezone(UTC)


def build_pipeline_assets(spec: PipelineSpec) -> tuple[list[Any], list[dg.AssetChecksDefinition]]:
    assets: list[Any] = []
    checks: list[dg.AssetChecksDefinition] = []
    owners = list(spec.owners)
    parts = partitions_def(spec)
    for source_name, src in spec.sources.items():
        topic_key = asset_key("kafka", spec, source_name)
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
        assets.append(_ingest_asset(spec, source_name))
        assets.append(_silver_asset(spec, source_name, parts))

    upstream = asset_key("silver", spec, spec.sink_source_name)
    if spec.is_join:
        upstream = asset_key("gold", spec, spec.sink.table)
        assets.append(_gold_asset(spec, upstream, parts))
    sink_key = asset_key("clickhouse", spec, spec.sink.table)
    assets.append(_clickhouse_asset(spec, sink_key, upstream, parts))
    return assets, checks


def _ingest_asset(spec: PipelineSpec, source_name: str) -> dg.AssetsDefinition:
    src = spec.sources[source_name]
    bronze_key = asset_key("bronze", spec, source_name)
    quarantine_key = asset_key("quarantine", spec, source_name)
    owners = list(spec.owners)
    rate_check = f"{source_name}_rejected_rate_is_below_{spec.quality.max_rejected_rate:g}".replace(".", "_")
    specs = [
        dg.AssetSpec(
            key=bronze_key,
            deps=[asset_key("kafka", spec, source_name)],
            group_name=spec.name,
            kinds={"spark", "delta"},
            owners=owners,
            description=(
                f"Every record of `{src.topic}` as received, with Kafka coordinates, parse status "
                "and the Spark batch it came in. The ingest run also writes silver."
            ),
            metadata={"dagster/column_schema": _column_schema([(f.name, str(f.type)) for f in bronze_schema(src)])},
        ),
        dg.AssetSpec(
            key=quarantine_key,
            deps=[bronze_key],
            group_name=spec.name,
            kinds={"spark", "delta"},
            owners=owners,
            description="Records that failed parsing or validation, with the raw value and the reason.",
        ),
    ]

    @dg.multi_asset(
        name=f"ingest_{spec.name}_{source_name}",
        specs=specs,
        check_specs=[
            dg.AssetCheckSpec(
                rate_check,
                asset=bronze_key,
                blocking=True,
                description=(
                    f"Great Expectations: at most {spec.quality.max_rejected_rate:.1%} of this run's records "
                    "were quarantined (quality.max_rejected_rate)."
                ),
            )
        ],
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
        layout = TableLayout(settings.warehouse, spec.name)

        def log_batch(m: Any) -> None:
            context.log.info(
                f"batch {m.batch_id}: read {m.read}, quarantined {m.quarantined}, "
                f"duplicates dropped {m.duplicates_dropped}, inserted {m.inserted} ({m.seconds:.1f}s)"
            )

        lag_before = pipeline_lag(spec, settings, [source_name]).total
        silver = open_table(layout.silver(source_name))
        silver_before = silver.version() if silver is not None else -1
        # Runs launched from the UI are not queued per pipeline: wait for the one in progress.
        result = ingest(
            spark.session(), spec, settings, source_name, on_batch=log_batch, lock_wait_s=600, log=context.log.info
        )
        summary = result.summary()
        seconds = max(result.seconds, 1e-6)
        batch_ids = [b.batch_id for b in result.batches]
        yield dg.MaterializeResult(
            asset_key=bronze_key,
            metadata={
                "records_in": summary["read"],
                "inserted": summary["inserted"],
                "duplicates_dropped": summary["duplicates_dropped"],
                "quarantined": summary["quarantined"],
                "replayed": summary["replayed"],
                "lag_before": lag_before,
                "batches": summary["batches"],
                "records_per_second": round(summary["read"] / seconds, 1),
                "seconds": round(result.seconds, 2),
                "first_batch_id": min(batch_ids) if batch_ids else -1,
                "last_batch_id": max(batch_ids) if batch_ids else -1,
                "silver_version_before": silver_before,
                "silver_version_after": summary["silver_version"] if summary["silver_version"] is not None else -1,
                "end_offsets": dg.MetadataValue.json(summary["end_offsets"]),
                "path": layout.bronze(source_name),
                "kafka_config": dg.MetadataValue.json(spec.kafka.redacted_config()),
            },
        )
        yield dg.MaterializeResult(
            asset_key=quarantine_key,
            metadata={"quarantined": summary["quarantined"], "path": layout.quarantine(source_name)},
        )
        records, rejected = summary["read"], summary["quarantined"]
        outcome = validate_rejected_rate(spec, records, rejected)
        yield dg.AssetCheckResult(
            asset_key=bronze_key,
            check_name=rate_check,
            passed=outcome.success,
            metadata={
                "records": records,
                "rejected": rejected,
                "rejected_rate": round(rejected / records, 6) if records else 0.0,
                "max_rejected_rate": spec.quality.max_rejected_rate,
                "gx": dg.MetadataValue.json(outcome.metadata()),
            },
            description=None if outcome.success else outcome.describe_failures(),
        )

    return ingest_source


def _silver_asset(spec: PipelineSpec, source_name: str, parts: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    src = spec.sources[source_name]
    key = asset_key("silver", spec, source_name)
    window = str(src.dedup.window) if src.dedup else "none"
    gx_check = f"{source_name}_passes_expectations"
    unique_check = f"{source_name}_has_unique_keys_within_window"
    check_specs = [
        dg.AssetCheckSpec(
            gx_check,
            asset=key,
            blocking=True,
            description=(
                "Great Expectations suite from the spec: not-null keys, required fields and event time; "
                "field types; min/max ranges. Runs on the rows this run publishes."
            ),
        )
    ]
    if src.dedup:
        check_specs.append(
            dg.AssetCheckSpec(
                unique_check,
                asset=key,
                blocking=True,
                description=f"No two silver rows share {', '.join(src.dedup_key)} within {window}.",
            )
        )

    @dg.asset(
        key=key,
        deps=[asset_key("bronze", spec, source_name)],
        partitions_def=parts,
        group_name=spec.name,
        kinds={"spark", "delta"},
        owners=list(spec.owners),
        check_specs=check_specs,
        description=(
            f"`{source_name}` deduplicated on {', '.join(src.dedup_key)} within {window} (window-bounded "
            "insert-only MERGE, one Delta commit per Spark batch). Partitioned by event time: materializing a "
            "partition without the ingest asset (or a backfill) rebuilds that window from bronze."
        ),
        metadata={"dagster/column_schema": _column_schema([(f.name, str(f.type)) for f in silver_schema(src)])},
    )
    def silver_table(
        context: dg.AssetExecutionContext,
        spark: SparkResource,
        kafka: KafkaResource,
        warehouse: WarehouseResource,
        clickhouse: ClickHouseResource,
    ):
        settings = settings_from(kafka, warehouse, clickhouse, spark)
        layout = TableLayout(settings.warehouse, spec.name)
        schema = silver_schema(src)
        metadata: dict[str, Any] = {"path": layout.silver(source_name)}
        if _is_stream_run(context, spec):
            ingested = _ingested_in_this_run(context, spec, [source_name]).get(source_name, {})
            before = int(ingested.get("silver_version_before", -1))
            after = int(ingested.get("silver_version_after", -1))
            rows = (
                read_inserts(layout.silver(source_name), before + 1, after, schema.names)
                if after > before
                else schema.empty_table()
            )
            metadata.update(
                {
                    "mode": "stream",
                    "inserted": rows.num_rows,
                    "duplicates_dropped": int(ingested.get("duplicates_dropped", 0)),
                    "delta_version": after,
                }
            )
        else:
            start, end = _window(context)
            rebuilt = rebuild_silver(spark.session(), spec, settings, source_name, start, end, log=context.log.info)
            rows = rebuilt.published if rebuilt.published is not None else schema.empty_table()
            metadata.update(
                {
                    "mode": "rebuild",
                    "window": rebuilt.window,
                    "rows": rebuilt.rows,
                    "rows_before": rebuilt.rows_before,
                    "changed": rebuilt.changed,
                    "delta_version": rebuilt.delta_version if rebuilt.delta_version is not None else -1,
                }
            )
        yield dg.MaterializeResult(metadata=metadata)
        outcome = validate_silver(spec, source_name, plain_strings(rows).select(schema.names))
        yield dg.AssetCheckResult(
            check_name=gx_check,
            passed=outcome.success,
            metadata={**outcome.metadata(), "failures": dg.MetadataValue.json(outcome.metadata()["failures"])},
            description=None if outcome.success else outcome.describe_failures(),
        )
        if src.dedup:
            count, sample = duplicate_keys_within_window(layout.silver(source_name), src.dedup_key, src.dedup.window)
            yield dg.AssetCheckResult(
                check_name=unique_check,
                passed=count == 0,
                metadata={"duplicate_rows": count, "sample": dg.MetadataValue.json(sample)},
            )

    return silver_table


class GoldConfig(dg.Config):
    drain: bool = False  # close every pending join window now (bounded replays, backfills, demos)


def _gold_asset(spec: PipelineSpec, gold_key: dg.AssetKey, parts: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    plan = spec.plan
    kind = "SQL query" if spec.query else f"{spec.join.type} temporal join" if spec.join else ""
    driving = spec.sources[plan.driving_source]
    window = driving.dedup.window if driving.dedup else plan.close_after
    check = f"{spec.sink.table}_has_one_row_per_left_event"

    @dg.asset(
        key=gold_key,
        deps=[asset_key("silver", spec, name) for name in spec.sources],
        partitions_def=parts,
        group_name=spec.name,
        kinds={"spark", "delta"},
        owners=list(spec.owners),
        check_specs=[
            dg.AssetCheckSpec(
                check,
                asset=gold_key,
                blocking=True,
                description=(
                    f"No fan-out: at most one emitted row per {plan.driving_source} key "
                    f"({', '.join(driving.dedup_key)}) within {window}."
                ),
            )
        ],
        description=(
            f"{kind} of {', '.join(spec.sources)} (driving stream `{plan.driving_source}`): each driving event "
            "emitted exactly once, when its window closes. A rebuild joins the partition's driving events again."
        ),
    )
    def gold_table(
        context: dg.AssetExecutionContext,
        config: GoldConfig,
        spark: SparkResource,
        kafka: KafkaResource,
        warehouse: WarehouseResource,
        clickhouse: ClickHouseResource,
    ):
        settings = settings_from(kafka, warehouse, clickhouse, spark)
        path = gold_path(TableLayout(settings.warehouse, spec.name), spec)
        if _is_stream_run(context, spec):
            summary = run_gold(spark.session(), spec, settings, drain=config.drain).summary()
            context.log.info(f"join: {summary}")
            metadata: dict[str, Any] = {
                "mode": "stream",
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
                "engine": summary["engine"] or "none",  # numpy (local mode) or spark; none: nothing to join
                "delta_version": summary["gold_version"] if summary["gold_version"] is not None else -1,
            }
        else:
            start, end = _window(context)
            rebuilt = rebuild_gold(spark.session(), spec, settings, start, end, log=context.log.info)
            metadata = {
                "mode": "rebuild",
                "window": rebuilt.window,
                "rows": rebuilt.rows,
                "rows_before": rebuilt.rows_before,
                "changed": rebuilt.changed,
                "delta_version": rebuilt.delta_version if rebuilt.delta_version is not None else -1,
            }
        yield dg.MaterializeResult(metadata={**metadata, "path": path})
        count, sample = duplicate_keys_within_window(
            path, ["_left_key"], window, time_column="_left_event_time", emitted_only=True
        )
        yield dg.AssetCheckResult(
            check_name=check,
            passed=count == 0,
            metadata={"duplicate_rows": count, "sample": dg.MetadataValue.json(sample)},
        )

    return gold_table


def _clickhouse_asset(
    spec: PipelineSpec, sink_key: dg.AssetKey, upstream: dg.AssetKey, parts: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    check = f"{spec.sink.table}_matches_delta"

    @dg.asset(
        key=sink_key,
        deps=[upstream],
        partitions_def=parts,
        group_name=spec.name,
        kinds={"clickhouse"},
        owners=list(spec.owners),
        pool=CLICKHOUSE_POOL,
        check_specs=[
            dg.AssetCheckSpec(
                check,
                asset=sink_key,
                description=(
                    "Great Expectations reconciliation: per day, ClickHouse holds as many rows as Delta "
                    "at the last loaded version; no duplicate keys."
                ),
            )
        ],
        description=(
            f"ClickHouse table `{spec.sink.table}` (partitioned by `_event_date`): new Delta versions loaded "
            "exactly once (deduplication tokens per chunk + a ledger); a rebuild swaps whole days in with "
            "REPLACE PARTITION."
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
    ):
        settings = settings_from(kafka, warehouse, clickhouse, spark)
        if _is_stream_run(context, spec):
            summary = load_sink(spec, settings, log=context.log.warning).summary()
            metadata: dict[str, Any] = {
                "mode": "stream",
                "rows_loaded": summary["rows_loaded"],
                "delta_versions_loaded": summary["versions_loaded"],
                "chunks": summary["chunks"],
                "seconds": summary["seconds"],
                "delta_version": summary["delta_version"] if summary["delta_version"] is not None else -1,
                "last_loaded_version": summary["last_loaded_version"]
                if summary["last_loaded_version"] is not None
                else -1,
            }
        else:
            start, end = _window(context)
            replaced = replace_clickhouse_window(spec, settings, start, end, log=context.log.info).summary()
            metadata = {
                "mode": "rebuild",
                "days": ", ".join(replaced["days"]),
                "rows_replaced": replaced["rows"],
                "rows_caught_up": replaced["caught_up_rows"],
                "seconds": replaced["seconds"],
                "delta_version": replaced["delta_version"] if replaced["delta_version"] is not None else -1,
            }
        yield dg.MaterializeResult(metadata=metadata)
        outcome, stats = reconcile_per_day(spec, settings)
        yield dg.AssetCheckResult(
            check_name=check,
            passed=outcome.success and stats["duplicate_keys"] == 0,
            metadata={**stats, "gx": dg.MetadataValue.json(outcome.metadata())},
            description=None if outcome.success else outcome.describe_failures(),
        )

    return clickhouse_table
