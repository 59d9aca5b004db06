"""Driving events whose values make the join's query fail are rejected, not a stop for the pipeline.

Spark runs the spec's SQL in ANSI mode: a division by zero, an overflow or a cast that does
not fit fails the whole job, and every later run of gold would fail on the same closed event.
When gold's first job fails with a data exception (SQLSTATE class 22), the events it failed on
are found by bisection over the driving rows (each probe one Spark job; only on this path), and
gold is evaluated again with those events rejected, the error as their reason (evaluate.py,
`poison`). They reach gold's quarantine like any rejected row, exactly once, and the others are
emitted. The search is deterministic, so a replay after a crash finds the same events.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from riverhouse.platform.errors import PipelineError
from riverhouse.platform.gold.evaluate import evaluate
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.sql import JoinPlan
from riverhouse.platform.state.delta_spark import conform

# At most this many events are searched for in one run; beyond it the run fails with the error.
MAX_POISON = 20
ADVICE = "try_divide, try_add, try_subtract, try_multiply or TRY_CAST in the query give NULL instead"


def is_data_error(exc: BaseException) -> bool:
    """A Spark error about a value (SQLSTATE class 22: division by zero, overflow, a cast that does not fit)."""
    try:
        state = exc.getSqlState()  # type: ignore[attr-defined]
    except Exception:
        return False
    return isinstance(state, str) and state.startswith("22")


def reason_of(exc: BaseException) -> str:
    """Spark's first line, without its advice to turn ANSI mode off (it would change every run's results)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    first = re.sub(r"\s*If necessary set .*$", "", first)
    first = re.sub(r"\s*SQLSTATE: \w+\s*$", "", first)
    advice = "" if "try_" in first.lower() else f" ({ADVICE})"  # Spark's own advice names the try_ function
    return f"the query fails on this event: {first[:300]}{advice}"


def evaluate_rows(
    spark: Any,
    spec: PipelineSpec,
    plan: JoinPlan,
    driving: DataFrame,
    lookups: dict[str, DataFrame],
    views: list[str],
    target: Any,
    first_action: Callable[[DataFrame], Any],
) -> tuple[DataFrame, Any]:
    """Gold's rows (conformed to `target`, persisted) and `first_action`'s result on them, the job
    that computes them; events the query fails on are rejected (see the module's doc)."""
    rows = conform(evaluate(spark, spec, plan, driving, lookups, views), target).persist()
    try:
        return rows, first_action(rows)
    except Exception as exc:
        rows.unpersist()
        if not is_data_error(exc):
            raise
        poison = find_poison(spark, spec, plan, driving, lookups, views)
        if not poison:  # the failure did not come back on the driving events alone
            raise PipelineError(
                f"gold of {spec.name}: {reason_of(exc)}; nothing was written, the events stay pending"
            ) from exc
    rows = conform(evaluate(spark, spec, plan, driving, lookups, views, poison), target).persist()
    try:
        return rows, first_action(rows)
    except Exception as exc:
        rows.unpersist()
        if not is_data_error(exc):
            raise
        raise PipelineError(
            f"gold of {spec.name}: the query fails even where an event's values are NULL ({reason_of(exc)}); "
            "nothing was written, the events stay pending"
        ) from exc


def find_poison(
    spark: Any,
    spec: PipelineSpec,
    plan: JoinPlan,
    driving: DataFrame,
    lookups: dict[str, DataFrame],
    views: list[str],
) -> dict[tuple[str, int, int], str]:
    """The driving events (topic, partition, offset) the query fails on, with Spark's error as reason."""
    order = Window.orderBy("_topic", "_partition", "_offset")  # the events' identity: unique, deterministic
    numbered = driving.withColumn("_rh_n", F.row_number().over(order)).persist()
    found: dict[tuple[str, int, int], str] = {}
    try:
        total = numbered.count()

        def failure(lo: int, hi: int) -> BaseException | None:
            part = numbered.where(F.col("_rh_n").between(lo, hi)).drop("_rh_n")
            return _failure(spark, spec, plan, part, lookups, views, found)

        while len(found) < MAX_POISON:
            error = failure(1, total)
            if error is None:
                return found
            lo, hi = 1, total
            while lo < hi:  # the first failing event: the failing range halves each probe
                mid = (lo + hi) // 2
                narrower = failure(lo, mid)
                if narrower is not None:
                    hi, error = mid, narrower
                else:
                    lo = mid + 1
            row = numbered.where(F.col("_rh_n") == lo).select("_topic", "_partition", "_offset").first()
            event = (row[0], int(row[1]), int(row[2]))
            if event in found:  # it fails with its values NULL too: not an event's values (the caller says so)
                return found
            found[event] = reason_of(error)
        raise PipelineError(
            f"gold of {spec.name}: the query fails on more than {MAX_POISON} events of this run "
            f"({next(iter(found.values()))}); nothing was written, the events stay pending"
        )
    finally:
        numbered.unpersist()


def _failure(
    spark: Any,
    spec: PipelineSpec,
    plan: JoinPlan,
    driving: DataFrame,
    lookups: dict[str, DataFrame],
    views: list[str],
    known: dict[tuple[str, int, int], str],
) -> BaseException | None:
    """The data error the query raises on `driving` (events in `known` rejected), None when it runs."""
    rows = evaluate(spark, spec, plan, driving, lookups, views, known)
    try:
        # Every column computed (max, not sum: a sum of hashes overflows, itself a data error).
        rows.select(F.max(F.xxhash64(*[F.col(f"`{c}`") for c in rows.columns]))).first()
    except Exception as exc:
        if is_data_error(exc):
            return exc
        raise
    return None
