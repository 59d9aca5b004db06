"""Pipelines through the real broker's SASL_SSL (SCRAM-SHA-512) and mTLS listeners; bad secrets fail clearly."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.errors import PipelineError
from riverhouse.platform.kafka import kafka_tls, local_kafka
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.state.settings import Settings
from tests.conftest import order, produce, riverhouse_cmd, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def password_var(pipeline: str) -> str:
    """The pipeline's own variable: a spec reads only RIVERHOUSE_SECRET_<PIPELINE>__* (or what is bound to it)."""
    return f"RIVERHOUSE_SECRET_{pipeline.upper()}__KAFKA_PASSWORD"


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_kafka.LocalKafkaState]:
    state_dir = tmp_path_factory.mktemp("secure_kafka")
    state = local_kafka.start(state_dir, secure=True)
    yield state
    local_kafka.stop(state_dir)


def secure_files(broker: local_kafka.LocalKafkaState) -> tuple[dict[str, str], dict[str, str]]:
    folder = Path(broker.state_dir) / "secure"
    return kafka_tls.credentials(folder), kafka_tls.client_files(folder)


def sasl_security(broker: local_kafka.LocalKafkaState, pipeline: str) -> dict[str, str]:
    """The spec's one portable security section: Spark's Java client and librdkafka both get it."""
    creds, files = secure_files(broker)
    return {
        "protocol": "SASL_SSL",
        "mechanism": "SCRAM-SHA-512",
        "username": creds["username"],
        "password": "${env:" + password_var(pipeline) + "}",
        "ca": files["ca"],
    }


def mtls_security(
    broker: local_kafka.LocalKafkaState, cert: str | None = None, key: str | None = None
) -> dict[str, str]:
    _, files = secure_files(broker)
    return {
        "protocol": "SSL",
        "ca": files["ca"],
        "certificate": cert or files["certificate"],
        "key": key or files["key"],
    }


def spec_data(name: str, topic: str, bootstrap: str, security: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "kafka": {"bootstrap_servers": bootstrap, "security": security},
        "sources": {
            "orders": {
                "topic": topic,
                "fields": {"order_id": "string", "amount": "int", "created_at": "timestamp"},
                "key": ["order_id"],
                "event_time": {"field": "created_at"},
                "dedup": {"key": ["order_id"], "window": "1h"},
            }
        },
        "sink": {"table": f"{name}_orders", "order_by": ["order_id"]},
    }


def producer_config(broker: local_kafka.LocalKafkaState) -> dict[str, str]:
    """librdkafka settings of the test's own producer (written out, not derived from the code under test)."""
    creds, files = secure_files(broker)
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": creds["username"],
        "sasl.password": creds["password"],
        "ssl.ca.location": files["ca"],
    }


def events(count: int) -> list[tuple[bytes, bytes]]:
    records = [order(f"o{i}", f"2026-01-01T10:{i % 60:02d}:00Z", amount=i) for i in range(count)]
    return records + records[:7]  # seven producer retries


def clickhouse_ids(settings: Settings, spec: Any) -> list[str]:
    with open_client(settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT order_id FROM {qualified_table(spec)}").result_rows
    return sorted(r[0] for r in rows)


def test_pipeline_through_sasl_ssl_with_the_password_from_the_environment(
    secure_broker: local_kafka.LocalKafkaState, topic: str, settings: Settings, tmp_path: Path
) -> None:
    """The spec names the variable; the password is only in the environment of the run (and Spark's workers)."""
    creds, _ = secure_files(secure_broker)
    produce(secure_broker.listeners["SASL_SSL"], topic, events(40), config=producer_config(secure_broker))
    # Only the SASL_SSL address: the plaintext listener is not what the pipeline uses.
    data = spec_data("sasl_pipe", topic, secure_broker.listeners["SASL_SSL"], sasl_security(secure_broker, "sasl_pipe"))
    spec_file = tmp_path / "sasl.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    env = subprocess_env(settings, RIVERHOUSE_KAFKA_BOOTSTRAP="", **{password_var("sasl_pipe"): creds["password"]})
    ran = subprocess.run(
        [*riverhouse_cmd(), "run", str(spec_file), "--json"], capture_output=True, text=True, env=env, timeout=600
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert clickhouse_ids(settings, parse_spec(data)) == sorted(f"o{i}" for i in range(40))
    assert creds["password"] not in ran.stdout + ran.stderr


def test_pipeline_through_mtls_from_the_command_line(
    secure_broker: local_kafka.LocalKafkaState, topic: str, settings: Settings, tmp_path: Path
) -> None:
    """`generate --spec` and `run` both connect with the client certificate named in the spec."""
    spec_file = tmp_path / "mtls.yaml"
    spec_file.write_text(
        yaml.safe_dump(spec_data("mtls_pipe", topic, secure_broker.listeners["SSL"], mtls_security(secure_broker)))
    )
    env = subprocess_env(settings, RIVERHOUSE_KAFKA_BOOTSTRAP="")
    common = {"capture_output": True, "text": True, "env": env, "timeout": 600}
    generate = [*riverhouse_cmd(), "generate", "--spec", str(spec_file), "--topic", topic, "--count", "300"]
    generated = subprocess.run([*generate, "--malformed", "0", "--json"], **common)
    assert generated.returncode == 0, generated.stderr[-2000:]
    expected = json.loads(generated.stdout)["expected_unique"]
    ran = subprocess.run([*riverhouse_cmd(), "run", str(spec_file), "--json"], **common)
    assert ran.returncode == 0, ran.stderr[-3000:]
    spec = parse_spec(yaml.safe_load(spec_file.read_text()))
    ids = clickhouse_ids(settings, spec)
    assert len(ids) == len(set(ids)) == expected == 300


def test_a_wrong_password_fails_clearly_without_printing_a_secret(
    secure_broker: local_kafka.LocalKafkaState, topic: str, settings: Settings, tmp_path: Path
) -> None:
    creds, _ = secure_files(secure_broker)
    produce(secure_broker.bootstrap, topic, events(5))
    spec_file = tmp_path / "wrong.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            spec_data("wrong_pw", topic, secure_broker.listeners["SASL_SSL"], sasl_security(secure_broker, "wrong_pw"))
        )
    )
    wrong = "not-the-password-" + creds["password"][:4]
    env = subprocess_env(settings, RIVERHOUSE_KAFKA_BOOTSTRAP="", **{password_var("wrong_pw"): wrong})
    ran = subprocess.run(
        [*riverhouse_cmd(), "run", str(spec_file)], capture_output=True, text=True, env=env, timeout=600
    )
    output = ran.stdout + ran.stderr
    assert ran.returncode == 1
    assert "Authentication failed" in output and "SCRAM-SHA-512" in output, output[-3000:]
    assert "no answer within" not in output  # refused credentials fail at once, not after the timeout
    assert "Traceback" not in output
    assert wrong not in output and creds["password"] not in output


def test_an_untrusted_client_certificate_is_refused_clearly(
    spark: Any, secure_broker: local_kafka.LocalKafkaState, topic: str, settings: Settings, tmp_path: Path
) -> None:
    # A certificate of another CA: the broker's mTLS listener must not accept it.
    key, cert = kafka_tls.make_certificate("intruder")
    (tmp_path / "intruder.pem").write_bytes(kafka_tls.pem(None, cert))
    (tmp_path / "intruder.key").write_bytes(kafka_tls.pem(key))
    security = mtls_security(secure_broker, str(tmp_path / "intruder.pem"), str(tmp_path / "intruder.key"))
    spec = parse_spec(spec_data("intruder", topic, secure_broker.listeners["SSL"], security))
    with pytest.raises(PipelineError) as failure:
        Pipeline(spec, settings.with_(kafka_bootstrap=None), spark=spark, log=lambda m: None).run()
    message = str(failure.value)
    assert "cannot reach Kafka" in message and "SSL" in message, message
    assert "no answer within" not in message  # a refused certificate fails at once, not after the timeout
    assert "Traceback" not in message


def analyzed_plan(frame: Any) -> str:
    """The plan Spark analysed, as Spark shows it (explain extended), on a local session or through Connect."""
    if hasattr(frame, "_jdf"):
        jvm = frame.sparkSession.sparkContext._jvm
        return jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(), "extended")
    return frame._explain_string(extended=True)


def engine_files() -> dict[str, str]:
    """The shared test engine's settings file and logs (what an operator of the engine sees)."""
    from tests.conftest import ENGINE_DIR

    out: dict[str, str] = {}
    for folder in ENGINE_DIR:
        for path in folder.rglob("*"):
            if path.is_file() and path.suffix in (".conf", ".log", ".out", ".json"):
                out[str(path)] = path.read_text(errors="replace")
    return out


def test_the_password_is_redacted_from_plans_progress_and_the_environment(
    spark: Any,
    secure_broker: local_kafka.LocalKafkaState,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A real query through SASL_SSL: the resolved password is in the connector's options, and nowhere Spark shows."""
    from riverhouse.platform.kafka.client import connector_options

    creds, _ = secure_files(secure_broker)
    produce(secure_broker.listeners["SASL_SSL"], topic, events(5), config=producer_config(secure_broker))
    monkeypatch.setenv(password_var("redacted"), creds["password"])
    spec = parse_spec(
        spec_data("redacted", topic, secure_broker.listeners["SASL_SSL"], sasl_security(secure_broker, "redacted"))
    )
    options = connector_options(spec.kafka, secure_broker.listeners["SASL_SSL"], [topic])
    assert creds["password"] in options["kafka.sasl.jaas.config"]  # the query really gets it
    stream = spark.readStream.format("kafka").options(**options).load()
    query = (
        stream.writeStream.format("memory")
        .queryName("redaction_probe")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(Path(secure_broker.state_dir).parent / f"ckpt-{topic}"))
        .start()
    )
    try:
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        assert spark.sql("SELECT count(*) FROM redaction_probe").first()[0] == len(events(5))
        query.explain(True)
        shown = {
            "analyzed plan": analyzed_plan(stream),
            "query plan": capsys.readouterr().out,
            "progress": str(query.recentProgress),
            "session settings": str(spark.conf.getAll),
            **engine_files(),
        }
    finally:
        query.stop()
        spark.catalog.dropTempView("redaction_probe")
    for where, text in shown.items():
        assert creds["password"] not in text, where
    # The options are in the plan, redacted (not merely absent).
    assert "*********(redacted)" in shown["analyzed plan"]


def glassflow_config(topic: str, table: str, connection: dict[str, Any]) -> dict[str, Any]:
    """A GlassFlow v2 pipeline config in its documented form: one deduplicated topic into ClickHouse."""
    fields = [("order_id", "string", "String"), ("amount", "int64", "Int64")]
    return {
        "version": "v2",
        "pipeline_id": table.replace("_", "-"),
        "source": {
            "type": "kafka",
            "connection_params": connection,
            "topics": [
                {
                    "consumer_group_initial_offset": "earliest",
                    "name": topic,
                    "deduplication": {"enabled": True, "id_field": "order_id", "time_window": "1h"},
                }
            ],
        },
        "join": {"enabled": False},
        "sink": {"type": "clickhouse", "host": "clickhouse.internal", "port": "9000", "table": table},
        "schema": {
            "fields": [
                {"source_id": topic, "name": n, "type": t, "column_name": n, "column_type": c} for n, t, c in fields
            ]
        },
    }


def b64(path: str) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
def test_an_imported_glassflow_pipeline_runs_through_the_secure_listener(
    secure_broker: local_kafka.LocalKafkaState, topic: str, settings: Settings, tmp_path: Path, listener: str
) -> None:
    """`riverhouse import` states GlassFlow's Kafka security in kafka.security, and the spec runs as written:
    the CA (and client certificate) written beside it, the password from the environment, the client key
    put where the import says (it is never copied)."""
    creds, files = secure_files(secure_broker)
    produce(secure_broker.listeners["SASL_SSL"], topic, events(40), config=producer_config(secure_broker))
    connection = {"brokers": [secure_broker.listeners[listener]], "protocol": listener, "root_ca": b64(files["ca"])}
    if listener == "SASL_SSL":
        connection |= {"mechanism": "SCRAM-SHA-512", "username": creds["username"], "password": creds["password"]}
    else:
        connection |= {"client_cert": b64(files["certificate"]), "client_key": b64(files["key"])}
    table = f"imported_{listener.lower()}"
    config_path = tmp_path / "glassflow.json"
    config_path.write_text(json.dumps(glassflow_config(topic, table, connection)))
    spec_file = tmp_path / "specs" / "imported.yaml"
    spec_file.parent.mkdir()
    env = subprocess_env(settings, RIVERHOUSE_KAFKA_BOOTSTRAP="")
    common: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 600}
    imported = subprocess.run(
        [*riverhouse_cmd(), "import", "glassflow", str(config_path), "-o", str(spec_file), "--strict"],
        **common,
        env=env,
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
    data = yaml.safe_load(spec_file.read_text())
    assert "config" not in data["kafka"]
    security = data["kafka"]["security"]
    assert security["ca"] == str(spec_file.parent / "imported.kafka-ca.pem")
    assert Path(security["ca"]).read_bytes().strip() == Path(files["ca"]).read_bytes().strip()
    key_text = Path(files["key"]).read_text()
    assert key_text not in spec_file.read_text() + imported.stdout + imported.stderr
    run_env = env
    if listener == "SASL_SSL":
        # The import names the pipeline's own variables (RIVERHOUSE_SECRET_IMPORTED_SASL_SSL__KAFKA_*).
        prefix = f"RIVERHOUSE_SECRET_{data['name'].upper()}__"
        assert security["username"] == "${env:" + prefix + "KAFKA_USERNAME}"
        run_env = env | {prefix + "KAFKA_USERNAME": creds["username"], prefix + "KAFKA_PASSWORD": creds["password"]}
    else:
        assert security["certificate"] == str(spec_file.parent / "imported.kafka-client.pem")
        assert not Path(security["key"]).exists()  # the user puts the secret there, as the note says
        assert security["key"] in " ".join(imported.stderr.split())
        Path(security["key"]).write_text(key_text)
    # From another directory: the paths in the spec do not depend on where the run starts.
    ran = subprocess.run(
        [*riverhouse_cmd(), "run", str(spec_file), "--json"], **common, env=run_env, cwd=settings.home.parent
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert clickhouse_ids(settings, parse_spec(data)) == sorted(f"o{i}" for i in range(40))
    assert creds["password"] not in ran.stdout + ran.stderr
