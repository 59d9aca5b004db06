"""Driving events whose values make the join's query fail are rejected, not a stop for the pipeline.

Spark runs the spec's SQL in ANSI mode: a division by zero, an overflow or a cast that does
not fit fails the whole job, and every later run of gold would fail on the same closed event.
When gold's first job fails with a data exception (SQLSTATE class 22), the events it failed on
are found by divide and conquer over the run's driving events (each probe one Spark job, at most
MAX_PROBES; only on this path), and gold is evaluated again with those events rejected, the
error as their reason (evaluate.py, `poison`). They reach gold's quarantine like any rejected
row, exactly once, and the others are emitted. The search is deterministic: a replay after a
crash finds the same events among the same ones. The query's columns are computed for every
event, also one that WHERE leaves out or an inner join finds no match for: such an event is
rejected too when a column fails on it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from riverhouse.platform.errors import PipelineError
from riverhouse.platform.gold.evaluate import evaluate
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.sql import JoinPlan
from riverhouse.platform.state.delta_spark import conform

# Driving events (Kafka topic, partition, offset) the query fails on -> the reason.
Poison = dict[tuple[str, int, int], str]
# The join of some driving events, those in `poison` rejected (evaluate.py).
Join = Callable[[DataFrame, Poison | None], DataFrame]
# Probes (Spark jobs) one search may run; beyond it the run fails with the error, writing nothing.
MAX_PROBES = 200
ADVICE = "try_divide, try_add, try_subtract, try_multiply or TRY_CAST in the query give NULL instead"
# pyspark logs every failed job at ERROR with the JVM's stack trace; the search's probes fail by design.
SPARK_ERROR_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


def is_data_error(exc: BaseException) -> bool:
    """A Spark error about a value (SQLSTATE class 22: division by zero, overflow, a cast that does not fit)."""
    try:
        state = exc.getSqlState()  # type: ignore[attr-defined]
    except Exception:
        return False
    return isinstance(state, str) and state.startswith("22")


def reason_of(exc: BaseException) -> str:
    """Spark's first line, without its advice to turn ANSI mode off (it would change every run's results)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    first = re.sub(r"\s*If necessary set .*$", "", first)
    first = re.sub(r"\s*SQLSTATE: \w+\s*$", "", first)[:300]
    advice = "" if "try_" in first.lower() else f" ({ADVICE})"  # Spark's own advice names the try_ function
    return f"the query fails on this event: {first}{advice}"


@contextlib.contextmanager
def _quiet_spark_errors() -> Iterator[None]:
    from pyspark.logger import PySparkLogger

    # pyspark's own getLogger: a plain logging.Logger made first under these names would be the one
    # pyspark gets later, and its ERROR call (with pyspark's keywords) would then raise.
    loggers = [PySparkLogger.getLogger(name) for name in SPARK_ERROR_LOGGERS]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, was in zip(loggers, before, strict=True):
            logger.disabled = was


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

    def join(events: DataFrame, poison: Poison | None = None) -> DataFrame:
        return evaluate(spark, spec, plan, events, lookups, views, poison)

    try:
        return _persisted(conform(join(driving), target), first_action)
    except Exception as exc:
        if not is_data_error(exc):
            raise
        poison = find_poison(join, driving, spec.name)
        if not poison:  # the failure did not come back on the driving events alone
            raise PipelineError(
                f"gold of {spec.name}: the run failed on a value, but no event of it fails alone ({exc}); "
                "nothing was written, the events stay pending"
            ) from exc
    try:
        return _persisted(conform(join(driving, poison), target), first_action)
    except Exception as exc:
        if not is_data_error(exc):
            raise
        raise PipelineError(
            f"gold of {spec.name}: the query fails even where an event's values are NULL ({reason_of(exc)}); "
            "nothing was written, the events stay pending"
        ) from exc


def _persisted(rows: DataFrame, first_action: Callable[[DataFrame], Any]) -> tuple[DataFrame, Any]:
    """`rows` persisted and `first_action(rows)`, the job that computes them; unpersisted if it fails."""
    rows = rows.persist()
    try:
        return rows, first_action(rows)
    except Exception:
        rows.unpersist()
        raise


def find_poison(join: Join, driving: DataFrame, pipeline: str) -> Poison:
    """The driving events (topic, partition, offset) the query fails on, with Spark's error as reason.

    Divide and conquer on the bits of each event's identity hash: a group that runs is clean, a
    failing group of one event is such an event, a larger one is split in two by the next bit.
    k such events among n cost about 3k·log2(n) probes (Spark jobs), at most MAX_PROBES.
    """
    hashed = driving.withColumn("_rh_h", F.xxhash64("_topic", "_partition", "_offset")).persist()
    found: Poison = {}
    probes = 0
    groups = [(0, 0)]  # (depth, bits): the events whose hash ends in these `depth` bits
    try:
        with _quiet_spark_errors():
            while groups:
                depth, bits = groups.pop()
                group = hashed.where((F.col("_rh_h").bitwiseAND(F.lit((1 << depth) - 1))) == F.lit(bits))
                probes += 1
                if probes > MAX_PROBES or depth > 62:
                    raise PipelineError(
                        f"gold of {pipeline}: the query fails on the values of many events of this run "
                        f"({next(iter(found.values()), 'searched ' + str(MAX_PROBES) + ' times')}); nothing was "
                        f"written, the events stay pending: {ADVICE}"
                    )
                error = _failure(join, group.drop("_rh_h"), found)
                if error is None:
                    continue
                events = group.select("_topic", "_partition", "_offset").limit(2).collect()
                if len(events) > 1:
                    groups += [(depth + 1, bits), (depth + 1, bits | (1 << depth))]
                    continue
                event = (events[0][0], int(events[0][1]), int(events[0][2]))
                if event in found:  # it fails with its values NULL too: not an event's values (the caller says so)
                    return found
                found[event] = reason_of(error)
        return found
    finally:
        hashed.unpersist()


def _failure(join: Join, driving: DataFrame, known: Poison) -> BaseException | None:
    """The data error the query raises on `driving` (events in `known` rejected), None when it runs."""
    rows = join(driving, known)
    try:
        rows.write.format("noop").mode("overwrite").save()  # every column computed, of any type
    except Exception as exc:
        if is_data_error(exc):
            return exc
        raise
    return None
