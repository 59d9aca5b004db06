"""The engine (`riverhouse engine start|stop|status`): a real Spark Connect server, used by real clients.

The clients run in processes of their own, as runs do: pyspark marks a process that made a
Spark Connect session, and this test process may run Spark in-process for other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.runtime import engine, processes
from riverhouse.platform.runtime.spark import REDACTION_CONF
from riverhouse.platform.state.settings import Settings
from tests.conftest import CONNECT_CLIENT_ENV, orders_spec_data, riverhouse_cmd, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# A client as a run is one: its home's settings choose the engine, get_spark attaches to it.
CLIENT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from riverhouse.platform.runtime.spark import get_spark, release_session
    from riverhouse.platform.state.settings import Settings

    work = Path(sys.argv[1])
    settings = Settings.from_env(sys.argv[2])
    spark = get_spark(settings.spark_master, conf=settings.spark_conf)
    out = {"session": type(spark).__module__, "remote": settings.spark_remote}
    out["sum"] = spark.range(1, 101).selectExpr("sum(id) AS s").collect()[0]["s"]
    spark.range(0, 50).selectExpr("id", "id % 7 AS bucket").write.format("delta").save(str(work / "table"))
    out["delta_rows"] = spark.read.format("delta").load(str(work / "table")).count()
    out["redaction"] = {k: spark.conf.get(k) for k in ("spark.redaction.regex", "spark.sql.redaction.options.regex")}
    out["shuffle_partitions"] = spark.conf.get("spark.sql.shuffle.partitions")

    (work / "in").mkdir()
    for n in range(3):
        (work / "in" / f"{n}.json").write_text("\\n".join(json.dumps({"n": n * 10 + j}) for j in range(10)))

    def write_batch(batch, batch_id):
        import os
        from riverhouse.platform.runtime.engine import engine_pid

        batch.write.format("delta").mode("append").save(str(work / "sink"))
        with open(f"/proc/{os.getpid()}/cmdline") as f:
            cmd = f.read().replace("\\0", " ")
        with open(f"/proc/{os.getppid()}/stat") as f:
            grandparent = int(f.read().rsplit(")", 1)[1].split()[1])
        seen = {"ppid": os.getppid(), "grandparent": grandparent, "engine_pid": engine_pid(), "cmd": cmd}
        (work / f"batch-{batch_id}.json").write_text(json.dumps(seen))

    query = (
        spark.readStream.schema("n INT").option("maxFilesPerTrigger", 1).json(str(work / "in"))
        .writeStream.foreachBatch(write_batch).option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    sink = spark.read.format("delta").load(str(work / "sink"))
    out["sink_rows"] = sink.count()
    out["sink_sum"] = sink.selectExpr("sum(n) AS s").collect()[0]["s"]
    release_session(spark)
    print(json.dumps(out))
    """
)


def cli(*args: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*riverhouse_cmd(), *args], capture_output=True, text=True, env=env, timeout=timeout)


def clean_env() -> dict[str, str]:
    drop = {"RIVERHOUSE_SPARK_REMOTE", "RIVERHOUSE_HOME", *CONNECT_CLIENT_ENV}
    return {k: v for k, v in os.environ.items() if k not in drop}


def status(home: Path) -> dict[str, Any]:
    proc = cli("engine", "status", "--json", "--home", str(home), env=clean_env())
    return dict(json.loads(proc.stdout))


def test_engine_lifecycle_serves_dataframes_delta_and_foreach_batch(tmp_path: Path) -> None:
    home = tmp_path / "home"
    down = status(home)
    assert down["running"] is False

    started = cli("engine", "start", "--memory", "1g", "--home", str(home), env=clean_env())
    assert started.returncode == 0, started.stderr
    up = status(home)
    assert up["running"] is True and up["memory"] == "1g" and up["master"] == "local[2]"
    assert up["engine"] in started.stdout  # says where it runs
    pid, url = up["pid"], up["engine"]
    host, port = engine.parse_remote(url)
    assert host == "127.0.0.1"
    assert cli("engine", "start", "--home", str(home), env=clean_env()).stdout.count("already running") == 1

    work = tmp_path / "work"
    work.mkdir()
    client = subprocess.run(
        [sys.executable, "-c", CLIENT, str(work), str(home)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert client.returncode == 0, client.stderr[-3000:]
    out = json.loads(client.stdout.strip().splitlines()[-1])
    assert out["session"].startswith("pyspark.sql.connect") and out["remote"] == url
    assert out["sum"] == 5050
    assert out["delta_rows"] == 50
    assert out["redaction"] == REDACTION_CONF  # the engine started with the fixed settings, escapes intact
    assert out["shuffle_partitions"] == "4"
    assert (out["sink_rows"], out["sink_sum"]) == (30, sum(range(30)))
    batches = [json.loads(p.read_text()) for p in sorted(work.glob("batch-*.json"))]
    assert len(batches) == 3  # maxFilesPerTrigger 1: one batch a file
    for seen in batches:
        # The foreachBatch body runs in a Python worker forked by the engine's fork server, a
        # child of its JVM (runtime/worker_fork.py), and it can name the JVM: what a crash point
        # needs to SIGKILL the engine mid-batch.
        assert "foreach_batch_worker" in seen["cmd"] and "worker_fork" in seen["cmd"]
        assert seen["ppid"] != pid and seen["grandparent"] == pid and seen["engine_pid"] == pid
    assert engine.engine_pid(home / "engine") == pid
    archive = engine.class_archive()  # made by `make install` (make class-archive)
    if archive.is_file():
        assert str(archive) in Path(f"/proc/{pid}/maps").read_text()  # the JVM mapped its classes from it

    stopped = cli("engine", "stop", "--home", str(home), env=clean_env())
    assert stopped.returncode == 0 and "engine stopped" in stopped.stdout
    assert not processes.pid_alive(pid) and not processes.group_alive(pid)  # no JVM, no worker left
    assert not processes.port_open(host, port)
    assert status(home)["running"] is False

    # Started again on its port after a SIGKILL mid-batch: tests/integration/test_crash.py.
    assert engine.status(home / "engine") is None


def test_a_run_whose_engine_is_down_fails_at_once_naming_the_start_command(
    kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    spec = tmp_path / "orders.yaml"
    spec.write_text(yaml.safe_dump(orders_spec_data(topic)))
    down = f"sc://127.0.0.1:{processes.free_port()}"
    env = {k: v for k, v in subprocess_env(settings).items() if k not in CONNECT_CLIENT_ENV}
    proc = cli("run", str(spec), env={**env, "RIVERHOUSE_SPARK_REMOTE": down}, timeout=300)
    assert proc.returncode == 1
    assert "does not answer" in proc.stderr and "`riverhouse engine start`" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_two_pipelines_at_once_on_one_engine_keep_to_their_own_tables_and_marks(
    tmp_path: Path, kafka: str, test_engine: str | None
) -> None:
    """Two runs of two pipelines share the engine at the same moment: each gets exactly its rows,
    every commit of its tables carries its own stream's mark, and no Delta app transaction or
    session setting is used that the other could see (the writes carry their marks themselves)."""
    from riverhouse.platform.kafka.generator import GeneratorConfig, orders
    from riverhouse.platform.state.delta_log import DeltaLog
    from riverhouse.platform.state.tables import TableLayout, open_table
    from tests.conftest import produce

    if not test_engine:
        pytest.skip("runs through the shared test engine (RIVERHOUSE_TEST_ENGINE=local turns it off)")
    settings = Settings.from_env(tmp_path / "home").with_(kafka_bootstrap=kafka)
    procs, expected = [], {}
    for name, seed in (("pair_a", 1), ("pair_b", 2)):
        topic = f"{name}_{os.getpid()}_{seed}"
        records, stats = orders(GeneratorConfig(count=600, duplicate_rate=0.3, seed=seed))
        produce(kafka, topic, list(records))
        expected[name] = {event["order_id"] for event in stats.events}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(orders_spec_data(topic, name=name, max_offsets=200)))
        procs.append(
            subprocess.Popen(
                [*riverhouse_cmd(), "run", str(path), "--json"],
                # The warehouse is shared; embedded ClickHouse (chDB) is one process's at a time.
                env=subprocess_env(settings, RIVERHOUSE_CLICKHOUSE_DSN=f"chdb://{tmp_path / name / 'clickhouse'}"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        assert json.loads(out)["batches"] >= 3  # the two runs' batches interleaved on the engine
    for name, ids in expected.items():
        layout = TableLayout(settings.warehouse, name)
        silver = open_table(layout.silver("orders")).to_pyarrow_table(columns=["order_id"]).column("order_id")
        assert sorted(silver.to_pylist()) == sorted(ids)
        for table in (layout.bronze("orders"), layout.silver("orders")):
            log = DeltaLog(table)
            for version in range(1, log.latest_version() + 1):
                commit = log.commit(version)
                if commit.info.get("operation") == "OPTIMIZE":
                    continue
                app = commit.user_metadata.get("riverhouse.app", "")
                assert app.startswith(f"riverhouse:{name}:orders:"), (table, version, app)
                assert not commit.txns, (table, version)


_SESSION_CLIENT = textwrap.dedent(
    """
    import json, sys
    from riverhouse.platform.runtime.spark import get_spark
    conf = json.loads(sys.argv[1])
    spark = get_spark(conf=conf)
    assert spark.range(3).count() == 3
    if sys.argv[2] == "close":
        spark.client.release_session()  # what the engine does to a session that stayed idle too long
    if sys.argv[2] == "other":  # the same process asks for other settings: another session
        key = "spark.sql.files.maxRecordsPerFile"
        other = get_spark(conf={key: str(int(conf[key]) + 1)})
        assert other.session_id != spark.session_id
        assert spark.conf.get(key) == conf[key]  # the first session kept its own settings
    print(spark.session_id)
    """
)


def test_processes_with_the_same_settings_share_one_engine_session_and_a_closed_one_is_replaced(
    tmp_path: Path, kafka: str, test_engine: str | None
) -> None:
    """Spark caches generated code per session, so runs share one: the same settings give every
    process the same session on the engine, other settings another; once the engine closed it,
    the next process moves on to a new shared one instead of failing."""
    if not test_engine:
        pytest.skip("runs through the shared test engine (RIVERHOUSE_TEST_ENGINE=local turns it off)")
    settings = Settings.from_env(tmp_path / "home").with_(kafka_bootstrap=kafka)
    # A setting no other test uses: these sessions are this test's alone.
    mine = {"spark.sql.files.maxRecordsPerFile": str(10_000_000 + os.getpid())}
    other = {"spark.sql.files.maxRecordsPerFile": str(20_000_000 + os.getpid())}

    def session(conf: dict[str, str], then: str = "") -> str:
        proc = subprocess.run(
            [sys.executable, "-c", _SESSION_CLIENT, json.dumps(conf), then],
            env=subprocess_env(settings, XDG_CACHE_HOME=str(cache)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    cache = tmp_path / "cache"
    first = session(mine)
    assert session(mine) == first
    assert session(other) != first
    assert session(mine, then="other") == first
    assert session(mine, then="close") == first
    replaced = session(mine)
    assert replaced != first
    assert session(mine) == replaced
    # The machine remembers the generation it found open: later processes start there.
    [remembered] = cache.glob("riverhouse/session-*")
    assert remembered.read_text() == "1"


_CLOSING_CLIENT = textwrap.dedent(
    """
    from riverhouse.platform.runtime.spark import close_connect_sessions, get_spark, own_session
    from riverhouse.platform.state.settings import Settings

    settings = Settings.from_env()
    shared = get_spark(conf=settings.spark_conf)
    own = own_session(shared)
    shared.range(3).count(), own.range(3).count()
    close_connect_sessions()
    print(shared.client.is_closed, own.client.is_closed)
    """
)


def test_a_process_that_stops_its_engine_closes_its_sessions_first(tmp_path: Path, test_engine: str | None) -> None:
    """`riverhouse demo` stops the engine it started: pyspark's exit hook asks each open client's
    engine to clear its ML cache, and with the engine gone it retried for ~25 s before the process
    could exit. Every session the process attached is closed first, so the hook skips them."""
    if not test_engine:
        pytest.skip("runs through the shared test engine (RIVERHOUSE_TEST_ENGINE=local turns it off)")
    settings = Settings.from_env(tmp_path / "home")
    proc = subprocess.run(
        [sys.executable, "-c", _CLOSING_CLIENT],
        env=subprocess_env(settings),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "True"]
