"""Which Spark a process gets, and with which settings, without starting one.

The engine's lifecycle against a real Spark Connect server is tests/integration/test_engine.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from riverhouse.platform.errors import EngineUnavailable
from riverhouse.platform.runtime import engine, processes
from riverhouse.platform.runtime.jars import JSON_EXTENSION, JSON_JAR
from riverhouse.platform.runtime.jvm_build import in_spark_jars
from riverhouse.platform.runtime.spark import (
    REDACTION_CONF,
    SparkConfError,
    configured_master,
    connect_session_conf,
    get_spark,
    session_conf,
    session_url,
    shared_session_id,
    user_conf,
)
from riverhouse.platform.state.settings import Settings, SettingsError
from riverhouse.resources import SPARK_MASTER, resources_from_settings
from tests.conftest import riverhouse_cmd

pytestmark = pytest.mark.unit

SPARK_ENV = ("RIVERHOUSE_SPARK_REMOTE", "RIVERHOUSE_SPARK_CONF", "RIVERHOUSE_SPARK_MASTER", "PYSPARK_GATEWAY_PORT")


@pytest.fixture(autouse=True)
def clean_spark_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SPARK_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def record_engine(home: Path, pid: int, url: str) -> None:
    """The state file `riverhouse engine start` writes once its engine answers."""
    folder = home / "engine"
    folder.mkdir(parents=True)
    state = {"pid": pid, "url": url, "started_at": 0.0, "master": "local[2]", "memory": "2g"}
    (folder / "state.json").write_text(json.dumps(state))


# ------------------------------------------------------------------ which engine
def test_remote_variable_points_every_session_and_the_dagster_resource_at_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RIVERHOUSE_SPARK_REMOTE", "sc://spark-connect:15002")
    record_engine(tmp_path, os.getpid(), "sc://127.0.0.1:1")  # a running local engine loses to the variable
    settings = Settings.from_env(tmp_path)
    assert settings.spark_remote == "sc://spark-connect:15002"
    spark = resources_from_settings(settings)["riverhouse"].spark  # type: ignore[attr-defined]
    assert spark.spark_config["spark.remote"] == "sc://spark-connect:15002"  # the UI shows where runs go
    assert spark.spark_config["spark.sql.runSQLOnFiles"] == "false"


def test_a_remote_with_a_token_stays_out_of_settings_and_output(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = "sc://connect.riverhouse.invalid:443/;use_ssl=true;token=s3cr3t-t0ken"
    monkeypatch.setenv("RIVERHOUSE_SPARK_REMOTE", url)
    settings = Settings.from_env(tmp_path)
    assert "spark.remote" not in settings.spark_conf  # it would be shown in Dagster's resource config
    assert settings.spark_remote == url  # sessions still reach it, from the environment
    proc = subprocess.run(
        [*riverhouse_cmd(), "engine", "status", "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "RIVERHOUSE_SPARK_REMOTE": url},
        timeout=120,
    )
    assert proc.returncode == 1  # nothing answers there
    assert "connect.riverhouse.invalid:443" in proc.stdout and "s3cr3t" not in proc.stdout + proc.stderr


def test_the_running_engine_of_the_home_is_used_and_a_dead_one_is_not(tmp_path: Path) -> None:
    assert Settings.from_env(tmp_path / "none").spark_remote is None  # no engine: Spark in-process
    record_engine(tmp_path / "up", os.getpid(), "sc://127.0.0.1:41234")
    assert Settings.from_env(tmp_path / "up").spark_conf["spark.remote"] == "sc://127.0.0.1:41234"
    record_engine(tmp_path / "down", dead_pid(), "sc://127.0.0.1:41235")
    assert Settings.from_env(tmp_path / "down").spark_remote is None


def test_a_remote_that_is_not_a_spark_connect_url_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RIVERHOUSE_SPARK_REMOTE", "spark://master:7077")
    with pytest.raises(SettingsError, match=r"RIVERHOUSE_SPARK_REMOTE.*sc://host:port"):
        Settings.from_env(tmp_path)


def test_a_down_engine_fails_at_once_naming_the_command_that_starts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Other tests of this process may have made it a Connect client already (the shared test engine).
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    port = processes.free_port()
    with pytest.raises(EngineUnavailable) as info:
        get_spark(conf={"spark.remote": f"sc://127.0.0.1:{port}"})
    assert f"127.0.0.1:{port}" in str(info.value) and "`riverhouse engine start`" in str(info.value)
    # Refused before pyspark became a Spark Connect client: this process may still run Spark in-process.
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("sc://h:1234", ("h", 1234)),
        ("sc://h", ("h", 15002)),
        ("sc://h:99/;token=x;use_ssl=true", ("h", 99)),
        ("sc://[::1]:7", ("::1", 7)),
    ],
)
def test_spark_connect_addresses(url: str, where: tuple[str, int]) -> None:
    assert engine.parse_remote(url) == where


@pytest.mark.parametrize(
    ("remote", "url"),
    [
        ("sc://h:1", "sc://h:1/;session_id=S"),
        ("sc://h:1/", "sc://h:1/;session_id=S"),  # pyspark refuses a path: `sc://h:1//;...` failed
        ("sc://h:1/;token=x;use_ssl=true", "sc://h:1/;token=x;use_ssl=true;session_id=S"),
    ],
)
def test_the_shared_session_is_named_in_the_url_beside_its_parameters(remote: str, url: str) -> None:
    assert session_url(remote, "S") == url
    assert session_url(url, None) == remote.rstrip("/")  # a session of its own: the name goes, the rest stays


def test_the_shared_session_follows_the_engine_and_the_settings_but_not_their_order_or_secrets() -> None:
    one = shared_session_id("sc://h:1/;token=a", {"x": "1", "y": "2"})
    assert shared_session_id("sc://h:1/;token=b", {"y": "2", "x": "1"}) == one  # the token is not part of it
    assert shared_session_id("sc://h:2", {"x": "1", "y": "2"}) != one
    assert shared_session_id("sc://h:1", {"x": "1", "y": "3"}) != one
    assert shared_session_id("sc://h:1", {"x": "1", "y": "2"}, generation=1) != one


# ------------------------------------------------------------------ which settings
def test_small_machine_defaults_apply_in_local_mode_only() -> None:
    local = session_conf("local[2]")
    assert local["spark.sql.shuffle.partitions"] == "4" and local["spark.driver.memory"] == "2g"
    assert local["spark.ui.enabled"] == "false"
    cluster = session_conf("spark://master:7077")
    for key in ("spark.sql.shuffle.partitions", "spark.driver.memory", "spark.ui.enabled"):
        assert key not in cluster  # the cluster's spark-defaults.conf decides
    for conf in (local, cluster):
        assert conf["spark.sql.session.timeZone"] == "UTC"
        extensions = conf["spark.sql.extensions"].split(",")
        assert extensions[0] == "io.delta.sql.DeltaSparkSessionExtension"
        # Riverhouse's own (riverhouse_from_json) wherever `make jars` built its jar.
        assert extensions[1:] == ([JSON_EXTENSION] if in_spark_jars(JSON_JAR) else [])


def test_user_settings_override_defaults_but_never_the_fixed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "RIVERHOUSE_SPARK_CONF", '{"spark.sql.shuffle.partitions": 16, "spark.sql.adaptive.enabled": false}'
    )
    conf = session_conf("local[2]", {"spark.executor.memory": "3g", "spark.sql.runSQLOnFiles": "true"})
    assert conf["spark.sql.shuffle.partitions"] == "16"
    assert conf["spark.sql.adaptive.enabled"] == "false"  # JSON booleans as Spark spells them
    assert conf["spark.executor.memory"] == "3g"
    assert conf["spark.sql.runSQLOnFiles"] == "false"  # the resource's config cannot lift it either
    assert {k: conf[k] for k in REDACTION_CONF} == REDACTION_CONF


def test_a_fixed_setting_given_its_own_value_is_accepted() -> None:
    assert user_conf('{"spark.sql.session.timeZone": "UTC"}') == {"spark.sql.session.timeZone": "UTC"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("spark.sql.shuffle.partitions=8", "is not JSON"),
        ('["spark.x"]', "must be a JSON object"),
        ('{"spark.redaction.regex": "nothing"}', "keeps fixed"),
        ('{"spark.sql.runSQLOnFiles": "true"}', "keeps fixed"),
        # Another zone would read "2026-01-02T03:04:05" as another instant, and date records on another day.
        ('{"spark.sql.session.timeZone": "America/New_York"}', "times are read in UTC"),
        ('{"spark.master": "yarn"}', "set RIVERHOUSE_SPARK_MASTER instead"),
        ('{"spark.remote": "sc://h:1"}', "set RIVERHOUSE_SPARK_REMOTE instead"),
        ('{"executor.memory": "1g"}', "must be a Spark setting"),
        ('{"spark.jars": ["a.jar"]}', "must be a Spark setting"),
    ],
)
def test_wrong_spark_settings_are_refused_naming_the_variable(
    text: str, message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(SparkConfError, match=message):
        user_conf(text)
    monkeypatch.setenv("RIVERHOUSE_SPARK_CONF", text)
    with pytest.raises(SettingsError, match="RIVERHOUSE_SPARK_CONF"):
        Settings.from_env(tmp_path)  # every command says it before anything starts


def test_the_master_comes_from_the_environment_when_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert configured_master() == "local[2]"
    (tmp_path / "spark-defaults.conf").write_text("# cluster\nspark.master   spark://m:7077\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert configured_master() == "spark://m:7077"
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")  # started by spark-submit: its --master is in the JVM
    assert configured_master() == ""
    monkeypatch.setenv("RIVERHOUSE_SPARK_MASTER", "local[1]")
    assert configured_master() == "local[1]"
    assert Settings.from_env(tmp_path).spark_master == "local[1]"
    spark = resources_from_settings(Settings.from_env(tmp_path))["riverhouse"].spark  # type: ignore[attr-defined]
    assert spark.spark_config[SPARK_MASTER] == "local[1]"


def test_a_connect_client_sets_only_session_sql_settings() -> None:
    conf = connect_session_conf(session_conf("local[2]"))
    assert conf["spark.sql.shuffle.partitions"] == "4"
    assert conf["spark.databricks.delta.snapshotPartitions"] == "4"
    assert conf["spark.sql.runSQLOnFiles"] == "false"
    assert conf["spark.sql.redaction.options.regex"] == REDACTION_CONF["spark.sql.redaction.options.regex"]
    for server_only in ("spark.sql.extensions", "spark.sql.catalog.spark_catalog", "spark.driver.memory", "spark.jars"):
        assert server_only not in conf


# ------------------------------------------------------------------ the server's command
def java_properties(text: str) -> dict[str, str]:
    """key=value lines as java.util.Properties reads them (backslash escapes)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        out[key] = value.replace("\\\\", "\0").replace("\\n", "\n").replace("\0", "\\")
    return out


def test_the_engine_command_puts_every_jar_on_the_drivers_class_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from riverhouse.platform.runtime.jars import spark_jar_files

    if not spark_jar_files():
        pytest.fail("jvm/lib/spark is empty: run `make jars`")
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")  # this process is a Connect client...
    monkeypatch.setenv("RIVERHOUSE_SPARK_REMOTE", "sc://elsewhere:1")
    argv, env = engine.server_command(tmp_path, "local[2]", "1g", "127.0.0.1", 15555)
    assert "SPARK_CONNECT_MODE_ENABLED" not in env and "RIVERHOUSE_SPARK_REMOTE" not in env  # ... the server is not
    # foreachBatch workers import this riverhouse: forked by the fork server started beside the
    # JVM (same interpreter), through the launcher that is the local engine's PYSPARK_PYTHON
    assert env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert env["PYSPARK_PYTHON"] == str(tmp_path / "worker-python")
    assert f"exec {sys.executable} -I -S " in Path(env["PYSPARK_PYTHON"]).read_text()
    assert f"{sys.executable} -m riverhouse.platform.runtime.worker_fork " in argv[2]
    assert argv[argv.index("--class") + 1] == engine.SERVER_CLASS
    assert argv[argv.index("--driver-memory") + 1] == "1g"
    jars = argv[argv.index("--driver-class-path") + 1].split(os.pathsep)
    assert "--jars" not in argv  # a local engine's executors are in the driver's JVM
    assert {Path(j).name for j in jars} >= {j.name for j in spark_jar_files()}
    assert any(Path(j).name.startswith("spark-connect_") for j in jars)
    conf_file = Path(argv[argv.index("--properties-file") + 1])
    assert conf_file.stat().st_mode & 0o077 == 0  # a user's settings may hold credentials
    conf = java_properties(conf_file.read_text())
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.connect.grpc.binding.port"] == "15555"
    assert {k: conf[k] for k in REDACTION_CONF} == REDACTION_CONF  # backslashes survive the file
    assert "spark.jars" not in conf  # the class path is the one list


def test_a_cluster_engine_ships_its_jars_and_keeps_the_plain_interpreter(tmp_path: Path) -> None:
    """A cluster's executors need the jars, and run the driver's PYSPARK_PYTHON: the launcher and
    the fork server exist on this machine only."""
    argv, env = engine.server_command(tmp_path, "spark://master:7077", "1g", "127.0.0.1", 15555)
    assert env["PYSPARK_PYTHON"] == sys.executable
    # the executors fetch the jars the driver has on its class path
    assert argv[argv.index("--jars") + 1].split(",") == argv[argv.index("--driver-class-path") + 1].split(os.pathsep)
    assert "worker_fork" not in argv[2] and not (tmp_path / "worker-python").exists()


def test_an_engine_for_one_command_adds_its_java_options_to_the_settings_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`riverhouse demo`'s own engine compiles with C1 only and collects with the serial collector;
    the log settings stay, and a user's too; a collector the user chose is not joined by a second."""

    def driver_options(user_options: str, java_tool_options: str = "") -> list[str]:
        monkeypatch.setenv("JAVA_TOOL_OPTIONS", java_tool_options)
        monkeypatch.setenv("RIVERHOUSE_SPARK_CONF", json.dumps({"spark.driver.extraJavaOptions": user_options}))
        short = engine.SHORT_LIVED_ENGINE_JAVA_OPTIONS
        argv, _ = engine.server_command(tmp_path, "local[2]", "1g", "127.0.0.1", 15555, short)
        conf = java_properties(Path(argv[argv.index("--properties-file") + 1]).read_text())
        return list(conf["spark.driver.extraJavaOptions"].split())

    options = driver_options("-Dmine=1")
    # A user's options keep the driver's UTC zone (runtime/spark.py UTC_JVM), unless they name one.
    assert options[:6] == [
        "-Dmine=1",
        "-Duser.timezone=UTC",
        "-XX:-DontCompileHugeMethods",  # runtime/huge_methods.py: the record rules in whole-stage code
        "-XX:TieredStopAtLevel=1",
        "-XX:ReservedCodeCacheSize=240m",
        "-XX:+UseSerialGC",
    ]
    assert "-Duser.timezone=UTC" not in driver_options("-Duser.timezone=Europe/Paris")
    for chosen in (driver_options("-XX:+UseG1GC"), driver_options("-Dmine=1", "-XX:+UseParallelGC")):
        assert "-XX:+UseSerialGC" not in chosen and "-XX:TieredStopAtLevel=1" in chosen
    # Spark puts spark.driver.defaultJavaOptions on the same command line: a collector there counts too.
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "")
    defaults = {"spark.driver.defaultJavaOptions": "-XX:+UseZGC"}
    monkeypatch.setenv("RIVERHOUSE_SPARK_CONF", json.dumps(defaults))
    argv, _ = engine.server_command(
        tmp_path, "local[2]", "1g", "127.0.0.1", 15555, engine.SHORT_LIVED_ENGINE_JAVA_OPTIONS
    )
    conf = java_properties(Path(argv[argv.index("--properties-file") + 1]).read_text())
    assert "-XX:+UseSerialGC" not in conf["spark.driver.extraJavaOptions"]
    monkeypatch.delenv("JAVA_TOOL_OPTIONS")
    monkeypatch.setenv("RIVERHOUSE_SPARK_CONF", json.dumps({"spark.driver.extraJavaOptions": "-Dmine=1"}))
    argv, _ = engine.server_command(tmp_path, "local[2]", "1g", "127.0.0.1", 15555)  # `riverhouse engine start`
    conf = java_properties(Path(argv[argv.index("--properties-file") + 1]).read_text())
    assert conf["spark.driver.extraJavaOptions"].split()[0] == "-Dmine=1"
    assert "TieredStopAtLevel" not in conf["spark.driver.extraJavaOptions"]


def test_the_class_archive_is_named_for_its_class_path_and_used_only_when_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from riverhouse.platform.runtime import class_archive

    monkeypatch.setenv("RIVERHOUSE_JARS", str(tmp_path))
    monkeypatch.delenv(class_archive.DISABLE_ENV, raising=False)
    archive = class_archive.archive_path(Path("/spark"), ["/a.jar", "/b.jar"])
    assert archive.parent == tmp_path and archive.suffix == ".jsa"
    assert class_archive.archive_path(Path("/spark"), ["/a.jar", "/c.jar"]) != archive  # another class path
    assert class_archive.archive_path(Path("/other"), ["/a.jar", "/b.jar"]) != archive  # another Spark home
    assert class_archive.java_options(archive) == ""  # not made: engines start as before
    archive.write_bytes(b"x")
    assert class_archive.java_options(archive) == f"-XX:SharedArchiveFile={archive}"
    monkeypatch.setenv(class_archive.DISABLE_ENV, "1")
    assert class_archive.java_options(archive) == ""


def test_installing_an_archive_replaces_only_older_ones_of_its_kind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from riverhouse.platform.runtime import class_archive

    monkeypatch.setenv("RIVERHOUSE_JARS", str(tmp_path))
    engine_old = class_archive.archive_path(Path("/spark"), ["/a.jar"])
    broker_old = class_archive.archive_path(Path("kafka.Kafka"), ["/k1.jar"], kind="broker")
    assert engine_old.name.startswith("engine-") and broker_old.name.startswith("broker-")
    for old in (engine_old, broker_old):
        old.write_bytes(b"old")
    broker_new = class_archive.archive_path(Path("kafka.Kafka"), ["/k2.jar"], kind="broker")
    partial = tmp_path / "broker.partial"
    partial.write_bytes(b"new")
    assert class_archive.install(partial, broker_new)
    # The broker's new archive replaces its old one; the engine's stays.
    assert sorted(p.name for p in tmp_path.glob("*.jsa")) == sorted([engine_old.name, broker_new.name])
    assert broker_new.read_bytes() == b"new" and not partial.exists()
    empty = tmp_path / "empty.partial"
    empty.write_bytes(b"")
    assert not class_archive.install(empty, broker_new)  # a JVM that wrote nothing installs nothing
    assert broker_new.read_bytes() == b"new" and not empty.exists()


def test_a_collector_in_spark_defaults_conf_is_not_joined_by_a_second(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """spark-submit adds spark-defaults.conf's driver options to the JVM's command line: a collector
    chosen there counts, as one in the settings does (a JVM refuses to start with two)."""
    from riverhouse.platform.runtime.collector import LOCAL_COLLECTOR, with_local_collector
    from riverhouse.platform.runtime.spark_defaults import spark_defaults

    monkeypatch.delenv("JAVA_TOOL_OPTIONS", raising=False)
    settings = {"spark.driver.extraJavaOptions": "-Dmine=1"}
    assert with_local_collector(settings)["spark.driver.extraJavaOptions"] == f"-Dmine=1 {LOCAL_COLLECTOR}"
    (tmp_path / "spark-defaults.conf").write_text(
        "# a cluster's defaults\n"
        "spark.master=spark://m:7077\n"
        "spark.executor.memory : 4g\n"
        "spark.driver.defaultJavaOptions   -XX:+UseG1GC -Dsite=a=b\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert spark_defaults() == {
        "spark.master": "spark://m:7077",
        "spark.executor.memory": "4g",
        "spark.driver.defaultJavaOptions": "-XX:+UseG1GC -Dsite=a=b",
    }
    assert configured_master() == "spark://m:7077"
    assert with_local_collector(settings) == settings
    argv, _ = engine.server_command(
        tmp_path, "local[2]", "1g", "127.0.0.1", 15555, engine.SHORT_LIVED_ENGINE_JAVA_OPTIONS
    )
    conf = java_properties(Path(argv[argv.index("--properties-file") + 1]).read_text())
    assert "-XX:+UseSerialGC" not in conf["spark.driver.extraJavaOptions"]
    # The same file without a collector: Riverhouse's is added.
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.defaultJavaOptions -Dsite=a\n")
    assert LOCAL_COLLECTOR in with_local_collector(settings)["spark.driver.extraJavaOptions"]


def test_spark_defaults_confs_driver_options_are_kept_beside_riverhouses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """spark-submit lets a setting it is given replace spark-defaults.conf's whole: the file's
    driver options (a cluster's proxy, Kerberos or agent flags) must stay in Riverhouse's, for an
    in-process session and for the engine alike."""
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Dsite.proxy=p:3128 -Dkrb=1\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    options = session_conf("local[2]")["spark.driver.extraJavaOptions"].split()
    assert {"-Dsite.proxy=p:3128", "-Dkrb=1", "-Duser.timezone=UTC"} <= set(options)
    assert options[0].startswith("-Dlog4j2.configurationFile=")  # the file's may replace Riverhouse's log settings
    argv, _ = engine.server_command(tmp_path, "local[2]", "1g", "127.0.0.1", 15555)
    conf = java_properties(Path(argv[argv.index("--properties-file") + 1]).read_text())
    assert "-Dsite.proxy=p:3128" in conf["spark.driver.extraJavaOptions"].split()
    # A user's RIVERHOUSE_SPARK_CONF still decides the whole value, as before.
    monkeypatch.setenv("RIVERHOUSE_SPARK_CONF", json.dumps({"spark.driver.extraJavaOptions": "-Dmine=1"}))
    assert "-Dkrb=1" not in session_conf("local[2]")["spark.driver.extraJavaOptions"]


def test_the_jvms_that_run_tasks_compile_huge_methods_and_the_parse_knows_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """runtime/huge_methods.py: the driver's JVM in local mode, the executors' on a cluster (beside
    spark-defaults.conf's executor options), unless the user's options say otherwise."""
    from riverhouse.platform.runtime.huge_methods import FLAG, compiles_huge_methods

    monkeypatch.delenv("RIVERHOUSE_SPARK_CONF", raising=False)
    (tmp_path / "spark-defaults.conf").write_text("spark.executor.extraJavaOptions -Dsite=1\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    local = session_conf("local[2]")
    assert FLAG in local["spark.driver.extraJavaOptions"].split()
    assert "spark.executor.extraJavaOptions" not in local  # local mode: the driver runs the tasks
    cluster = session_conf("spark://m:7077")
    assert cluster["spark.executor.extraJavaOptions"].split() == ["-Dsite=1", FLAG]
    argv, _ = engine.server_command(tmp_path, "spark://m:7077", "1g", "127.0.0.1", 15555)
    conf = java_properties(Path(argv[argv.index("--properties-file") + 1]).read_text())
    assert FLAG in conf["spark.executor.extraJavaOptions"].split()
    # The user's own choice stays, and the parse then plans the rules outside whole-stage code.
    monkeypatch.setenv(
        "RIVERHOUSE_SPARK_CONF", json.dumps({"spark.driver.extraJavaOptions": "-XX:+DontCompileHugeMethods"})
    )
    refused = session_conf("local[2]")
    assert FLAG not in refused["spark.driver.extraJavaOptions"].split()

    class Session:
        def __init__(self, conf: dict[str, str]) -> None:
            self.conf = type("Conf", (), {"get": lambda _, key, default=None: conf.get(key, default)})()

    assert compiles_huge_methods(Session({"spark.master": "local[2]", **local}))
    assert not compiles_huge_methods(Session({"spark.master": "local[2]", **refused}))
    assert compiles_huge_methods(Session({"spark.master": "spark://m:7077", **cluster}))
    assert not compiles_huge_methods(Session({"spark.master": "spark://m:7077", "spark.driver.extraJavaOptions": FLAG}))
