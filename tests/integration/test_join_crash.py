"""Exactly once for join pipelines: SIGKILL at each stage boundary, re-run, compare with the
reference join computed by the generator (plain Python over the events it produced)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.kafka.generator import GeneratorConfig, expected_join, orders, user_events
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import load_spec
from riverhouse.platform.state.settings import Settings
from tests.conftest import REPO, produce
from tests.integration.test_crash import assert_crashed, rerun, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def join_spec_file(tmp_path: Path, topic: str) -> tuple[Path, Any]:
    data = yaml.safe_load((REPO / "pipelines" / "orders_enriched.yaml").read_text())
    data["name"] = "crashy_join"
    data["sources"]["orders"]["topic"] = f"{topic}_orders"
    data["sources"]["user_events"]["topic"] = f"{topic}_users"
    data["kafka"]["max_offsets_per_trigger"] = 150
    data["sink"]["batch_size"] = 70
    path = tmp_path / "join.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, load_spec(path)


@pytest.mark.parametrize(
    ("point", "visit"),
    [
        ("after_silver_commit", "3"),  # mid-ingest of the sources
        ("after_gold_commit", "1"),  # gold written, nothing loaded yet
        ("during_clickhouse_insert", "2"),
        ("before_ledger_write", "1"),
    ],
)
def test_join_pipeline_sigkill_then_rerun(
    tmp_path: Path, kafka: str, topic: str, settings: Settings, spark: Any, point: str, visit: str
) -> None:
    cfg = GeneratorConfig(count=300, duplicate_rate=0.2, malformed=3, users=40, seed=5)
    order_records, order_stats = orders(cfg)
    user_records, user_stats = user_events(cfg)
    produce(kafka, f"{topic}_users", list(user_records))
    produce(kafka, f"{topic}_orders", list(order_records))
    reference = expected_join(order_stats, user_stats, timedelta(hours=1))["names"]

    spec_path, spec = join_spec_file(tmp_path, topic)
    crashed = run_cli(spec_path, settings, "--drain", RIVERHOUSE_CRASH_AT=point, RIVERHOUSE_CRASH_ON=visit)
    assert_crashed(crashed, point)
    rerun(spec_path, settings, spark, drain=True)

    with open_client(settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT order_id, user_name FROM {qualified_table(spec)}").result_rows
    got = dict(rows)
    assert len(rows) == len(got), "an order was emitted twice"
    assert got == reference
