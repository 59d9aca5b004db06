"""triggered_start's timeline: Dagster's events and silver's commits -> seconds from the trigger."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import dagster as dg
import pytest

from riverhouse_bench import triggered
from riverhouse_bench.triggered import data_commits, engine_reachable, run_timeline, spread

pytestmark = pytest.mark.unit

T0 = 1_000.0


def _event(kind: str, at: float, step: str | None = None, asset: str | None = None, **metadata: object) -> dict:
    return {"type": kind, "at": T0 + at, "step": step, "asset": asset, "metadata": metadata}


def test_the_event_names_are_dagsters() -> None:
    assert dg.DagsterEventType.RUN_START.value == triggered.RUN_START
    assert dg.DagsterEventType.RUN_SUCCESS.value == triggered.RUN_SUCCESS
    assert dg.DagsterEventType.STEP_START.value == triggered.STEP_START
    assert dg.DagsterEventType.STEP_FAILURE.value == triggered.STEP_FAILURE
    assert dg.DagsterEventType.ASSET_MATERIALIZATION.value == triggered.MATERIALIZATION
    assert dg.DagsterEventType.ASSET_CHECK_EVALUATION.value == triggered.CHECK


def test_a_runs_timeline_from_the_trigger() -> None:
    events = [
        _event("PIPELINE_START", 3.0),
        _event("STEP_START", 3.5, step="ingest_trig_orders"),
        _event("ASSET_MATERIALIZATION", 9.0, step="ingest_trig_orders", asset="bronze/trig/orders"),
        _event("STEP_START", 9.5, step="silver__trig__orders"),
        _event("ASSET_CHECK_EVALUATION", 10.0, check="orders_passes_expectations", passed=True),
        # A day the events fell in besides the run's partition (logged first, after the load), then the load's own.
        _event("ASSET_MATERIALIZATION", 11.5, asset="clickhouse/trig/trig", mode="stream", run_partition="2026-11-26"),
        _event("ASSET_MATERIALIZATION", 12.0, asset="clickhouse/trig/trig", rows_loaded=1_800),
        _event("ASSET_CHECK_EVALUATION", 12.5, check="trig_matches_delta", passed=False),
        _event("PIPELINE_SUCCESS", 13.0),
    ]
    # Silver's commits: one before the trigger (an earlier run), then this run's two batches.
    commits = [(4, T0 - 30.0), (6, T0 + 8.5), (5, T0 + 7.25)]
    run = run_timeline(T0, events, commits, "trig")
    assert run["launch_s"] == 3.0
    assert run["ingest_step_s"] == 3.5
    assert run["first_batch_s"] == 7.25  # the first commit after the trigger, whatever the order given
    assert run["engine_s"] == 3.75
    assert run["clickhouse_s"] == 11.5  # the load had returned
    assert run["run_s"] == 13.0 and run["success"] is True
    assert run["rows_loaded"] == 1_800
    assert run["checks_failed"] == ["trig_matches_delta"]


def test_a_failed_run_has_no_success_and_no_first_batch() -> None:
    run = run_timeline(T0, [_event("PIPELINE_START", 2.0)], [(0, T0 - 5.0)], "trig")
    assert run["success"] is False and run["first_batch_s"] is None and run["engine_s"] is None
    assert run["launch_s"] == 2.0 and run["rows_loaded"] == 0
    assert run["step_errors"] == []


def test_a_failed_step_is_named_with_its_error() -> None:
    error = "AttributeError: partially initialized module 'sqlalchemy.orm.exc' has no attribute 'UnmappedClassError'"
    events = [
        _event("PIPELINE_START", 2.0),
        _event("STEP_START", 2.1, step="ingest_trig_orders"),
        _event("STEP_FAILURE", 3.0, step="ingest_trig_orders", error=error),
    ]
    run = run_timeline(T0, events, [], "trig")
    assert run["success"] is False
    assert run["step_errors"] == [f"ingest_trig_orders: {error}"]


def test_spread_is_nearest_rank_over_the_runs_that_have_the_figure() -> None:
    runs = [{"first_batch_s": float(v), "clickhouse_s": None} for v in (5, 1, 4, 2, 3)]
    out = spread(runs)
    assert out["first_batch_s"] == {"p50": 3.0, "p95": 5.0, "p99": 5.0, "max": 5.0}
    assert out["clickhouse_s"] is None


def test_engine_reachable_names_the_problem() -> None:
    assert "not a Spark Connect address" in (engine_reachable("http://localhost:15002") or "")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert "riverhouse engine start" in (engine_reachable(f"sc://127.0.0.1:{port}") or "")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert engine_reachable(f"sc://127.0.0.1:{server.getsockname()[1]}") is None


def test_data_commits_are_the_delta_log_commits_that_added_files(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    commits = {
        0: [{"commitInfo": {"timestamp": 1_000_000, "operation": "CREATE TABLE"}}, {"metaData": {"id": "x"}}],
        1: [{"commitInfo": {"timestamp": 1_005_500, "operation": "WRITE"}}, {"add": {"path": "a.parquet"}}],
        2: [{"add": {"path": "b.parquet"}}, {"commitInfo": {"timestamp": 1_009_000}}],
    }
    for version, actions in commits.items():
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    (log / "_last_checkpoint.json").write_text("{}")  # not a commit
    assert data_commits(log) == [(1, 1_005.5), (2, 1_009.0)]
    assert data_commits(tmp_path / "missing") == []
