"""The `riverhouse` command line as a newcomer uses it (real subprocesses)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from riverhouse.platform import local_kafka
from tests.conftest import REPO, riverhouse_cmd

pytestmark = pytest.mark.integration


def cli(*args: str, cwd: Path = REPO, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*riverhouse_cmd(), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def test_help_lists_every_command() -> None:
    proc = cli("--help")
    assert proc.returncode == 0
    for command in ("validate", "kafka", "generate", "run", "demo", "ui"):
        assert command in proc.stdout


def test_local_kafka_lifecycle_and_generate(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert cli("kafka", "status", "--home", home).returncode == 1
    started = cli("kafka", "start", "--home", home)
    assert started.returncode == 0, started.stderr
    try:
        state = local_kafka.status(tmp_path / "home" / "kafka")
        assert state is not None and state.bootstrap in started.stdout
        assert "already running" in cli("kafka", "start", "--home", home).stdout  # idempotent
        status = cli("kafka", "status", "--home", home)
        assert status.returncode == 0 and state.bootstrap in status.stdout
        generated = cli("generate", "--home", home, "--topic", "gen_orders", "--count", "500",
                        "--duplicate-rate", "0.1", "--malformed", "3", "--json")
        assert generated.returncode == 0, generated.stderr
        stats = json.loads(generated.stdout)
        assert (stats["messages"], stats["unique"], stats["duplicates"], stats["malformed"]) == (553, 500, 50, 3)
        from riverhouse.platform.kafka_source import watermarks

        marks = watermarks({"bootstrap.servers": state.bootstrap}, ["gen_orders"])["gen_orders"]
        assert sum(high - low for low, high in marks.values()) == 553  # really in Kafka
    finally:
        stopped = cli("kafka", "stop", "--home", home)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert local_kafka.status(tmp_path / "home" / "kafka") is None


def test_user_errors_are_messages_not_tracebacks(tmp_path: Path) -> None:
    missing = cli("run", str(tmp_path / "nope.yaml"), "--home", str(tmp_path))
    assert missing.returncode == 1 and "cannot read file" in missing.stderr
    no_kafka = cli("run", str(REPO / "pipelines" / "orders_dedup.yaml"), "--home", str(tmp_path))
    assert no_kafka.returncode == 1 and "riverhouse kafka start" in no_kafka.stderr
    bad = cli("generate", "--home", str(tmp_path), "--kind", "pets")
    assert bad.returncode == 1 and "--kind must be one of" in bad.stderr
    for proc in (missing, no_kafka, bad):
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_demo_json_matches_the_generator_and_repeats(tmp_path: Path) -> None:
    runs = []
    for _ in range(2):
        proc = cli("demo", "--json", "--count", "3000", "--home", str(tmp_path / "home"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout))
    summary = runs[0]
    assert set(summary) >= {"read", "duplicates_dropped", "quarantined", "silver_rows", "clickhouse_rows",
                            "clickhouse_duplicate_keys", "expected_unique", "joined_rows", "unmatched_left",
                            "join_duplicate_keys", "expected_joined"}
    assert summary["expected_unique"] == 3000
    assert summary["clickhouse_rows"] == summary["silver_rows"] == summary["expected_unique"]
    assert summary["clickhouse_duplicate_keys"] == 0
    assert summary["duplicates_dropped"] == 300
    assert summary["read"] == summary["clickhouse_rows"] + summary["duplicates_dropped"] + summary["quarantined"]
    # The join: every distinct order emitted once, matched exactly as the reference join says.
    assert summary["join_duplicate_keys"] == 0
    assert summary["joined_rows"] == summary["expected_joined"] > 0
    assert summary["unmatched_left"] == summary["expected_unmatched"] > 0
    assert summary["joined_rows"] + summary["unmatched_left"] == summary["expected_unique"]
    assert runs[1] == runs[0]  # each demo run resets its own state
    assert local_kafka.status(tmp_path / "home" / "demo" / "kafka") is None  # demo cleans up its Kafka
