"""Issue 27: hardening, second round. Each test takes input that got through on main and asserts the refusal.

Spark's side of item 1 is tests/spark/test_plan_guard.py, item 6 (the Spark parse) is in
tests/spark/test_parse.py, item 9 in tests/unit/test_process_tree.py and
tests/integration/test_ui_stop.py; the fuzz generators of item 4 are in test_spec_fuzz.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.kafka.client import connector_options, librdkafka_config
from riverhouse.platform.sink.clickhouse import ClickHouseLoadError, _scrubbed, check_dsn
from riverhouse.platform.spec import SpecError, load_spec, load_spec_folder, parse_spec
from riverhouse.platform.sql import QueryError, check_generated
from riverhouse.platform.state.settings import dsn_database, redact_dsn
from tests.conftest import REPO
from tests.hostile_files import HOSTILE_FILES

pytestmark = pytest.mark.unit

JOIN_SOURCES = {
    "orders": {
        "topic": "orders",
        "fields": {"order_id": "string", "user_id": "string", "amount": "int", "created_at": "timestamp"},
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


def validate(*paths: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverhouse.cli", "validate", *map(str, paths)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env},
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


# ----------------------------------------------------------------- item 1: a unit slot carried SQL to Spark
# On main this validated, and sqlglot wrote the literal's text back unquoted: Spark called System.getenv.
UNIT_PAYLOAD = (
    "day, `o__created_at`, `o__created_at`) + "
    'length(java_method(concat(lower("java.lang."), initcap(lower("system"))), lower("getenv"), "HOME")) + datediff(day'
)


@pytest.mark.parametrize(
    "query",
    [
        f"SELECT o.order_id, datediff('{UNIT_PAYLOAD}', o.created_at, o.created_at) AS x FROM orders o",
        "SELECT o.order_id, datediff('x', o.created_at, o.created_at) AS x FROM orders o",
        "SELECT o.order_id, date_trunc('reflect(1)', o.created_at) AS x FROM orders o",
    ],
)
def test_a_date_unit_takes_only_unit_words(query: str) -> None:
    assert "is not a date/time unit" in refused(query_spec(query))


def test_known_units_still_validate() -> None:
    spec = parse_spec(
        query_spec(
            "SELECT o.order_id, datediff('day', o.created_at, o.created_at) AS d, "
            "date_trunc('MM', o.created_at) AS m, o.created_at + INTERVAL 2 HOURS AS later FROM orders o"
        )
    )
    assert [name for name, _ in spec.plan.projections] == ["order_id", "d", "m", "later"]


def test_the_sql_generated_for_spark_is_checked_again() -> None:
    columns = {"o__order_id", "o__created_at"}
    check_generated("DATEDIFF(DAY, `o__created_at`, `o__created_at`)", "SELECT d", columns)
    # What main generated for the payload: two expressions (or a Java call) once Spark reads it.
    for generated, message in [
        ("DATEDIFF(DAY) , REFLECT(1, 1, `o__created_at`)", "does not read back as one expression"),
        ("LENGTH(JAVA_METHOD('a', 'b'))", "function java_method() is not allowed"),
        ("`O__SECRET` || 'x'", "not a column of the sources"),
    ]:
        with pytest.raises(QueryError, match=re.escape(message)):
            check_generated(generated, "SELECT x", columns)


def test_a_literal_that_reads_like_a_forbidden_call_is_refused() -> None:
    """Spark prints literals unquoted in its plan: such a literal would look like a call to the plan check."""
    message = refused(query_spec("SELECT o.order_id, concat(o.user_id, 'java_method(x)') AS x FROM orders o"))
    assert "reads like a call of java_method()" in message


@pytest.mark.parametrize("depth", [40, 400, 5000])
def test_deeply_nested_parentheses_are_the_files_error(depth: int) -> None:
    message = refused(query_spec(f"SELECT o.order_id, {'(' * depth}o.amount{')' * depth} AS x FROM orders o"))
    assert "nested more than" in message


# ----------------------------------------------------------------- item 2: kafka.config is an allow-list
@pytest.mark.parametrize(
    "setting",
    [
        {"plugin.library.paths": "/tmp/evil.so"},  # loads a shared library into the sensor's process
        {"ssl.engine.location": "/tmp/evil.so"},
        {"metadata.broker.list": "attacker.example.com:9092"},  # replaces the bootstrap servers
        {"bootstrap.servers": "attacker.example.com:9092"},
        {"interceptor.classes": "com.evil.Interceptor"},
        {"sasl.oauthbearer.token.endpoint.url": "https://attacker.example.com/token"},
    ],
)
def test_settings_outside_the_allow_list_are_refused_by_name(setting: dict[str, str]) -> None:
    data = base()
    data["kafka"]["config"] = setting
    name = next(iter(setting))
    message = refused(data)
    assert message.startswith(f"kafka.config.{name}: ")
    assert any(why in message for why in ("not a client setting", "security is not set", "managed by Riverhouse"))


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({"linger.ms": "20"}, "kafka.config.linger.ms: should be an integer from 0 to 900000, got '20'"),
        ({"linger.ms": 10**9}, "kafka.config.linger.ms: should be an integer"),
        ({"socket.keepalive.enable": "yes"}, "kafka.config.socket.keepalive.enable: should be true or false"),
        ({"compression.type": "brotli"}, "kafka.config.compression.type: should be one of none, gzip, snappy, lz4"),
        ({"client.id": "a b/c"}, "kafka.config.client.id: should be letters, digits"),
        ({"fetch.max.bytes": 1000}, "kafka.config.fetch.max.bytes: 1000 is less than message.max.bytes (1000000)"),
    ],
)
def test_allowed_settings_have_types(setting: dict[str, Any], expected: str) -> None:
    data = base()
    data["kafka"]["config"] = setting
    assert expected in refused(data)


def test_allowed_settings_reach_their_clients_and_never_replace_the_servers() -> None:
    data = base()
    data["kafka"]["config"] = {"client.id": "team-a", "linger.ms": 5, "max.poll.records": 100, "fetch.min.bytes": 10}
    kafka = parse_spec(data).kafka
    rdkafka = librdkafka_config(kafka, "broker.internal:9092")
    assert rdkafka["bootstrap.servers"] == "broker.internal:9092"
    assert (rdkafka["client.id"], rdkafka["linger.ms"], rdkafka["fetch.min.bytes"]) == ("team-a", 5, 10)
    assert "max.poll.records" not in rdkafka  # the Java client's
    java = connector_options(kafka, "broker.internal:9092", ["orders"])
    assert (java["kafka.client.id"], java["kafka.max.poll.records"], java["kafka.fetch.min.bytes"]) == (
        "team-a",
        "100",
        "10",
    )
    assert "kafka.linger.ms" not in java and java["kafka.bootstrap.servers"] == "broker.internal:9092"


def test_executor_fetches_wait_briefly_unless_the_spec_says_otherwise() -> None:
    """Spark's tasks read ranges Kafka already holds; the Java default (500 ms) made each task wait
    once after its range, 2 s of a small batch (bench/analysis.md). A spec's own value wins."""
    data = base()
    assert connector_options(parse_spec(data).kafka, "b:9092", ["orders"])["kafka.fetch.max.wait.ms"] == "10"
    data["kafka"]["config"] = {"fetch.max.wait.ms": 250}
    assert connector_options(parse_spec(data).kafka, "b:9092", ["orders"])["kafka.fetch.max.wait.ms"] == "250"


def test_a_poll_takes_a_whole_fetch_unless_the_spec_says_otherwise() -> None:
    """Spark's connector seeks and asks the broker for the partition's offsets after every poll,
    dropping what the consumer had buffered: with Java's 500 records a poll, each 1 MB fetch was
    fetched again after every 500 records (bench/analysis.md). A spec's own value wins."""
    data = base()
    options = connector_options(parse_spec(data).kafka, "b:9092", ["orders"])
    assert options["kafka.max.poll.records"] == "10000"
    assert "kafka.max.partition.fetch.bytes" not in options  # the bytes a poll holds stay Java's 1 MB
    data["kafka"]["config"] = {"max.poll.records": 500}
    assert connector_options(parse_spec(data).kafka, "b:9092", ["orders"])["kafka.max.poll.records"] == "500"


# ----------------------------------------------------------------- item 3: secrets are bound to pipelines
def sasl(password: str, username: str = "svc") -> dict[str, str]:
    return {"protocol": "SASL_SSL", "mechanism": "PLAIN", "username": username, "password": password}


def test_a_spec_reads_only_its_own_pipelines_secrets() -> None:
    data = base()  # pipeline orders_dedup
    data["kafka"]["security"] = sasl("${env:RIVERHOUSE_SECRET_BILLING__KAFKA_PASSWORD}")
    message = refused(data)
    assert "RIVERHOUSE_SECRET_BILLING__KAFKA_PASSWORD" in message and "not bound to pipeline 'orders_dedup'" in message
    data["kafka"]["security"] = sasl("${env:RIVERHOUSE_SECRET_KAFKA_PASSWORD}")  # any spec's, on main
    assert "RIVERHOUSE_SECRET_ORDERS_DEDUP__" in refused(data)
    data["kafka"]["security"] = sasl("${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__KAFKA_PASSWORD}")
    assert parse_spec(data).kafka.security is not None


def test_pipeline_names_that_share_a_prefix_do_not_share_secrets() -> None:
    data = base()
    data["name"] = "orders"  # ORDERS__ is not a prefix of ORDERS_DEDUP__..., nor the other way round
    data["kafka"]["security"] = sasl("${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__KAFKA_PASSWORD}")
    assert "not bound to pipeline 'orders'" in refused(data)
    data["name"] = "orders_dedup"
    data["kafka"]["security"] = sasl("${env:RIVERHOUSE_SECRET_ORDERS__DEDUP__KAFKA_PASSWORD}")  # orders__dedup's
    assert "not bound to pipeline 'orders_dedup'" in refused(data)


def test_an_operator_binds_a_shared_secret_in_the_bindings_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindings = tmp_path / "bindings.yaml"
    bindings.write_text("orders_dedup: [RIVERHOUSE_SECRET_TEAM_A_KAFKA_PASSWORD]\n")
    monkeypatch.setenv("RIVERHOUSE_SECRET_BINDINGS", str(bindings))
    data = base()
    data["kafka"]["security"] = sasl("${env:RIVERHOUSE_SECRET_TEAM_A_KAFKA_PASSWORD}")
    assert parse_spec(data).kafka.security is not None
    data["name"] = "other_pipeline"
    assert "not bound to pipeline 'other_pipeline'" in refused(data)
    bindings.write_text("orders_dedup: [RIVERHOUSE_CLICKHOUSE_DSN]\n")  # bound names keep the prefix
    data["name"] = "orders_dedup"
    data["kafka"]["security"] = sasl("${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__P}", username="${env:RIVERHOUSE_SECRET_X}")
    assert "bound names start with RIVERHOUSE_SECRET_" in refused(data)


def test_no_reference_in_a_url_or_host_setting() -> None:
    data = base()
    data["kafka"]["bootstrap_servers"] = "${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__X}.attacker.example.com:9092"
    assert "bootstrap_servers cannot take ${env:...}" in refused(data)
    data = base()
    data["kafka"]["config"] = {"sasl.oauthbearer.token.endpoint.url": "${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__T}"}
    assert "${env:...} is never allowed in a setting that names a host or a URL" in refused(data)


def test_a_literal_secret_in_kafka_config_is_refused_without_repeating_it() -> None:
    data = base()
    data["kafka"]["security"] = {"protocol": "SSL", "certificate": "/c.pem", "key": "/k.pem"}
    data["kafka"]["config"] = {"ssl.key.password": "hunter2"}
    message = refused(data)
    assert "kafka.config.ssl.key.password: a secret: give an environment reference" in message
    assert "hunter2" not in message
    data["kafka"]["config"] = {"sasl.password": "hunter2", "sasl.oauthbearer.client.secret": "hunter3"}
    message = refused(data)
    assert "kafka.config.sasl.password: security is not set in kafka.config" in message
    assert "kafka.config.sasl.oauthbearer.client.secret: security is not set" in message and "hunter" not in message


# ----------------------------------------------------------------- item 4: one file's failure is that file's error


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_validate_reports_hostile_files_as_their_errors(tmp_path: Path, name: str) -> None:
    good = tmp_path / "good.yaml"
    good.write_bytes((REPO / "pipelines" / "orders_dedup.yaml").read_bytes())
    bad = tmp_path / name
    bad.write_bytes(HOSTILE_FILES[name])
    done = validate(bad, good)
    assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout, done.stderr[-2000:]
    assert f"{bad}: 1 problem(s)" in done.stderr and f"ok {good}" in done.stdout


def test_each_hostile_file_names_what_and_where(tmp_path: Path) -> None:
    expected = {
        "huge_window.yaml": ("sources.orders.dedup.window", "longer than the maximum of 7 days"),
        "deep_query.yaml": ("query", "parentheses nested more than 24 deep (line 1)"),
        "deep_yaml.yaml": ("line 2, column", "nested more than 32 levels deep"),
        "not_utf8.yaml": ("", "not UTF-8 text: byte 0xe9 at line 2, column 17"),
        "control_char.yaml": ("line 2, column 15", "character U+0080 is not allowed in YAML"),
        "bad_date.yaml": ("", "a value YAML cannot read: day is out of range for month"),
    }
    for name, (where, what) in expected.items():
        (tmp_path / name).write_bytes(HOSTILE_FILES[name])
        with pytest.raises(SpecError) as info:
            load_spec(tmp_path / name)
        [(found_where, message, _)] = info.value.problems
        assert found_where.startswith(where) and what in message, (name, found_where, message)


def test_a_yaml_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (tmp_path / "bomb.yaml").write_text("\n".join(["name: bomb", *lines]) + "\n")
    with pytest.raises(SpecError, match="more than 100,000 values once YAML aliases are expanded"):
        load_spec(tmp_path / "bomb.yaml")


# ----------------------------------------------------------------- item 5: one table, resolved
def two_specs(tmp_path: Path, first: str | None, second: str | None) -> tuple[list[str], list[SpecError]]:
    for name, database in (("pipe_a", first), ("pipe_b", second)):
        data = base()
        data["name"] = name
        data["sources"]["orders"]["topic"] = f"orders_{name}"
        data["sink"].pop("database", None)
        if database is not None:
            data["sink"]["database"] = database
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    specs, errors = load_spec_folder(tmp_path, dsn_database(os.environ.get("DSN_UNDER_TEST", "")))
    return [s.name for s in specs], errors


def test_no_database_and_the_default_database_are_one_table(tmp_path: Path) -> None:
    names, errors = two_specs(tmp_path, None, "default")
    assert names == ["pipe_a"] and "default.orders is already loaded by" in str(errors[0])
    done = validate(tmp_path / "pipe_a.yaml", tmp_path / "pipe_b.yaml")
    assert done.returncode == 1 and "default.orders is already loaded by" in done.stderr


def test_no_database_is_the_dsns_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSN_UNDER_TEST", "https://u:p@ch.example.com:8443/analytics")
    names, errors = two_specs(tmp_path, None, "analytics")
    assert names == ["pipe_a"] and "analytics.orders is already loaded by" in str(errors[0])
    names, errors = two_specs(tmp_path, None, "default")  # another database now: two tables
    assert names == ["pipe_a", "pipe_b"] and errors == []
    done = validate(
        tmp_path / "pipe_a.yaml", tmp_path / "pipe_b.yaml", RIVERHOUSE_CLICKHOUSE_DSN="https://h:8443/default"
    )
    assert done.returncode == 1 and "default.orders is already loaded by" in done.stderr


def test_dsn_database_reads_like_clickhouse_connect() -> None:
    assert dsn_database("https://u:p@h:8443/analytics") == "analytics"
    assert dsn_database("https://h:8443/?database=sales") == "sales"
    assert dsn_database("https://h:8443") == "default"
    assert dsn_database("chdb:///var/lib/riverhouse/clickhouse") == "default"  # the path is a folder


# ----------------------------------------------------------------- item 7: DSN redaction by parsing
@pytest.mark.parametrize(
    ("dsn", "secret"),
    [
        ("https://alice:pa/ss@ch.example.com:8443/analytics", "pa/ss"),
        ("https://alice:p#ss@ch.example.com:8443/analytics", "p#ss"),
        ("https://alice:p?ss@ch.example.com:8443/analytics", "p?ss"),
        ("https://alice:p@ss@ch.example.com:8443/analytics", "p@ss"),
        ("https://ch.example.com:8443/db?user=alice&PassWord=hunter2", "hunter2"),
        ("https://ch.example.com:8443/db?user=alice&pass%77ord=hunter2", "hunter2"),
        ("https://ch.example.com:8443/db?user=alice;access_token=hunter2", "hunter2"),
        ("https://ch.example.com:8443/db?database=x&apikey=hunter2", "hunter2"),
        ("https://ch.example.com:8443/db#password=hunter2", "hunter2"),
        ("https://ch.example.com:8443/db?hunter2", "hunter2"),
    ],
)
def test_redaction_hides_every_spelling_of_a_secret(dsn: str, secret: str) -> None:
    shown = redact_dsn(dsn)
    assert secret not in shown and "***" in shown
    assert "ch.example.com:8443" in shown  # still says where


def test_redaction_keeps_what_is_harmless() -> None:
    dsn = "https://alice@ch.example.com:8443/analytics?database=analytics&compress=1;secure=true"
    assert redact_dsn(dsn) == dsn
    assert redact_dsn("chdb:///var/lib/riverhouse/clickhouse") == "chdb:///var/lib/riverhouse/clickhouse"


@pytest.mark.parametrize(
    "dsn",
    [
        "https://alice:s3cret/x@ch.example.com:8443/db",  # main printed this one whole
        "https://alice:s3cret@ch.example.com:eighty/db",
        "ftp://alice:s3cret@ch.example.com/db",
    ],
)
def test_a_malformed_dsn_error_never_prints_the_password(dsn: str) -> None:
    with pytest.raises(ClickHouseLoadError) as info:
        check_dsn(dsn)
    assert "s3cret" not in str(info.value) and "ch.example.com" in str(info.value)


def test_driver_errors_are_scrubbed_of_every_dsn_secret() -> None:
    dsn = "https://alice:pa%2Fss@ch.example.com:8443/db?access_token=tok123"
    error = ConnectionError("auth failed for alice:pa/ss (pa%2Fss) with token tok123")
    assert _scrubbed(error, dsn) == "auth failed for alice:*** (***) with token ***"


# ----------------------------------------------------------------- item 8: duplicate YAML keys
def test_duplicate_keys_are_refused_with_both_lines(tmp_path: Path) -> None:
    text = (REPO / "pipelines" / "orders_dedup.yaml").read_text()
    (tmp_path / "twice.yaml").write_text(text + "name: hijacked\n")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "twice.yaml")
    [(where, message, hint)] = info.value.problems
    first = 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith("name:"))
    last = len(text.splitlines()) + 1
    assert where == f"line {last}, column 1"
    assert message.startswith(f"key 'name' is given twice in one mapping (lines {first} and {last})")
    assert hint == "remove one of them"


def test_duplicate_keys_in_a_nested_mapping_are_refused(tmp_path: Path) -> None:
    (tmp_path / "nested.yaml").write_text("name: x\nsink:\n  table: a\n  order_by: [id]\n  table: b\n")
    with pytest.raises(SpecError, match=r"key 'table' is given twice in one mapping \(lines 3 and 5\)"):
        load_spec(tmp_path / "nested.yaml")


def test_a_merge_key_override_is_not_a_duplicate(tmp_path: Path) -> None:
    data = base()
    text = yaml.safe_dump({k: v for k, v in data.items() if k != "sink"})
    text += "sink:\n  <<: {table: other, order_by: [order_id]}\n  table: orders_clean\n"
    (tmp_path / "merge.yaml").write_text(text)
    assert load_spec(tmp_path / "merge.yaml").sink.table == "orders_clean"


@pytest.mark.parametrize("end", ["low", "high"])
def test_librdkafka_takes_every_allowed_setting_at_either_end_of_its_range(end: str) -> None:
    """The ranges are librdkafka's own: a value the spec accepts never fails in the sensor instead."""
    from confluent_kafka import Consumer, Producer

    from riverhouse.platform.kafka.client_settings import ALLOWED, LIBRDKAFKA

    config: dict[str, Any] = {}
    for name, setting in ALLOWED.items():
        if LIBRDKAFKA in setting.clients and setting.kind != "secret":
            if setting.kind == "int":
                config[name] = setting.low if end == "low" else setting.high
            elif setting.kind == "enum":
                config[name] = setting.choices[0] if end == "low" else setting.choices[-1]
            else:
                config[name] = {"bool": end == "high", "str": "x-1"}[setting.kind]
    config["fetch.max.bytes"] = max(config["fetch.max.bytes"], config["message.max.bytes"])  # checked together
    data = base()
    data["kafka"]["config"] = config
    parse_spec(data)  # the spec takes them
    common = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0, **config}
    Producer(common).flush(0)
    Consumer({**common, "group.id": "allow-list-test"}).close()


def test_the_settings_table_in_the_docs_lists_the_allow_list() -> None:
    from riverhouse.platform.kafka.client_settings import ALLOWED

    docs = (REPO / "docs" / "pipeline-spec.md").read_text()
    table = docs.split("\n## Kafka client settings", 1)[1].split("\n## ", 1)[0]
    assert sorted(re.findall(r"^\| `([a-z.]+)` \|", table, re.M)) == sorted(ALLOWED)
