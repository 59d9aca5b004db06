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
import warnings
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import dagster as dg

from riverhouse.platform.gold.joins import gold_path
from riverhouse.platform.pipeline import Window
from riverhouse.platform.publish import CheckOutcome, Published
from riverhouse.platform.sink.clickhouse import expected_columns
from riverhouse.platform.spec import KafkaSinkSpec, PipelineSpec
from riverhouse.platform.state.settings import Settings, dsn_database
from riverhouse.platform.state.tables import TableLayout, bronze_schema, silver_schema
from riverhouse.resources import Riverhouse

CLICKHOUSE_POOL = "clickhouse"
MODE_TAG = "riverhouse/mode"
# How long a triggered run may take once the sensor asked for it (the freshness policy's slack).
RUN_BUDGET = timedelta(minutes=10)
# At most this many other partitions are recorded per stream run (a first run over a long history).
MAX_PARTITIONS_RECORDED = 1000


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


def partition_keys_written(
    parts: dg.TimeWindowPartitionsDefinition, spans: Iterable[tuple[datetime, datetime]]
) -> set[str]:
    """The keys of the partitions (days or hours) that event-time spans [earliest, latest] fall in."""
    step = timedelta(hours=1) if "%H" in parts.fmt else timedelta(days=1)
    keys: set[str] = set()
    for lo, hi in spans:
        start = lo.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        if step == timedelta(days=1):
            start = start.replace(hour=0)
        while start <= hi and len(keys) <= MAX_PARTITIONS_RECORDED:
            keys.add(start.strftime(parts.fmt))
            start += step
    return {key for key in keys if parts.has_partition_key(key)}


def record_partitions_written(
    context: dg.AssetExecutionContext, parts: dg.TimeWindowPartitionsDefinition, published: Published
) -> None:
    """A stream run is launched for the current partition but writes every partition its events fall in.

    Each of those gets a materialization too, so days the stream filled do not look missing in
    the UI (nor does "Materialize missing" rebuild them); days without any event stay missing.
    """
    keys = sorted(partition_keys_written(parts, published.touched) - {context.partition_key})
    for key in keys[:MAX_PARTITIONS_RECORDED]:
        context.log_event(
            dg.AssetMaterialization(
                asset_key=context.asset_key,
                partition=key,
                metadata={"mode": "stream", "run_partition": context.partition_key},
            )
        )


def freshness_policy(spec: PipelineSpec) -> dg.FreshnessPolicy | None:
    """From the sensor: a record waits at most `max_delay` (seen within `interval`), then a run loads it.

    Dagster measures the time since the last materialization: a topic that receives nothing for
    longer shows the table as stale, which is true of the stream, not of the data.
    """
    sensor = spec.orchestration.sensor
    if not sensor.enabled:
        return None
    return dg.FreshnessPolicy.time_window(fail_window=sensor.max_delay + sensor.interval + RUN_BUDGET)


def _spec_line(spec: PipelineSpec, keys: tuple[str, ...]) -> int:
    """The line of the first top-level key of `keys` in the spec's file (1 when none is found)."""
    try:
        lines = Path(spec.source_file or "").read_text().splitlines()
    except OSError:
        return 1
    for number, line in enumerate(lines, 1):
        if line.split(":", 1)[0] in keys and not line.startswith((" ", "\t")):
            return number
    return 1


def table_metadata(spec: PipelineSpec, table_name: str, *spec_keys: str) -> dict[str, Any]:
    """Definition metadata of a table asset: its fully qualified name and where the spec declares it."""
    out: dict[str, Any] = {"dagster/table_name": table_name}
    if spec.source_file:
        with warnings.catch_warnings():  # Dagster's code references are beta: known, not worth a warning per asset
            warnings.simplefilter("ignore", dg.BetaWarning)
            reference = dg.LocalFileCodeReference(
                file_path=spec.source_file, line_number=_spec_line(spec, spec_keys), label=f"pipeline spec {spec.name}"
            )
            out["dagster/code_references"] = dg.CodeReferencesMetadataValue(code_references=[reference])
    return out


def delta_name(path: str) -> str:
    """How Spark SQL names a Delta table by its path."""
    return f"delta.`{path}`"


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


def _ingested_in_this_run(context: dg.AssetExecutionContext, spec: PipelineSpec, source: str) -> dict[str, Any]:
    """The metadata of `source`'s ingest step, if it ran in this run (what a stream run publishes)."""
    event = context.instance.get_latest_materialization_event(asset_key("bronze", spec, source))
    if event is None or event.run_id != context.run_id or event.asset_materialization is None:
        return {}
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def rebuild_window(context: dg.AssetExecutionContext, spec: PipelineSpec) -> Window | None:
    """The partition's window when this run is a rebuild run; None when it publishes the stream.

    A run in which the ingest asset ran (the job, sensor, schedule, "Materialize all") is a
    stream run; a backfill, or a partition materialized without the ingest asset, rebuilds.
    The run tag `riverhouse/mode` (stream|rebuild) says it outright.
    """
    mode = context.run.tags.get(MODE_TAG)
    if mode not in ("stream", "rebuild"):
        stream = not context.run.tags.get("dagster/backfill") and any(
            _ingested_in_this_run(context, spec, source) for source in spec.sources
        )
        mode = "stream" if stream else "rebuild"
    if mode == "stream":
        return None
    window = context.partition_time_window
    return Window(window.start, window.end)


def _check_result(name: str, outcome: CheckOutcome) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=name, passed=outcome.passed, metadata=outcome.metadata, description=outcome.description
    )


def build_pipeline_assets(spec: PipelineSpec, settings: Settings | None = None) -> list[Any]:
    """The spec's assets, their checks with them; `settings` (default: from the environment) name the tables' locations."""
    settings = settings or Settings.from_env()
    layout = TableLayout(settings.warehouse, spec.name)
    assets: list[Any] = []
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
                metadata={"topic": src.topic, **table_metadata(spec, f"kafka.{src.topic}", "sources")},
            )
        )
        assets.append(_silver_asset(spec, source_name, parts, layout))
    assets.append(_ingest_asset(spec, layout))

    upstream = asset_key("silver", spec, spec.sink_source_name)
    if spec.is_join:
        upstream = asset_key("gold", spec, spec.output_name)
        assets.append(_gold_asset(spec, upstream, parts, delta_name(gold_path(layout, spec))))
    if spec.clickhouse_sink is not None:
        sink_key = asset_key("clickhouse", spec, spec.sink.table)
        database = spec.sink.database or dsn_database(settings.clickhouse_dsn)
        assets.append(_clickhouse_asset(spec, sink_key, upstream, parts, f"{database}.{spec.sink.table}"))
    for sink in spec.topic_sinks:
        assets.append(_topic_asset(spec, sink, upstream, parts))
    return assets


def _rate_check_name(spec: PipelineSpec, source_name: str) -> str:
    return f"{source_name}_rejected_rate_is_below_{spec.quality.max_rejected_rate:g}".replace(".", "_")


def _ingest_specs(spec: PipelineSpec, source_name: str, layout: TableLayout) -> list[dg.AssetSpec]:
    """A source's bronze and quarantine tables."""
    src = spec.sources[source_name]
    bronze_key = asset_key("bronze", spec, source_name)
    owners = list(spec.owners)
    return [
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
            metadata={
                "dagster/column_schema": _column_schema([(f.name, str(f.type)) for f in bronze_schema(src)]),
                **table_metadata(spec, delta_name(layout.bronze(source_name)), "sources"),
            },
        ),
        dg.AssetSpec(
            key=asset_key("quarantine", spec, source_name),
            deps=[bronze_key],
            group_name=spec.name,
            kinds={"spark", "delta"},
            owners=owners,
            description="Records that failed parsing or validation, with the raw value and the reason.",
            metadata=table_metadata(spec, delta_name(layout.quarantine(source_name)), "sources"),
        ),
    ]


def _ingest_asset(spec: PipelineSpec, layout: TableLayout) -> dg.AssetsDefinition:
    """One step reads every source (a join's side by side, one query each); a selection reads its sources only."""
    sources = list(spec.sources)
    check_specs = [
        dg.AssetCheckSpec(
            _rate_check_name(spec, name),
            asset=asset_key("bronze", spec, name),
            blocking=True,
            description=(
                f"Great Expectations: at most {spec.quality.max_rejected_rate:.1%} of this run's records "
                "were quarantined (quality.max_rejected_rate)."
            ),
        )
        for name in sources
    ]
    topics = ", ".join(f"`{spec.sources[name].topic}`" for name in sources)

    @dg.multi_asset(
        name=f"ingest_{spec.name}_{sources[0]}" if len(sources) == 1 else f"ingest_{spec.name}",
        specs=[s for name in sources for s in _ingest_specs(spec, name, layout)],
        check_specs=check_specs,
        can_subset=len(sources) > 1,
        description=f"Read {topics} up to the current end (Spark availableNow) into bronze, quarantine and silver.",
    )
    def ingest_source(context: dg.AssetExecutionContext, riverhouse: Riverhouse):
        pipeline = riverhouse.pipeline(spec, context.log.info)
        selected = context.selected_asset_keys
        wanted = [
            name
            for name in sources
            if {asset_key("bronze", spec, name), asset_key("quarantine", spec, name)} & selected
        ]
        # Runs launched from the UI are not queued per pipeline: wait for the one in progress.
        ingested = pipeline.publish_ingests(wanted, lock_wait_s=600)
        for name in wanted:
            bronze_key, quarantine_key = asset_key("bronze", spec, name), asset_key("quarantine", spec, name)
            if bronze_key in selected:
                yield dg.MaterializeResult(asset_key=bronze_key, metadata=ingested[name].metadata)
            if quarantine_key in selected:
                yield dg.MaterializeResult(asset_key=quarantine_key, metadata=ingested[name].related["quarantine"])
            check = dg.AssetCheckKey(bronze_key, _rate_check_name(spec, name))
            if check not in context.selected_asset_check_keys:
                continue
            meta = ingested[name].metadata
            rate = pipeline.check_rejected_rate(meta["records_in"], meta["quarantined"])
            yield dg.AssetCheckResult(
                asset_key=bronze_key,
                check_name=check.name,
                passed=rate.passed,
                metadata=rate.metadata,
                description=rate.description,
            )

    return ingest_source


def _silver_asset(
    spec: PipelineSpec, source_name: str, parts: dg.TimeWindowPartitionsDefinition, layout: TableLayout
) -> dg.AssetsDefinition:
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
            f"`{source_name}` deduplicated on {', '.join(src.dedup_key)} within {window} (each batch's first "
            "event per key, anti-joined with silver's window, one Delta append per Spark batch). Partitioned by event time: materializing a "
            "partition without the ingest asset (or a backfill) rebuilds that window from bronze."
        ),
        metadata={
            "dagster/column_schema": _column_schema([(f.name, str(f.type)) for f in silver_schema(src)]),
            **table_metadata(spec, delta_name(layout.silver(source_name)), "sources"),
        },
    )
    def silver_table(context: dg.AssetExecutionContext, riverhouse: Riverhouse):
        pipeline = riverhouse.pipeline(spec, context.log.info)
        ingested = _ingested_in_this_run(context, spec, source_name)
        published = pipeline.publish_silver(source_name, rebuild_window(context, spec), ingested)
        record_partitions_written(context, parts, published)
        yield dg.MaterializeResult(metadata=published.metadata)
        checks = {gx_check: partial(pipeline.check_silver, source_name, published.written)}
        if src.dedup:
            checks[unique_check] = partial(pipeline.check_unique_keys, source_name, published.touched)
        for name, outcome in pipeline.run_checks(checks).items():
            yield _check_result(name, outcome)

    return silver_table


class GoldConfig(dg.Config):
    drain: bool = False  # close every pending join window now (bounded replays, backfills, demos)


def _gold_asset(
    spec: PipelineSpec, gold_key: dg.AssetKey, parts: dg.TimeWindowPartitionsDefinition, table_name: str
) -> dg.AssetsDefinition:
    plan = spec.plan
    kind = "SQL query" if spec.query else f"{spec.join.type} temporal join" if spec.join else ""
    driving = spec.sources[plan.driving_source]
    window = driving.dedup.window if driving.dedup else plan.close_after
    check = f"{spec.output_name}_has_one_row_per_left_event"

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
        metadata=table_metadata(spec, table_name, "join", "query"),
    )
    def gold_table(context: dg.AssetExecutionContext, config: GoldConfig, riverhouse: Riverhouse):
        pipeline = riverhouse.pipeline(spec, context.log.info)
        published = pipeline.publish_gold(rebuild_window(context, spec), drain=config.drain)
        record_partitions_written(context, parts, published)
        yield dg.MaterializeResult(metadata=published.metadata)
        yield _check_result(check, pipeline.check_one_row_per_left_event(published.touched))

    return gold_table


def _clickhouse_asset(
    spec: PipelineSpec,
    sink_key: dg.AssetKey,
    upstream: dg.AssetKey,
    parts: dg.TimeWindowPartitionsDefinition,
    table_name: str,
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
        freshness_policy=freshness_policy(spec),
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
            **table_metadata(spec, table_name, "sink", "sinks"),
        },
    )
    def clickhouse_table(context: dg.AssetExecutionContext, riverhouse: Riverhouse):
        # The loader's own lines are retries after transient errors: warnings.
        pipeline = riverhouse.pipeline(spec, context.log.info, warn=context.log.warning)
        published = pipeline.publish_clickhouse(rebuild_window(context, spec))
        record_partitions_written(context, parts, published)
        yield dg.MaterializeResult(metadata=published.metadata)
        yield _check_result(check, pipeline.check_clickhouse())

    return clickhouse_table


def topic_asset_name(topic: str) -> str:
    """A Kafka topic's name as the last part of its asset key (`.` and `-` become `_`)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", topic)


def _topic_asset(
    spec: PipelineSpec, sink: KafkaSinkSpec, upstream: dg.AssetKey, parts: dg.TimeWindowPartitionsDefinition
) -> dg.AssetsDefinition:
    name = topic_asset_name(sink.topic)
    key = asset_key("topic", spec, name)
    check = f"{name}_matches_delta"
    schema = [] if spec.is_join else [(f.name, str(f.type)) for f in spec.sink_source.fields]
    key_columns = sink.key if sink.key is not None else ([] if spec.is_join else list(spec.sink_source.key))

    @dg.asset(
        key=key,
        deps=[upstream],
        partitions_def=parts,
        group_name=spec.name,
        kinds={"kafka"},
        owners=list(spec.owners),
        freshness_policy=freshness_policy(spec),
        check_specs=[
            dg.AssetCheckSpec(
                check,
                asset=key,
                description=(
                    "Per Delta version this run produced: the rows a read_committed consumer reads from the topic "
                    "(by the riverhouse.version header) = the rows the version holds."
                ),
            )
        ],
        description=(
            f"Kafka topic `{sink.topic}` ({sink.format}, key {', '.join(key_columns) or 'none'}): every Delta "
            f"version of {upstream.path[0]} produced exactly once, in Kafka transactions with a ledger "
            f"(`{sink.ledger}`). Consumers set isolation.level=read_committed. A backfill's new version is "
            "produced as well (its records carry the riverhouse.rebuild header)."
        ),
        metadata={
            **({"dagster/column_schema": _column_schema(schema)} if schema else {}),
            "dagster/column_lineage": _column_lineage(spec),
            "topic": sink.topic,
            "ledger_topic": sink.ledger,
            **table_metadata(spec, f"kafka.{sink.topic}", "sink", "sinks"),
        },
    )
    def topic_sink(context: dg.AssetExecutionContext, riverhouse: Riverhouse):
        pipeline = riverhouse.pipeline(spec, context.log.info, warn=context.log.warning)
        window = rebuild_window(context, spec)
        published = pipeline.publish_topic(sink.topic)
        record_partitions_written(context, parts, published)
        # Stream or backfill, the step is the same: whatever Delta versions are new (a backfill's too).
        mode = (
            {"mode": "stream"}
            if window is None
            else {"mode": "rebuild", "window": f"{window.start.isoformat()}/{window.end.isoformat()}"}
        )
        yield dg.MaterializeResult(metadata={**published.metadata, **mode})
        yield _check_result(check, pipeline.check_topic(published.result))

    return topic_sink
