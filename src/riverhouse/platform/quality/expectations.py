"""Great Expectations (GX Core 1.x) suites derived from a pipeline spec.

Suites are built from the spec, so a field's type, `required` flag and `min`/`max`
are the single source of truth. The silver suite runs on Spark (GX's Spark data source, a
Spark Connect session included) over a DataFrame of what the step wrote: the executors
evaluate the expectations, the driver gets their results. The small suites over figures the
run already holds (rejected rate, per-day reconciliation) run on pandas. Each failed
expectation comes back with a sample of the failing values for the Dagster UI. Uniqueness
*within the dedup window* has no GX expectation: checks.py runs it as a windowed Spark job.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from riverhouse.platform.spec import PipelineSpec, SourceSpec
from riverhouse.platform.types import spark_type_names


@dataclass
class ExpectationOutcome:
    expectation: str
    column: str | None
    success: bool
    unexpected_count: int = 0
    sample: list[Any] = field(default_factory=list)


@dataclass
class SuiteOutcome:
    suite: str
    rows: int
    outcomes: list[ExpectationOutcome]

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes)

    @property
    def failed(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]

    def describe_failures(self) -> str:
        parts = []
        for o in self.failed:
            where = f" on {o.column}" if o.column else ""
            parts.append(f"{o.expectation}{where}: {o.unexpected_count} rows, e.g. {o.sample[:3]}")
        return "; ".join(parts)

    def metadata(self) -> dict[str, Any]:
        return {
            "rows_validated": self.rows,
            "expectations": len(self.outcomes),
            "failed_expectations": len(self.failed),
            "failures": [
                {
                    "expectation": o.expectation,
                    "column": o.column,
                    "unexpected_count": o.unexpected_count,
                    "sample": [str(v) for v in o.sample[:10]],
                }
                for o in self.failed
            ],
        }


def _gx() -> Any:
    _quiet_gx()
    with _IMPORTING:  # one thread imports GX with the finder in place; the others then find it imported
        if "great_expectations" not in sys.modules:
            sys.meta_path.insert(0, _DEFERRED_FINDER)
            try:
                import great_expectations  # noqa: F401
            finally:
                sys.meta_path.remove(_DEFERRED_FINDER)
    import great_expectations as gx

    return gx


# GX's import loads scipy.stats (for one expectation's KL divergence) and altair (for its plots),
# ~1.7 of the import's ~4 CPU seconds; the suites here use neither. While GX imports, those two
# modules are made lazy (importlib's LazyLoader): a module object whose code runs on first use.
_DEFERRED = frozenset({"scipy.stats", "altair"})
_IMPORTING = threading.Lock()


class _DeferredImports(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _DEFERRED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


_DEFERRED_FINDER = _DeferredImports()


def _quiet_gx() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.ERROR)


_PRELOADING: list[threading.Thread] = []


def preload() -> None:
    """Import Great Expectations in the background, once per process.

    Its import takes 2-3 s on 2 cores (with two of its modules deferred, `_gx`), paid by a
    triggered run's first check; a step that
    calls this before waiting on Spark (an ingest, whose checks follow) overlaps the two.
    `_gx()` from another thread meanwhile waits for the import (Python's module lock). Call it
    once Spark's session exists: GX imports pyspark's modules too, and two threads importing the
    same modules at once can leave one of them a half-initialised module.
    """
    if "great_expectations" in sys.modules or _PRELOADING:
        return
    _quiet_gx()  # the environment is set on the calling thread, before any other reads it
    # GX imports SQLAlchemy's ORM, whose first module registers an inspector for every object
    # before the ORM's other modules are initialised; Dagster's event storage on the calling
    # thread runs that inspector for each statement it builds, and met the half-initialised
    # module (a triggered run's step failed: `sqlalchemy.orm.exc` has no `UnmappedClassError`).
    # So the ORM is imported here first, whole (~0.2 s).
    import sqlalchemy.orm  # noqa: F401

    thread = threading.Thread(target=_gx, name="riverhouse-gx-import", daemon=True)
    _PRELOADING.append(thread)
    thread.start()


def source_expectations(src: SourceSpec) -> list[Any]:
    """Not-null keys, required fields and event time; types; ranges from the spec."""
    gx = _gx()
    exp = gx.expectations
    out: list[Any] = []
    for name in dict.fromkeys([*src.dedup_key, *src.required_fields, "_event_time"]):
        out.append(exp.ExpectColumnValuesToNotBeNull(column=name))
    for f in src.fields:
        out.append(exp.ExpectColumnValuesToBeInTypeList(column=f.name, type_list=spark_type_names(f.type)))
        if f.min is not None or f.max is not None:
            out.append(exp.ExpectColumnValuesToBeBetween(column=f.name, min_value=f.min, max_value=f.max))
    return out


def validate(rows: Any, expectations: list[Any], suite_name: str) -> SuiteOutcome:
    """Run the expectations on `rows` with an ephemeral GX context.

    `rows`: a Spark DataFrame (GX's Spark data source: Spark computes the metrics, nothing
    is cached) or a small Arrow table of figures (pandas).
    """
    gx = _gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    name = f"{suite_name}_{uuid.uuid4().hex[:8]}"
    on_spark = not isinstance(rows, pa.Table)
    if on_spark:
        data_source = context.data_sources.add_spark(name, persist=False)
        frame = rows
    else:
        data_source = context.data_sources.add_pandas(name)
        naive = pa.schema(
            [pa.field(f.name, pa.timestamp(f.type.unit)) if pa.types.is_timestamp(f.type) else f for f in rows.schema]
        )
        frame = rows.cast(naive).to_pandas()
    asset = data_source.add_dataframe_asset(name)
    batch_definition = asset.add_batch_definition_whole_dataframe(name)
    suite = context.suites.add(gx.ExpectationSuite(name=suite_name))
    for expectation in expectations:
        suite.add_expectation(expectation)
    batch = batch_definition.get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": 10})
    outcomes = []
    for r in result.results:
        config = r.expectation_config
        details = r.result or {}
        outcomes.append(
            ExpectationOutcome(
                expectation=config.type,
                column=config.kwargs.get("column") or config.kwargs.get("column_A"),
                success=bool(r.success),
                unexpected_count=int(details.get("unexpected_count") or (0 if r.success else 1)),
                sample=list(
                    details.get("partial_unexpected_list")
                    or ([details.get("observed_value")] if "observed_value" in details else [])
                ),
            )
        )
    if on_spark:  # the rows each column expectation saw (GX counts them in the same Spark jobs)
        counted = [int((r.result or {}).get("element_count") or 0) for r in result.results]
        validated = max(counted, default=0)
    else:
        validated = rows.num_rows
    return SuiteOutcome(suite_name, validated, outcomes)


def validate_silver(spec: PipelineSpec, source: str, rows: Any) -> SuiteOutcome:
    """The source's suite on `rows`, a Spark DataFrame of silver rows (what a step wrote)."""
    return validate(rows, source_expectations(spec.sources[source]), f"{spec.name}_{source}_silver")


def validate_rejected_rate(spec: PipelineSpec, records: int, rejected: int) -> SuiteOutcome:
    """At most `quality.max_rejected_rate` of a run's `records` were quarantined.

    The run already counted them per batch, so bronze is not read again: GX sees one
    `_status` value per record.
    """
    statuses = pa.table({"_status": pa.array(["ok"] * (records - rejected) + ["rejected"] * rejected, pa.string())})
    gx = _gx()
    mostly = 1.0 - spec.quality.max_rejected_rate
    expectation = gx.expectations.ExpectColumnValuesToBeInSet(column="_status", value_set=["ok"], mostly=mostly)
    return validate(statuses, [expectation], f"{spec.name}_rejected_rate")


def validate_reconciliation(spec: PipelineSpec, per_day: pa.Table) -> SuiteOutcome:
    """Per day, ClickHouse holds as many rows as Delta (columns day, delta_rows, clickhouse_rows)."""
    gx = _gx()
    expectation = gx.expectations.ExpectColumnPairValuesToBeEqual(column_A="delta_rows", column_B="clickhouse_rows")
    outcome = validate(per_day, [expectation], f"{spec.name}_reconciliation")
    if not outcome.success:
        # The failing days themselves are what a person needs.
        days = per_day.to_pylist()
        outcome.outcomes[0].sample = [d for d in days if d["delta_rows"] != d["clickhouse_rows"]][:10]
    return outcome
