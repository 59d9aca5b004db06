"""The `riverhouse` command line as a newcomer uses it (real subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.runtime.jars import broker_classpath
from tests.conftest import CONNECT_CLIENT_ENV, REPO, riverhouse_cmd

pytestmark = pytest.mark.integration


def cli(
    *args: str, cwd: Path = REPO, timeout: int = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*riverhouse_cmd(), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)


def test_help_lists_every_command() -> None:
    proc = cli("--help")
    assert proc.returncode == 0
    for command in ("validate", "kafka", "generate", "run", "demo", "ui"):
        assert command in proc.stdout


def test_local_kafka_lifecycle_and_generate(tmp_path: Path) -> None:
    """A real broker: start, topics with a chosen partition count, and data that survives stop/start."""
    from riverhouse.platform.kafka.client import watermarks

    home = str(tmp_path / "home")
    assert cli("kafka", "status", "--home", home).returncode == 1
    down = cli("kafka", "status", "--json", "--home", home)
    assert down.returncode == 1 and json.loads(down.stdout)["running"] is False
    started = cli("kafka", "start", "--home", home)
    assert started.returncode == 0, started.stderr
    try:
        state = local_kafka.status(tmp_path / "home" / "kafka")
        assert state is not None and state.bootstrap in started.stdout
        assert (tmp_path / "home" / "kafka" / "data" / "meta.properties").exists()  # formatted KRaft storage
        archive = local_kafka.class_archive(broker_classpath())  # made by `make install` (make class-archive)
        if archive.is_file():
            assert str(archive) in Path(f"/proc/{state.pid}/maps").read_text()  # the JVM mapped its classes from it
        assert "already running" in cli("kafka", "start", "--home", home).stdout  # idempotent
        status = cli("kafka", "status", "--home", home)
        assert status.returncode == 0 and state.bootstrap in status.stdout
        as_json = cli("kafka", "status", "--json", "--home", home)
        assert as_json.returncode == 0, as_json.stderr
        report = json.loads(as_json.stdout)
        assert (report["bootstrap"], report["pid"], report["running"]) == (state.bootstrap, state.pid, True)
        assert report["listeners"] == {"PLAINTEXT": state.bootstrap} and report["secure_files"] is None
        generate = ["generate", "--home", home, "--topic", "gen_orders", "--count", "500", "--malformed", "3"]
        generated = cli(*generate, "--duplicate-rate", "0.1", "--partitions", "8", "--json")
        assert generated.returncode == 0, generated.stderr
        stats = json.loads(generated.stdout)
        assert (stats["messages"], stats["unique"], stats["duplicates"], stats["malformed"]) == (553, 500, 50, 3)
        assert stats["topic"] == "gen_orders"  # the topic produced to, not the kind's default
        marks = watermarks({"bootstrap.servers": state.bootstrap}, ["gen_orders"])["gen_orders"]
        assert sorted(marks) == list(range(8))  # created with the asked-for partitions
        assert sum(high - low for low, high in marks.values()) == 553  # really in Kafka
        tail = cli("kafka", "tail", "gen_orders", "--count", "--json", "--home", home)
        assert tail.returncode == 0, tail.stderr
        assert json.loads(tail.stdout)["records"] == 553
        stopped = cli("kafka", "stop", "--home", home)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        assert local_kafka.status(tmp_path / "home" / "kafka") is None
        assert cli("kafka", "status", "--home", home).returncode == 1
        stopped_json = cli("kafka", "status", "--json", "--home", home)
        assert stopped_json.returncode == 1 and json.loads(stopped_json.stdout)["running"] is False
        # Nothing listens at the address now: generate says so (and what to do) instead of waiting 30 s.
        refused = cli("generate", "--home", home, "--bootstrap", state.bootstrap, "--count", "10")
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert f"cannot reach Kafka at {state.bootstrap}" in " ".join(refused.stderr.split())
        restarted = cli("kafka", "start", "--home", home)
        assert restarted.returncode == 0, restarted.stderr
        assert state.bootstrap in restarted.stdout  # same address: clients and checkpoints stay valid
        assert watermarks({"bootstrap.servers": state.bootstrap}, ["gen_orders"])["gen_orders"] == marks
    finally:
        cli("kafka", "stop", "--home", home)
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
    # The dedup pipeline alone, then both: the second run resets what the first wrote (its Kafka
    # offsets, tables and ClickHouse rows), so its dedup figures are the first run's again.
    for only_dedup in (["--skip-join"], []):
        proc = cli("demo", "--json", "--count", "3000", *only_dedup, "--home", str(tmp_path / "home"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout))
    summary = runs[1]
    assert set(summary) >= {
        "read",
        "duplicates_dropped",
        "quarantined",
        "silver_rows",
        "clickhouse_rows",
        "clickhouse_duplicate_keys",
        "expected_unique",
        "joined_rows",
        "unmatched_left",
        "join_duplicate_keys",
        "expected_joined",
    }
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
    assert "joined_rows" not in runs[0]
    # How each run went: its wall time, the Dagster runs' share of it, where Spark ran.
    for run in (r.pop("demo_run") for r in runs):
        assert 0 < run["dagster_runs_seconds"] < run["wall_seconds"]
        assert run["records_per_second"] > 0
        assert run["engine"].startswith(("Spark Connect at ", "Spark in each run's own process"))
    assert {k: summary[k] for k in runs[0]} == runs[0]  # each demo run resets its own state
    # What `riverhouse ui --home <home>/demo` opens: the demo's runs and materializations, not an empty instance.
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(tmp_path / "home" / "demo" / "dagster"))
    try:
        assert [r.status for r in instance.get_runs()] == [dg.DagsterRunStatus.SUCCESS] * 2  # dedup + join
        for key in (["clickhouse", "orders_dedup", "orders"], ["gold", "orders_enriched", "orders_enriched"]):
            assert instance.get_latest_materialization_event(dg.AssetKey(key)) is not None, key
    finally:
        instance.dispose()
    assert local_kafka.status(tmp_path / "home" / "demo" / "kafka") is None  # demo cleans up its Kafka


def test_bench_refuses_a_partition_count_it_does_not_offer(tmp_path: Path) -> None:
    """A clear error before any work: no broker started, no folder made."""
    home = str(tmp_path / "home")
    proc = cli("bench", "--partitions", "33", "--home", home, timeout=120)
    assert proc.returncode == 1 and "--partitions must be 1 to 32, got 33" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "home" / "bench").exists()  # refused before starting anything


def test_bench_small_run_writes_results_and_page(tmp_path: Path) -> None:
    """`riverhouse bench` end to end on a small topic: every chosen scenario exact, JSON and page written."""
    results, docs = tmp_path / "results", tmp_path / "docs" / "benchmarks.md"  # folders that do not exist yet
    proc = cli(
        "bench",
        "--events",
        "3000",
        "--scenarios",
        "kafka_produce_limit,kafka_read_limit,clickhouse_insert_limit,baseline_consumer,riverhouse_dedup,query_vs_final",
        "--final-scale",
        "20000",
        "--steady-runs",
        "1",  # which run is the median one: tests/unit/test_bench_median.py
        "--warmup-runs",
        "1",
        "--format",
        "avro",
        "--partitions",
        "3",
        "--results",
        str(results),
        "--docs",
        str(docs),
        "--home",
        str(tmp_path / "home"),
        timeout=900,
        # As `make bench` runs: Spark in the bench's process, writing the event log its stage tables
        # read (an engine's event log is a setting of the engine's JVM, not of the bench).
        env={k: v for k, v in os.environ.items() if k != "RIVERHOUSE_SPARK_REMOTE" and k not in CONNECT_CLIENT_ENV},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    latest = json.loads((results / "latest.json").read_text())
    assert latest["machine"]["cores"] >= 1
    assert latest["config"]["partitions"] == 3
    assert latest["machine"]["kafka"].startswith("Apache Kafka 4.")
    scenarios = latest["scenarios"]
    assert scenarios["kafka_produce_limit"]["events"] == 3300  # every produced order acknowledged by the broker
    assert set(scenarios) == {
        "kafka_produce_limit",
        "kafka_read_limit",
        "clickhouse_insert_limit",
        "baseline_consumer",
        "riverhouse_dedup",
        "query_vs_final",
        "query_vs_final_20000",
        "riverhouse_dedup_avro",  # --format avro
    }
    for name, result in scenarios.items():
        assert result["exact"] is True, (name, result)
    dedup = scenarios["riverhouse_dedup"]
    # 3,000 orders + 10% duplicates read; one warm run, the one reported.
    assert dedup["events"] == 3300 and len(dedup["steady_runs_seconds"]) == 1
    assert round(dedup["steady"]["steady_seconds"], 3) == dedup["steady_runs_seconds"][0]
    # One unmeasured warm-up run before it, and the JIT threads' CPU of each run (read from /proc).
    assert len(dedup["warmup_runs_seconds"]) == 1
    assert all(isinstance(s, float) and s >= 0 for s in [*dedup["jit_cpu_s"]["warmup"], *dedup["jit_cpu_s"]["steady"]])
    assert dedup["events_per_s_excluding_startup"] > dedup["events_per_s"]
    # The CPU meter sees Spark's JVM (the Kafka source, the parse and the Delta writes run there since the
    # engine is Spark-native) and the driver, and the baseline's own process.
    steady_cpu = dedup["steady"]["cpu"]["by_role"]
    assert steady_cpu["jvm"] > 0 and steady_cpu["driver"] > 0
    # Spark's own account of the median warm run: its event log's silver append stages, and silver's
    # commits in its Delta log, which inserted that run's 3,000 distinct orders (a fresh table).
    assert any(kind.startswith("silver append") for kind in dedup["steady"]["spark_stages"]), dedup["steady"]
    commits = dedup["steady"]["silver_commits"]
    assert commits["operations"].get("WRITE", 0) >= 1 and commits["numOutputRows"] == 3000, commits
    assert scenarios["baseline_consumer"]["cpu"]["by_role"]["driver"] > 0
    assert scenarios["baseline_consumer"]["cpu"]["by_role"]["jvm"] == 0  # the broker's JVM counts as kafka
    assert scenarios["baseline_consumer"]["cpu"]["by_role"]["kafka"] > 0
    final = scenarios["query_vs_final"]
    assert set(final["queries"]) == {"count_sum_uniq", "count", "sum_amount", "top_users"}
    assert final["rmt_parts"] >= 1 and final["expected"][0] == 3000
    # The generated variant: 20,000 orders + 10% duplicates in the ReplacingMergeTree, each answer checked.
    scaled = scenarios["query_vs_final_20000"]
    assert scaled["events"] == 22000 and scaled["expected"][0] == 20000 and scaled["rmt_parts"] >= 1
    page = docs.read_text()
    assert "## Where the CPU goes" in page and "## query_vs_final, query by query" in page
    assert "## query_vs_final_20000, query by query" in page
    # The same orders as Avro through the local schema registry, beside JSON's.
    avro = scenarios["riverhouse_dedup_avro"]
    assert avro["events"] == 3300 and avro["rows"] == 3000 and avro["registry"].endswith("/apis/ccompat/v7")
    assert "| riverhouse_dedup_avro | 3,300 |" in page
    assert "| riverhouse_dedup | 3,300 |" in page and (docs.parent / "benchmarks.png").stat().st_size > 1000
    assert "riverhouse_dedup >= 100,000 events/s" in proc.stdout
