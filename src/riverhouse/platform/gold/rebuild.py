"""Backfill a time window of gold: join its driving events again with every window closed; replace it.

The window's driving events are joined again (`evaluate.py`) over pinned silver versions and
replaced with `replaceWhere` in one commit when the rows differ; the stream's progress rides
along in the rebuild commit, so it is never lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from riverhouse.platform.gold.evaluate import drop_views
from riverhouse.platform.gold.joins import (
    ensure_gold_tables,
    gold_path,
    gold_quarantine_path,
    lookup_frames,
    read_state,
)
from riverhouse.platform.gold.poison import evaluate_rows
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import gold_lock
from riverhouse.platform.state.delta_log import MARK_REBUILD
from riverhouse.platform.state.delta_spark import (
    between,
    conform,
    read_at,
    replace_where,
    same_rows,
    table_version,
    window_predicate,
)
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout
from riverhouse.platform.state.windows import RebuildResult, window_label


def rebuild_gold(
    spark: Any,
    spec: PipelineSpec,
    settings: Settings,
    start: datetime,
    end: datetime,
    log: Callable[[str], None] = print,
) -> RebuildResult:
    """Join every driving event with event time in [start, end) again, windows closed; replace it."""
    started = time.monotonic()
    plan = spec.plan
    layout = TableLayout(settings.warehouse, spec.name)
    label = window_label(start, end)
    path = gold_path(layout, spec)
    result = RebuildResult(table=path, window=label)
    target = ensure_gold_tables(spark, spec, layout)
    with gold_lock(settings, spec.name, log):
        versions = {name: table_version(layout.silver(name)) for name in spec.sources}
        driving = read_at(spark, layout.silver(plan.driving_source), versions[plan.driving_source]).where(
            between("_event_time", "_event_date", start, end, hi_open=True)
        )
        lookups = lookup_frames(spark, spec, layout, versions, start, end - timedelta(microseconds=1))
        views: list[str] = []
        rows = None
        try:
            gold = read_at(spark, path, table_version(path))
            window = between("_left_event_time", "_left_event_date", start, end, hi_open=True)
            current = conform(gold.where(window), target)
            # Events the query fails on are rejected (gold/poison.py), as the stream's runs do.
            rows, compared = evaluate_rows(
                spark, spec, plan, driving, lookups, views, target, lambda r: same_rows(r, current)
            )
            result.rows, result.rows_before, same = compared
            if same:
                log(f"gold {spec.output_name} {label}: {result.rows:,} driving events, unchanged")
            else:
                predicate = window_predicate("_left_event_time", "_left_event_date", start, end)
                replace_where(
                    rows.where("_status = 'rejected'"),
                    gold_quarantine_path(layout, spec),
                    predicate,
                    {MARK_REBUILD: label},
                )
                # The stream's progress is carried into the rebuild commit, so it is never lost.
                state = read_state(path).metadata()
                replace_where(rows, path, predicate, {MARK_REBUILD: label, **state})
                result.changed = True
        finally:
            if rows is not None:
                rows.unpersist()
            drop_views(spark, views)
        result.delta_version = table_version(path)
        if result.changed:
            log(
                f"gold {spec.output_name} {label}: replaced {result.rows_before:,} rows with {result.rows:,} "
                f"(Delta version {result.delta_version})"
            )
    result.seconds = time.monotonic() - started
    return result
