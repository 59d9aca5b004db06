"""Object storage end to end: an `s3://` warehouse on an S3-compatible server (moto, server mode).

Kafka (the real local broker) -> Spark (a Spark Connect engine) -> Delta on S3 through Hadoop's
S3A -> ClickHouse (chDB), with the driver's own reads (the Delta log, the loader's Parquet files,
delta-rs) on the same bucket. The settings are the ones a user gives: RIVERHOUSE_WAREHOUSE and
RIVERHOUSE_STORAGE_OPTIONS (delta-rs style keys, an endpoint and keys).

The engine is this test's own: S3A's settings and keys are the engine's (Hadoop's file systems
are cached per JVM and bucket, so a session cannot bring its own), given when it starts, as
`riverhouse engine start` would be given them; the shared test engine has none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.kafka.generator import GeneratorConfig, expected_join, orders, user_events
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.runtime.processes import free_port
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import load_spec
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout, open_table
from tests.conftest import REPO, orders_spec, produce, riverhouse_cmd, subprocess_env
from tests.integration.standalone import (  # noqa: F401 - standalone_cluster is a fixture
    silver,
    standalone_cluster,
    tasks_by_execution,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BUCKET = "riverhouse-test"
SECRET = f"rh-secret-{uuid.uuid4().hex}"  # moto accepts any keys; this one must never be printed


def moto_server() -> str:
    """moto's server command (`pip install -e '.[dev]'` installs it beside this interpreter)."""
    found = shutil.which("moto_server", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if not found:
        pytest.fail("moto_server was not found: install the test extras (pip install -e '.[dev]')")
    return found


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """http://127.0.0.1:<port> of a moto S3 server holding the bucket BUCKET."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")  # noqa: SIM115 - the child's
    proc = subprocess.Popen([moto_server(), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"), timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start (exit {proc.poll()})") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def storage_env(s3_endpoint: str) -> Iterator[None]:
    """RIVERHOUSE_STORAGE_OPTIONS for the server, as a user sets it; no AWS_* keys in the environment."""
    options = {
        "AWS_ACCESS_KEY_ID": "riverhouse",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ALLOW_HTTP": "true",
    }
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RIVERHOUSE_STORAGE_OPTIONS", json.dumps(options))
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)  # the keys come from the storage options only
        yield


@pytest.fixture(scope="module")
def s3_engine(storage_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A Spark Connect engine started with the object store's settings (as `riverhouse engine start`)."""
    from riverhouse.platform.runtime import engine

    state_dir = tmp_path_factory.mktemp("s3-engine")
    url = engine.start(state_dir, master="local[2]", memory="1g").url
    try:
        yield url, state_dir
    finally:
        engine.stop(state_dir)


def run_cli(settings: Settings, spec_path: Path, engine_url: str, *args: str) -> dict[str, Any]:
    env = subprocess_env(
        settings,
        RIVERHOUSE_SPARK_REMOTE=engine_url,
        RIVERHOUSE_WAREHOUSE=settings.warehouse,
        RIVERHOUSE_STORAGE_OPTIONS=os.environ["RIVERHOUSE_STORAGE_OPTIONS"],
    )
    proc = subprocess.run(
        [*riverhouse_cmd(), "run", str(spec_path), "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_s3_warehouse_dedup_loads_clickhouse_exactly_once(
    s3_engine: tuple[str, Path], kafka: str, topic: str, tmp_path: Path
) -> None:
    engine_url, engine_dir = s3_engine
    records, stats = orders(GeneratorConfig(count=1500, duplicate_rate=0.2, malformed=4, seed=31))
    produce(kafka, topic, list(records))
    spec = orders_spec(topic, name="s3_orders", max_offsets=700)  # several micro-batches
    spec_path = tmp_path / "s3_orders.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    settings = Settings.from_env(tmp_path / "home").with_(
        kafka_bootstrap=kafka, warehouse=f"s3://{BUCKET}/warehouse/{topic}"
    )

    summary = run_cli(settings, spec_path, engine_url)
    assert summary["batches"] >= 2
    assert summary["read"] == stats.messages
    assert summary["inserted"] == stats.expected_unique
    assert summary["duplicates_dropped"] == stats.duplicates
    assert summary["quarantined"] == stats.malformed

    # The tables are on the S3 server (Spark wrote s3a://), read back through pyarrow and delta-rs.
    layout = TableLayout(settings.warehouse, spec.name)
    silver_path = layout.silver("orders")
    assert silver_path == f"s3a://{BUCKET}/warehouse/{topic}/silver/s3_orders/orders"
    silver = open_table(silver_path).to_pyarrow_dataset().to_table(columns=["order_id"])
    assert sorted(silver.column("order_id").to_pylist()) == sorted(e["order_id"] for e in stats.events)
    silver_version = DeltaLog(silver_path).latest_version()
    assert summary["last_loaded_version"] == silver_version
    assert DeltaLog(layout.bronze("orders")).latest_version() is not None

    def clickhouse_ids() -> list[str]:
        with open_client(settings.clickhouse_dsn) as client:
            return [r[0] for r in client.query(f"SELECT order_id FROM {qualified_table(spec)}").result_rows]

    ids = clickhouse_ids()
    assert len(ids) == stats.expected_unique  # nothing doubled
    assert sorted(ids) == sorted(e["order_id"] for e in stats.events)

    # A re-run with no new data reads nothing, writes no Delta version and loads no row.
    again = run_cli(settings, spec_path, engine_url)
    assert again["read"] == 0 and again["clickhouse_rows_loaded"] == 0
    assert DeltaLog(silver_path).latest_version() == silver_version
    assert sorted(clickhouse_ids()) == sorted(ids)

    # The keys reached S3A through the engine's environment: not in its settings file or its log.
    assert SECRET not in (engine_dir / "spark-engine.conf").read_text()
    assert SECRET not in (engine_dir / "logs" / "engine.out").read_text(errors="replace")


BACKFILL = """
import json, sys
from datetime import datetime
from riverhouse.platform.pipeline import Pipeline, Window
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.spec import load_spec
from riverhouse.platform.state.settings import Settings
window = Window(datetime.fromisoformat(sys.argv[2]), datetime.fromisoformat(sys.argv[3]))
out = Pipeline(load_spec(sys.argv[1]), Settings.from_env(), log=lambda m: None).rebuild(window)
print(json.dumps({"silver_changed": [r.changed for r in out.silver.values()], "clickhouse_rows": out.clickhouse.rows}))
"""


def test_s3_warehouse_join_and_backfill_match_the_reference_join(
    s3_engine: tuple[str, Path], kafka: str, topic: str, tmp_path: Path
) -> None:
    engine_url, _ = s3_engine
    cfg = GeneratorConfig(count=300, duplicate_rate=0.2, malformed=3, users=40, seed=17)
    order_records, order_stats = orders(cfg)
    user_records, user_stats = user_events(cfg)
    produce(kafka, f"{topic}_users", list(user_records))
    produce(kafka, f"{topic}_orders", list(order_records))
    reference = expected_join(order_stats, user_stats, timedelta(hours=1))["names"]

    data = yaml.safe_load((REPO / "pipelines" / "orders_enriched.yaml").read_text())
    data["name"] = "s3_join"
    data["sources"]["orders"]["topic"] = f"{topic}_orders"
    data["sources"]["user_events"]["topic"] = f"{topic}_users"
    data["kafka"]["max_offsets_per_trigger"] = 200
    spec_path = tmp_path / "s3_join.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    spec = load_spec(spec_path)
    settings = Settings.from_env(tmp_path / "home").with_(
        kafka_bootstrap=kafka, warehouse=f"s3://{BUCKET}/warehouse/{topic}"
    )

    def joined() -> list[tuple[str, str | None]]:
        with open_client(settings.clickhouse_dsn) as client:
            return client.query(f"SELECT order_id, user_name FROM {qualified_table(spec)}").result_rows

    first = run_cli(settings, spec_path, engine_url, "--drain")
    assert first["inserted"] == order_stats.expected_unique + user_stats.expected_unique
    rows = joined()
    assert len(rows) == len(dict(rows)), "an order was emitted twice"
    assert dict(rows) == reference

    again = run_cli(settings, spec_path, engine_url, "--drain")
    assert again["read"] == 0 and again["clickhouse_rows_loaded"] == 0
    assert sorted(joined()) == sorted(rows)

    # Backfill the generated days on S3 (Pipeline.rebuild, what a Dagster backfill runs, in a process
    # of its own attached to the engine): silver from bronze, gold, the ClickHouse days swapped in.
    env = subprocess_env(
        settings,
        RIVERHOUSE_SPARK_REMOTE=engine_url,
        RIVERHOUSE_WAREHOUSE=settings.warehouse,
        RIVERHOUSE_STORAGE_OPTIONS=os.environ["RIVERHOUSE_STORAGE_OPTIONS"],
    )
    window = ("2025-12-31T00:00:00+00:00", "2026-01-02T00:00:00+00:00")
    proc = subprocess.run(
        [sys.executable, "-c", BACKFILL, str(spec_path), *window], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rebuilt = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not any(rebuilt["silver_changed"])  # bronze holds what silver does: no new commit
    assert rebuilt["clickhouse_rows"] == len(reference)
    after = joined()
    assert len(after) == len(reference) and dict(after) == reference


def test_a_cluster_run_on_s3_equals_a_local_run_and_its_executors_get_the_keys_from_the_engine(
    spark: Any,
    storage_env: None,
    kafka: str,
    topic: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    standalone_cluster: tuple[str, Path],  # noqa: F811
) -> None:
    """The production shape: `riverhouse run` attached to an engine that is a standalone cluster's
    driver, the warehouse on S3. Spark's Kafka source, the parse, the in-batch dedup, the anti-join
    with silver and the Delta appends run as tasks of executors the two workers launched (Spark's
    event log says which executor ran each task), and silver's rows equal a local-mode run's on a
    local warehouse. The executors write the Delta files with S3A's settings and keys from the
    engine (Spark copies its environment's keys into the Hadoop configuration tasks carry), not
    from their workers' environment, which has none; the keys are never printed or logged."""
    from riverhouse.platform.runtime import engine

    master, work_dir = standalone_cluster
    records, stats = orders(GeneratorConfig(count=3000, duplicate_rate=0.2, malformed=5, seed=11))
    produce(kafka, topic, list(records))
    spec = orders_spec(topic, name="clustered", max_offsets=2000)
    spec_path = tmp_path / "clustered.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    cluster_settings = Settings.from_env(tmp_path / "cluster").with_(
        kafka_bootstrap=kafka, warehouse=f"s3://{BUCKET}/warehouse/{topic}"
    )
    # The driver's event log (spark-submit reads spark-defaults.conf from SPARK_CONF_DIR): which
    # executor ran what, and the Hadoop properties, where Spark put the keys (it must hold them redacted).
    conf_dir, events_dir = tmp_path / "spark-conf", tmp_path / "events"
    conf_dir.mkdir()
    events_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        # Uncompressed: Spark 4 compresses event logs with zstd by default.
        f"spark.eventLog.enabled true\nspark.eventLog.compress false\nspark.eventLog.dir file://{events_dir}\n"
        "spark.cores.max 2\nspark.sql.shuffle.partitions 4\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    engine_dir = tmp_path / "engine"
    driver = engine.start(engine_dir, master=master, memory="1g")
    try:
        assert driver.master == master
        cluster_summary = run_cli(cluster_settings, spec_path, driver.url)
    finally:
        engine.stop(engine_dir)

    local_settings = Settings.from_env(tmp_path / "local").with_(kafka_bootstrap=kafka)
    local_summary = Pipeline(spec, local_settings, spark=spark, log=lambda m: None).run()
    assert silver(cluster_settings, spec) == silver(local_settings, spec)
    assert len(silver(cluster_settings, spec)) == stats.expected_unique
    for key in ("read", "inserted", "duplicates_dropped", "quarantined", "clickhouse_rows_loaded"):
        assert cluster_summary[key] == local_summary[key], key
    with open_client(cluster_settings.clickhouse_dsn) as client:
        assert client.query(f"SELECT count() FROM {qualified_table(spec)}").result_rows[0][0] == stats.expected_unique

    # The work ran in executors launched by the two workers, not in the driver.
    for worker in ("worker-1", "worker-2"):
        assert list((work_dir / worker).glob("app-*/*/stderr")), f"no executor was launched on {worker}"
    executors_of = tasks_by_execution(events_dir)
    anti_joins = [e for plan, e in executors_of.items() if "LeftAnti" in plan]
    # A Delta write's tasks run the plan of the data it writes, which carries the write's observed
    # metrics (state/delta_spark.append_once names them rh_append_<table>_<digest>).
    writes = [e for plan, e in executors_of.items() if "rh_append_" in plan]
    assert anti_joins and writes, sorted(p.splitlines()[0] for p in executors_of)
    assert "driver" not in set().union(*anti_joins) | set().union(*writes)
    assert len(set().union(*executors_of.values()) - {"driver"}) == 2  # both workers' executors had tasks

    for log in work_dir.glob("worker-*/app-*/*/std*"):
        assert SECRET not in log.read_text(errors="replace")
    event_log = "".join(p.read_text(errors="replace") for p in events_dir.rglob("*") if p.is_file())
    assert '"fs.s3a.secret.key"' in event_log  # Spark's Hadoop configuration held the key ...
    assert SECRET not in event_log  # ... and the event log only its redaction
    assert SECRET not in (engine_dir / "spark-engine.conf").read_text()
