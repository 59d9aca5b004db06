"""The gold join as one Spark plan: temporal lookups, the user's SQL, `require` -> a status per row.

This is the one implementation of the join's semantics; `joins.py` decides which driving
events it runs on and writes its rows, `backfill.py` runs it again over a window.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from riverhouse.platform.gold.plan_guard import check_spec_query
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.sql import JoinPlan, JoinStep, flat
from riverhouse.platform.state.tables import silver_schema, spark_schema

IDENTITY = ["_left_topic", "_left_partition", "_left_offset"]
# The columns `evaluate` keeps beside the query's inputs (never read by the spec's SQL), and those
# of them the query passes on (the driving event's Kafka time only decides late matches).
META = [
    *IDENTITY,
    "_left_event_time",
    "_left_event_date",
    "_left_kts",
    "_left_key",
    "_matched",
    "_inner_ok",
    "_late_match",
]
QUERY_META = [c for c in META if c != "_left_kts"]


# A lookup row's columns beside its fields: its event time, Kafka time, partition and offset.
LOOKUP_META = {"_t": "_event_time", "_kts": "_kafka_timestamp", "_p": "_partition", "_o": "_offset"}


def _with_prefix(df: DataFrame, alias: str, columns: list[str]) -> tuple[DataFrame, list[str]]:
    """The lookup's columns under the step's alias, and their names (known without asking Spark)."""
    renamed = {flat(alias, c): c for c in columns} | {flat(alias, k): v for k, v in LOOKUP_META.items()}
    return df.select(*[F.col(c).alias(name) for name, c in renamed.items()]), list(renamed)


def evaluate(
    spark: Any,
    spec: PipelineSpec,
    plan: JoinPlan,
    driving: DataFrame,
    lookups: dict[str, DataFrame],
    views: list[str],
    poison: dict[tuple[str, int, int], str] | None = None,
) -> DataFrame:
    """The join itself, as one Spark plan: driving rows (closed, unprocessed) + lookup rows -> gold rows.

    Per lookup step, each driving event keeps the latest matching row (event time, then
    Kafka partition and offset, descending) within the step's window; then the user's
    projections and WHERE run as Spark SQL over the flat columns, and `require` names
    the first missing field of a row that goes to quarantine.

    The SQL reads a temporary view, whose name is added to `views`: the caller drops it
    (`drop_views`) once the frame is no longer used, since the session may be shared by
    later runs (runtime/spark.py).

    `poison`: driving events (Kafka topic, partition, offset) on whose values the query fails,
    with the reason (gold/poison.py). The query sees only NULLs for them, and they are rejected.
    """
    sources = spec.sources
    base_fields = [f.name for f in sources[plan.driving_source].fields]
    base = driving
    left_key = sources[plan.driving_source].dedup_key
    base = base.select(
        *[F.col(c).alias(flat(plan.driving_alias, c)) for c in base_fields],
        F.col("_topic").alias("_left_topic"),
        F.col("_partition").alias("_left_partition"),
        F.col("_offset").alias("_left_offset"),
        F.col("_event_time").alias("_left_event_time"),
        F.col("_event_date").alias("_left_event_date"),
        F.col("_kafka_timestamp").alias("_left_kts"),
        F.concat_ws("\u0001", *[F.col(c).cast("string") for c in left_key]).alias("_left_key"),
    )
    matched_flags, inner_flags, late_flags = [], [], []
    for step in plan.steps:
        fields = [f.name for f in sources[step.source].fields]
        right, names = _with_prefix(lookups[step.alias], step.alias, fields)
        base = _latest_match(base, right, names, step)
        rt = F.col(flat(step.alias, "_t"))
        flag = rt.isNotNull()
        matched_flags.append(flag)
        if step.kind == "inner":
            inner_flags.append(flag)
        late_flags.append(flag & (F.col(flat(step.alias, "_kts")) > F.col("_left_kts")))
        base = base.drop(flat(step.alias, "_p"), flat(step.alias, "_o"))

    def all_of(flags: list[Any]) -> Any:
        out = F.lit(True)
        for f in flags:
            out = out & f
        return out

    def any_of(flags: list[Any]) -> Any:
        out = F.lit(False)
        for f in flags:
            out = out | f
        return out

    base = base.withColumn("_matched", all_of(matched_flags)).withColumn("_inner_ok", all_of(inner_flags))
    base = base.withColumn("_late_match", any_of(late_flags))
    base = _without_poison_values(base, poison or {})
    view = f"rh_gold_{uuid.uuid4().hex[:12]}"
    base.createOrReplaceTempView(view)
    views.append(view)
    projections = ", ".join(f"{expr} AS `{name}`" for name, expr in plan.projections)
    where = f"COALESCE(({plan.where}), false)" if plan.where else "true"
    meta = ", ".join([*QUERY_META, "_poison"])
    query = f"SELECT {projections}, {meta}, {where} AS _where_ok FROM `{view}`"
    check_spec_query(spark, query, view, base, spec.name, spec.model_dump_json())  # Spark's plan, before it runs
    result = spark.sql(query)
    missing = [
        F.when(F.col(f"`{name}`").isNull(), F.lit(f"required field '{name}' is missing when the join window closed"))
        for name in plan.require
    ]
    reason = F.coalesce(F.col("_poison"), *missing)
    status = (
        F.when(F.col("_poison").isNotNull(), "rejected")
        .when(~F.col("_inner_ok"), "unmatched")
        .when(~F.col("_where_ok"), "filtered")
        .when(reason.isNotNull(), "rejected")
        .otherwise("emitted")
    )
    result = result.withColumn("_reason", F.when(status == "rejected", reason)).withColumn("_status", status)
    return result.drop("_inner_ok", "_where_ok", "_poison")


def _latest_match(base: DataFrame, right: DataFrame, names: list[str], step: JoinStep) -> DataFrame:
    """`base` with one lookup row per driving event: the latest row with equal keys (event time,
    then Kafka partition and offset, descending) whose event time is within the step's window of
    the event's, its columns NULL when there is none.

    The lookup's rows are gathered per join key first (a shuffle of the lookup side), so each
    driving event meets one row holding its key's candidates and picks from them where it is.
    A join of every match followed by a latest-first window over the driving events' identity
    shuffled the driving side instead, after the join (bench/analysis.md).
    """
    keys = [f"_rh_k{i}" for i in range(len(step.keys))]
    candidates = right.groupBy(
        *[F.col(flat(step.alias, key.column)).alias(name) for key, name in zip(step.keys, keys, strict=True)]
    ).agg(F.collect_list(F.struct(*names)).alias("_rh_m"))
    cond = None
    for key, name in zip(step.keys, keys, strict=True):
        term = F.col(flat(key.base_alias, key.base_column)) == F.col(name)
        cond = term if cond is None else cond & term
    t = flat(step.alias, "_t")
    within: Any = F.col("_rh_m")
    if step.window is not None:
        gap = F.expr(f"INTERVAL {int(step.window.total_seconds())} SECONDS")
        lt = F.col("_left_event_time")
        within = F.filter(within, lambda row: (row[t] >= lt - gap) & (row[t] <= lt + gap))
    # The latest first: the largest (time, partition, offset), and its place in the list.
    order = F.transform(
        F.col("_rh_w"),
        lambda row, i: F.struct(row[t], row[flat(step.alias, "_p")], row[flat(step.alias, "_o")], i.alias("i")),
    )
    latest = F.get(F.col("_rh_w"), F.array_max(order)["i"])
    # Columns of their own first: Spark does not copy an expensive expression into each field's.
    joined = base.join(candidates, cond, "left").select("*", within.alias("_rh_w"))
    joined = joined.select("*", latest.alias("_rh_l"))
    picked = joined.select("*", *[F.col("_rh_l")[c].alias(c) for c in names])
    return picked.drop(*keys, "_rh_m", "_rh_w", "_rh_l")


def _without_poison_values(base: DataFrame, poison: dict[tuple[str, int, int], str]) -> DataFrame:
    """`_poison`: the reason of a driving event the query fails on (NULL for the others); the query's
    inputs of those events are NULL, so the query cannot fail on them again."""
    if not poison:
        return base.withColumn("_poison", F.lit(None).cast("string"))
    reason: Any = F
    for (topic, partition, offset), why in poison.items():
        same = (
            (F.col("_left_topic") == topic)
            & (F.col("_left_partition") == partition)
            & (F.col("_left_offset") == offset)
        )
        reason = reason.when(same, F.lit(why))
    base = base.withColumn("_poison", reason)
    clean = F.col("_poison").isNull()
    return base.select(
        *[F.when(clean, F.col(c)).alias(c) if c not in META else F.col(c) for c in base.columns if c != "_poison"],
        "_poison",
    )


def drop_views(spark: Any, views: list[str]) -> None:
    """Drop the temporary views `evaluate` registered (best effort: a lost engine took them along)."""
    for view in views:
        with contextlib.suppress(Exception):
            spark.catalog.dropTempView(view)
    views.clear()


def latest_per_key(rows: DataFrame, step: JoinStep) -> DataFrame:
    """A dimension's latest row per join key: the only row `evaluate` could pick for any driving event.

    The lookup keeps, per driving event, the latest row with equal keys (no window), so
    reducing the dimension first gives the same rows and keeps the join one-to-one.
    """
    keys = [k.column for k in step.keys]
    latest = Window.partitionBy(*keys).orderBy(
        F.col("_event_time").desc_nulls_last(),
        F.col("_partition").desc_nulls_last(),
        F.col("_offset").desc_nulls_last(),
    )
    return rows.withColumn("_rn", F.row_number().over(latest)).where("_rn = 1").drop("_rn")


_GOLD_SCHEMAS: dict[str, pa.Schema] = {}


def gold_schema(spark: Any, spec: PipelineSpec) -> pa.Schema:
    """The gold table's schema: the query analysed by Spark on empty inputs (no job runs), once per spec."""
    from pyspark.sql.pandas.types import to_arrow_schema

    key = spec.model_dump_json()
    if key not in _GOLD_SCHEMAS:
        plan = spec.plan

        def empty(source: str) -> DataFrame:
            return spark.createDataFrame([], spark_schema(silver_schema(spec.sources[source])))

        lookups = {s.alias: empty(s.source) for s in plan.steps}
        views: list[str] = []
        try:
            schema = to_arrow_schema(
                evaluate(spark, spec, plan, empty(plan.driving_source), lookups, views).schema, timezone="UTC"
            )
        finally:
            drop_views(spark, views)
        # Gold columns are nullable: a LEFT JOIN leaves lookup columns empty.
        _GOLD_SCHEMAS[key] = pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])
    return _GOLD_SCHEMAS[key]
