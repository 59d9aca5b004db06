"""`riverhouse import glassflow|kaflowsql` on configs in the two projects' documented formats."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from riverhouse.cli import app
from riverhouse.platform.importers.expr import FieldRef, Untranslatable, translate_expr
from riverhouse.platform.importers.glassflow import import_glassflow
from riverhouse.platform.importers.kaflowsql import import_kaflowsql
from riverhouse.platform.importers.report import ImporterError, ImportResult, parse_go_duration, spec_window
from riverhouse.platform.kafka.client import connector_options, librdkafka_config
from riverhouse.platform.spec import load_spec

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parents[1] / "fixtures" / "migrate"


def written(result: ImportResult, tmp_path: Path) -> Any:
    """The spec file as a user gets it, loaded the way `riverhouse validate` loads it."""
    path = tmp_path / "spec.yaml"
    path.write_text(result.to_yaml())
    return load_spec(path)


def settings_of(result: ImportResult) -> set[str]:
    return {u.setting for u in result.unmapped}


def config_file(tmp_path: Path, config: dict[str, Any], name: str = "pipeline.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


# ---------------------------------------------------------------------------- GlassFlow v3
def test_v3_dedup_config_maps_every_setting(tmp_path: Path) -> None:
    result = import_glassflow(FIXTURES / "glassflow_v3_dedup.json")
    assert result.unmapped == []
    spec = written(result, tmp_path)
    assert spec.name == "users_dedup"
    users = spec.sources["users"]
    assert users.topic == "users"
    assert {f.name: f.type for f in users.fields} == {
        "event_id": "string",
        "user_id": "string",
        "created_at": "timestamp",  # a string field loaded into a DateTime column
        "name": "string",
        "email": "string",
    }
    assert users.key == ["event_id"] and users.dedup is not None
    assert users.dedup.key == ["event_id"] and users.dedup.window == timedelta(hours=1)
    assert users.event_time.field is None  # windows on arrival (Kafka timestamp), as GlassFlow's
    assert spec.kafka.bootstrap_servers == "kafka:9092" and spec.kafka.starting_offsets == "earliest"
    assert spec.kafka.config == {}
    assert (spec.sink.table, spec.sink.order_by, spec.sink.batch_size) == ("users_dedup", ["event_id"], 1000)
    assert spec.sink.database is None  # "default": the DSN's database
    assert spec.orchestration.trigger_interval == timedelta(seconds=1)  # max_delay_time
    assert "mysecret" not in result.to_yaml()
    assert any(
        "RIVERHOUSE_CLICKHOUSE_DSN=http://<username>:<password>@my.clickhouse.server:8123" in n for n in result.notes
    )


def test_v3_join_with_filter_becomes_a_left_join_query(tmp_path: Path) -> None:
    result = import_glassflow(FIXTURES / "glassflow_v3_join.json")
    assert result.unmapped == []
    spec = written(result, tmp_path)
    assert spec.join is None and spec.query is not None
    assert " ".join(spec.query.split()) == (
        "SELECT orders.order_id AS order_id, orders.amount AS amount, orders.timestamp AS created_at, "
        "users.user_id AS user_id, users.email AS email FROM orders "
        "LEFT JOIN users ON orders.customer_id = users.user_id WHERE (orders.amount > 0)"
    )
    assert spec.state.ttl == timedelta(hours=1) and spec.state.sources == {}
    assert spec.sources["orders"].key == ["order_id"] and spec.sources["users"].key == ["user_id"]
    assert {f.name: f.type for f in spec.sources["orders"].fields} == {
        "order_id": "string",
        "customer_id": "string",
        "amount": "double",  # float + Float64 column
        "timestamp": "timestamp",  # datetime
    }
    assert spec.sink.order_by == ["order_id"]
    assert spec.plan.output_names == ["order_id", "amount", "created_at", "user_id", "email"]
    assert any("LEFT join" in n for n in result.notes)


def test_v3_unsupported_settings_are_named_with_reasons(tmp_path: Path) -> None:
    config = json.loads((FIXTURES / "glassflow_v3_dedup.json").read_text())
    config["sources"].append({"type": "otlp.logs", "source_id": "logs"})
    config["sources"][0]["schema_fields"].append({"name": "payload.device", "type": "string"})
    config["sources"][0]["schema_fields"].append({"name": "labels", "type": "map"})
    config["sink"]["mapping"] += [
        {"name": "payload.device", "column_name": "device", "column_type": "String"},
        {"name": "labels", "column_name": "labels", "column_type": "Map(String, String)"},
    ]
    config["transforms"] += [
        {"type": "filter", "source_id": "users", "config": {"expression": "name != ''"}},
        {"type": "dedup", "source_id": "logs", "config": {"key": "id", "time_window": "1h"}},
    ]
    config["metadata"] = {"tags": ["prod"]}
    config["resources"] = {"sink": {"replicas": 2}}
    result = import_glassflow(config_file(tmp_path, config))
    assert settings_of(result) == {
        "sources[1]",  # OTLP
        "transforms[2]",  # targets the OTLP source
        "metadata.tags",
        "resources",
    }
    reasons = {u.setting: u.reason for u in result.unmapped}
    assert "Kafka topics only" in reasons["sources[1]"]
    spec = written(result, tmp_path)  # still a valid spec: a SELECT over the one source, for the filter
    # A missing name is an ordinary value in GlassFlow's filter (nil != '' is true): null-safe.
    assert spec.query is not None and spec.query.rstrip().endswith("WHERE (NOT (users.name <=> ''))")
    assert spec.plan.output_names == ["event_id", "user_id", "created_at", "name", "email", "device", "labels"]
    fields = {f.name: f for f in spec.sources["users"].fields}
    # Nested names are paths; a map into Map(String, String) is a map of strings (GlassFlow stringifies values).
    assert (fields["device"].type, fields["device"].path) == ("string", ("payload", "device"))
    assert (fields["labels"].type, fields["labels"].allow_json_text) == ("map<string,string>", True)


def test_v3_stateless_transform_in_a_join_becomes_a_projection(tmp_path: Path) -> None:
    config = json.loads((FIXTURES / "glassflow_v3_join.json").read_text())
    config["transforms"].append(
        {
            "type": "stateless",
            "source_id": "orders",
            "config": {
                "transforms": [
                    {"expression": "amount * 100", "output_name": "amount_cents", "output_type": "int"},
                    {"expression": "upper(customer_id)", "output_name": "customer", "output_type": "string"},
                ]
            },
        }
    )
    config["join"]["output_fields"] += [
        {"source_id": "orders", "name": "amount_cents"},
        {"source_id": "orders", "name": "customer"},
    ]
    config["sink"]["mapping"] += [
        {"name": "amount_cents", "column_name": "amount_cents", "column_type": "Int64"},
        {"name": "customer", "column_name": "customer", "column_type": "String"},
    ]
    config["transforms"][-1]["config"]["transforms"].append(
        {"expression": "parseUserAgent(customer_id, 'os')", "output_name": "os", "output_type": "string"}
    )
    config["join"]["output_fields"].append({"source_id": "orders", "name": "os"})
    config["sink"]["mapping"].append({"name": "os", "column_name": "os", "column_type": "String"})
    result = import_glassflow(config_file(tmp_path, config))
    assert settings_of(result) == {"transforms[3].config.transforms[2]"}  # a GlassFlow helper: not guessed
    assert "GlassFlow helper function" in result.unmapped[0].reason
    spec = written(result, tmp_path)
    assert "CAST((orders.amount * 100) AS BIGINT) AS amount_cents" in spec.query
    # GlassFlow's upper() reads nil as "": so does the translation.
    assert "CAST(upper(coalesce(CAST(orders.customer_id AS STRING), '')) AS STRING) AS customer" in spec.query
    assert "os" not in spec.plan.output_names


# ---------------------------------------------------------------------------- GlassFlow v2
def test_v2_join_config_maps_like_its_v3_form_and_never_copies_credentials(tmp_path: Path) -> None:
    out = tmp_path / "orders.yaml"
    v2 = import_glassflow(FIXTURES / "glassflow_v2_join.json", out)
    v3 = import_glassflow(FIXTURES / "glassflow_v3_join.json")
    assert v2.spec["sources"] == v3.spec["sources"]
    assert settings_of(v2) == {
        "source.provider",
        "source.topics[0].replicas",
        "pipeline_resources",
        "join.sources[1].time_window",  # 30m on the right, 1h on the left: one window in Riverhouse
    }
    assert any(n.startswith("schema.fields[6]: 'tags' (array) is not used") for n in v2.notes)
    spec = written(v2, tmp_path)
    assert spec.join is not None and spec.join.type == "left"
    assert (spec.join.left, spec.join.right, spec.join.window) == ("orders", "users", timedelta(hours=1))
    assert (spec.join.on.left, spec.join.on.right) == (["customer_id"], ["user_id"])
    assert spec.join.select == {
        "order_id": "orders.order_id",
        "amount": "orders.amount",
        "created_at": "orders.timestamp",
        "user_id": "users.user_id",
        "email": "users.email",
    }
    assert spec.kafka.bootstrap_servers == "broker-0.example.com:9092,broker-1.example.com:9092"
    assert spec.kafka.config == {}  # security is stated for both Kafka clients, in kafka.security
    assert spec.kafka.security is not None
    ca = str(tmp_path / "orders.kafka-ca.pem")  # beside the spec, absolute
    assert spec.kafka.security.model_dump(exclude_none=True) == {
        "protocol": "SASL_SSL",
        "mechanism": "SCRAM-SHA-256",
        # The pipeline's own variables (RIVERHOUSE_SECRET_<PIPELINE>__<NAME>): another pipeline cannot read them.
        "username": "${env:RIVERHOUSE_SECRET_JOINED_ORDERS_PIPELINE__KAFKA_USERNAME}",
        "password": "${env:RIVERHOUSE_SECRET_JOINED_ORDERS_PIPELINE__KAFKA_PASSWORD}",
        "ca": ca,
    }
    assert v2.files == {ca: "-----BEGIN-----\n"}  # the CA is public: v2's base64 decoded into its file
    text = v2.to_yaml()
    for secret in ("do-not-copy-me", "pipeline-user", "c2VjcmV0", "loader"):
        assert secret not in text
    assert (spec.sink.database, spec.sink.batch_size) == ("analytics", 5000)
    assert spec.orchestration.trigger_interval == timedelta(seconds=30)
    assert any("https://<username>:<password>@clickhouse.example.com:8443/analytics" in n for n in v2.notes)


def test_v2_older_layout_with_table_mapping(tmp_path: Path) -> None:
    result = import_glassflow(FIXTURES / "glassflow_v2_table_mapping.json")
    assert settings_of(result) == set()
    spec = written(result, tmp_path)
    # The filter needs a SELECT over the one source; v2 filters named rows to DROP. Renamed columns are
    # fields named after their column, read at the GlassFlow name (login_at <- timestamp, os <- device.os).
    assert " ".join((spec.query or "").split()) == (
        "SELECT user_logins.session_id AS session_id, user_logins.user_id AS user_id, "
        "user_logins.login_count AS login_count, user_logins.os AS os, user_logins.login_at AS login_at "
        "FROM user_logins WHERE NOT (user_logins.login_count <=> 0)"
    )
    assert spec.sink.order_by == ["session_id"]
    source = spec.sources["user_logins"]  # "user-logins" is not an identifier; the topic keeps its name
    assert source.topic == "user-logins"
    assert {f.name: (f.type, f.path_text) for f in source.fields} == {
        "session_id": ("string", "session_id"),
        "user_id": ("string", "user_id"),
        "login_count": ("int", "login_count"),  # GlassFlow int into an Int32 column
        "os": ("string", "device.os"),
        "login_at": ("timestamp", "timestamp"),
    }
    assert source.dedup is not None and source.dedup.window == timedelta(hours=12)
    assert spec.kafka.bootstrap_servers == "kafka.internal:9093"  # "http://" dropped
    assert spec.kafka.starting_offsets == "latest"


def test_v2_filter_was_a_drop_condition(tmp_path: Path) -> None:
    config = json.loads((FIXTURES / "glassflow_v2_join.json").read_text())
    config["filter"] = {"enabled": True, "expression": "amount <= 0 or customer_id == 'test'"}
    spec = written(import_glassflow(config_file(tmp_path, config)), tmp_path)
    assert spec.query is not None
    assert "WHERE NOT ((orders.amount <= 0) OR (orders.customer_id <=> 'test'))" in " ".join(spec.query.split())


@pytest.mark.parametrize("gf_type", ["int64", "int32", "uint", "float64"])
def test_unix_seconds_into_a_datetime_column(tmp_path: Path, gf_type: str) -> None:
    """GlassFlow reads an integer going into a DateTime column as Unix seconds, a float as fractional ones."""
    config = json.loads((FIXTURES / "glassflow_v3_dedup.json").read_text())
    config["sources"][0]["schema_fields"][2]["type"] = gf_type  # created_at, into a DateTime column
    config["transforms"].append({"type": "filter", "source_id": "users", "config": {"expression": "created_at > 5"}})
    result = import_glassflow(config_file(tmp_path, config))
    spec = written(result, tmp_path)
    created = next(f for f in spec.sources["users"].fields if f.name == "created_at")
    query = " ".join((spec.query or "").split())
    if gf_type == "float64":  # a timestamp takes whole numbers only: the number is loaded as it is
        assert (created.type, created.epoch_unit) == ("double", None)
        assert any("fractional Unix seconds" in n for n in result.notes)
        assert "WHERE (users.created_at > 5)" in query
        return
    assert (created.type, created.epoch_unit) == ("timestamp", "seconds")
    assert any("'created_at' holds Unix seconds: a timestamp with epoch_unit: seconds" in n for n in result.notes)
    assert "WHERE (unix_seconds(users.created_at) > 5)" in query  # the filter still compares the number


def test_unknown_settings_are_named_not_refused(tmp_path: Path) -> None:
    """GlassFlow's decoder ignores keys it does not know: so does the import, naming each (fails --strict)."""
    config = json.loads((FIXTURES / "glassflow_v3_dedup.json").read_text())
    config["sources"][0]["topik"] = "users"
    config["sink"]["mapping"][0]["colum_type"] = "String"
    result = import_glassflow(config_file(tmp_path, config))
    assert settings_of(result) == {"sources[0].topik", "sink.mapping[0].colum_type"}
    assert all("ignores unknown keys" in u.reason for u in result.unmapped)
    written(result, tmp_path)
    del config["sources"][0]["topic"]  # a missing required setting is still an error
    with pytest.raises(ImporterError, match="topic"):
        import_glassflow(config_file(tmp_path, config))
    with pytest.raises(ImporterError, match="unsupported GlassFlow config version 'v1'"):
        import_glassflow(config_file(tmp_path, {"version": "v1", "pipeline_id": "x"}))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ImporterError, match="not valid JSON"):
        import_glassflow(tmp_path / "broken.json")


def test_yaml_configs_and_windows_beyond_seven_days(tmp_path: Path) -> None:
    config = json.loads((FIXTURES / "glassflow_v3_dedup.json").read_text())
    config["transforms"][0]["config"]["time_window"] = "169h"
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    result = import_glassflow(path)
    assert settings_of(result) == {"transforms[0].time_window"}
    assert written(result, tmp_path).sources["users"].dedup is None


# ---------------------------------------------------------------------------- shared rules
def test_go_durations() -> None:
    assert parse_go_duration("1h30m", "w") == timedelta(minutes=90)
    assert parse_go_duration("168h", "w") == timedelta(days=7)
    assert parse_go_duration("250ms", "w") == timedelta(milliseconds=250)
    for bad in ("1d", "h", "", "10", "1h 30m"):
        with pytest.raises(ValueError):
            parse_go_duration(bad, "w")
    result = ImportResult({}, "x", "x")
    assert spec_window("1500ms", "w", result) == "2s" and result.notes  # rounded, and said so


def test_expr_translation_keeps_expr_lang_meaning() -> None:
    fields = {
        "age": FieldRef("age", "long"),
        "status": FieldRef("status", "string"),
        "amount": FieldRef("amount", "double"),
        "user.name": FieldRef("user_name", "string"),
        "tags": FieldRef("tags", "array<string>"),
        "attrs": FieldRef("attrs", "map<string,string>"),
    }

    def sql(expression: str) -> str:
        return translate_expr(expression, "s", fields).text

    # == and != are null-safe (nil is an ordinary value), and every operation is parenthesised.
    assert sql("age > 18 and status == 'active'") == "((s.age > 18) AND (s.status <=> 'active'))"
    assert sql("!(amount != 0) || age >= 65") == "((NOT (NOT (s.amount <=> 0))) OR (s.age >= 65))"
    assert sql("status == nil or status != nil") == "((s.status IS NULL) OR (s.status IS NOT NULL))"
    # expr-lang's precedence: `not` binds tighter than ==, ** is right-associative and tighter than unary -.
    assert sql("-2 ** 3 ** 2") == "(-power(2, power(3, 2)))"
    assert sql("(amount + 1) * 2 % 3") == "(((s.amount + 1) * 2) % 3)"
    assert sql("status + '-' + user.name") == "concat(concat(s.status, '-'), s.user_name)"
    assert sql("status in ['a', 'b']") == "coalesce(s.status IN ('a', 'b'), FALSE)"
    assert sql("status not in ['a']") == "(NOT coalesce(s.status IN ('a'), FALSE))"
    assert sql("'x' in tags") == "coalesce(array_contains(s.tags, 'x'), FALSE)"
    assert sql("attrs['plan'] ?? 'free'") == "coalesce(try_element_at(s.attrs, 'plan'), 'free')"
    assert sql("attrs.plan == 'pro'") == "(try_element_at(s.attrs, 'plan') <=> 'pro')"
    assert sql("status startsWith 'ok'") == "startswith(s.status, 'ok')"
    assert sql("len(status) > 2") == "(octet_length(s.status) > 2)"
    assert (
        sql("toFloat(status) > 1.5")
        == "(coalesce(try_cast(coalesce(CAST(s.status AS STRING), '') AS DOUBLE), 0.0) > 1.5)"
    )
    refused = {
        "status == 1": "compares a string with a number",
        "status + 1": "adds a string and a number",
        "age > 'x'": "compares a number with a string",
        "not age == 3": "compares a boolean with a number",  # expr-lang reads (not age) == 3
        "unknown > 1": "not a field",
        "parseUserAgent(status, 'os') == 'ios'": "GlassFlow helper function",
        "trim(status) == ''": "GlassFlow helper function",
        "{'a': 1}": "map literal",
        "status == 'it\\'s'": "quotes and escapes",
    }
    for expression, reason in refused.items():
        with pytest.raises(Untranslatable, match=reason):
            translate_expr(expression, "s", fields)


# ---------------------------------------------------------------------------- KaflowSQL
def test_kaflowsql_pipeline_maps_query_state_dimensions_and_emission(tmp_path: Path) -> None:
    result = import_kaflowsql(FIXTURES / "kaflowsql_transactions.yaml")
    assert settings_of(result) == {"output.format"}  # avro, and no registry known without config.yaml: JSON
    spec = written(result, tmp_path)
    assert spec.name == "transaction_enrichment"
    assert set(spec.sources) == {"transactions", "users", "merchants"}
    assert {f.name: f.type for f in spec.sources["transactions"].fields} == {
        "transaction_id": "string",
        "user_id": "string",
        "amount": "double",  # from output.schema (Avro double)
        "merchant_id": "string",
    }
    assert {f.name: f.type for f in spec.sources["users"].fields} == {
        "email": "string",
        "risk_score": "int",  # ["null", "int"]
        "user_id": "string",
    }
    assert spec.sources["transactions"].key == ["transaction_id"]  # output.key
    assert spec.sources["users"].key == ["user_id"] and spec.sources["merchants"].key == ["merchant_id"]
    assert spec.state.ttl == timedelta(hours=1) and spec.state.sources == {"users": timedelta(hours=2)}
    assert spec.dimensions == ["merchants"] and spec.require == ["email", "merchant_name"]
    # output -> a Kafka sink of the same topic and key; no ClickHouse table
    assert spec.clickhouse_sink is None and len(spec.topic_sinks) == 1
    topic_sink = spec.topic_sinks[0]
    assert (topic_sink.topic, topic_sink.key, topic_sink.format) == (
        "enriched_transactions",
        ["transaction_id"],
        "json",
    )
    plan = spec.plan
    assert plan.output_names[-1] == "amount_band" and plan.where is not None
    assert [(s.source, s.kind, s.window) for s in plan.steps] == [
        ("users", "left", timedelta(hours=2)),
        ("merchants", "left", None),  # a dimension: latest row per key, no window
    ]


def test_kaflowsql_unmappable_settings_and_dotted_topics(tmp_path: Path) -> None:
    result = import_kaflowsql(FIXTURES / "kaflowsql_immediate.yaml")
    assert settings_of(result) == {"emission.type", "state.events.overrides.unknown_topic"}
    spec = written(result, tmp_path)
    assert spec.name == "device_telemetry"
    assert spec.sources["device_readings"].topic == "device.readings"
    assert "FROM device_readings AS d" in spec.query
    assert spec.state.ttl == timedelta(minutes=5) and spec.dimensions == ["device_config"]
    # output.format json and output.key map as they are; the topic's name keeps its dash
    assert [(s.topic, s.key, s.format) for s in spec.topic_sinks] == [("telemetry-enriched", ["device_id"], "json")]


def test_kaflowsql_window_and_default_ttl(tmp_path: Path) -> None:
    base = (FIXTURES / "kaflowsql_transactions.yaml").read_text()
    only_window = base.replace("    default_ttl: 1h\n", "").replace("window: 1h", "window: 30m")
    result = import_kaflowsql(config_file_text(tmp_path, only_window))
    assert written(result, tmp_path).state.ttl == timedelta(minutes=30)
    both = base.replace("window: 1h", "window: 3h")
    result = import_kaflowsql(config_file_text(tmp_path, both))
    assert settings_of(result) == {"window", "output.format"}  # KaflowSQL's engine reads default_ttl, not window
    assert written(result, tmp_path).state.ttl == timedelta(hours=1)


def test_kaflowsql_queries_riverhouse_cannot_run_are_refused_clearly(tmp_path: Path) -> None:
    base = (FIXTURES / "kaflowsql_transactions.yaml").read_text()
    grouped = base.replace("  WHERE t.amount > 0\n", "  WHERE t.amount > 0\n  GROUP BY t.user_id\n")
    with pytest.raises(ImporterError, match="GROUP BY"):
        import_kaflowsql(config_file_text(tmp_path, grouped))
    with pytest.raises(ImporterError, match="outptu"):
        import_kaflowsql(config_file_text(tmp_path, base.replace("output:", "outptu:")))


def test_kaflowsql_engine_config_gives_the_brokers_and_avro_sources_through_its_registry() -> None:
    from riverhouse.platform.importers.kaflowsql import import_kaflowsql

    result = import_kaflowsql(FIXTURES / "kaflowsql_transactions.yaml", FIXTURES / "kaflowsql_config.yaml")
    spec = result.validate()
    assert spec.kafka.bootstrap_servers == "broker1:9092,broker2:9092"
    assert {s.format for s in spec.sources.values()} == {"avro"}
    assert {s.schema_registry.url for s in spec.sources.values() if s.schema_registry} == {"http://registry:8081"}
    transactions = next(s for s in spec.sources.values() if s.topic == "transactions")
    reader = json.loads(str(transactions.avro_schema))
    assert {f["name"] for f in reader["fields"]} == {f.name for f in transactions.fields}
    assert "config.yaml kafka.consumer" in settings_of(result)
    # output.format avro: the sink registers the values' schema in the same registry.
    assert "output.format" not in settings_of(result)
    sink = spec.topic_sinks[0]
    assert sink.format == "avro" and sink.schema_registry is not None
    assert sink.schema_registry.url == "http://registry:8081"
    without = import_kaflowsql(FIXTURES / "kaflowsql_transactions.yaml")
    assert {s.format for s in without.validate().sources.values()} == {"json"}
    assert without.validate().topic_sinks[0].format == "json"


def test_kaflowsql_writes_avro_as_its_engine_does_when_use_avro_is_set(tmp_path: Path) -> None:
    """KaflowSQL's producer writes Avro iff config.yaml sets kafka.useAvro; output.format does not decide."""
    from riverhouse.platform.importers.kaflowsql import import_kaflowsql

    config = yaml.safe_load((FIXTURES / "kaflowsql_config.yaml").read_text())
    config["kafka"]["useAvro"] = False
    engine = tmp_path / "config.yaml"
    engine.write_text(yaml.safe_dump(config))
    spec = import_kaflowsql(FIXTURES / "kaflowsql_transactions.yaml", engine).validate()  # output.format: avro
    assert spec.topic_sinks[0].format == "json" and spec.topic_sinks[0].schema_registry is None
    json_output = tmp_path / "pipeline.yaml"
    json_output.write_text(
        (FIXTURES / "kaflowsql_transactions.yaml").read_text().replace("format: avro", "format: json")
    )
    spec = import_kaflowsql(json_output, FIXTURES / "kaflowsql_config.yaml").validate()  # useAvro: true
    assert spec.topic_sinks[0].format == "avro"


def config_file_text(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------- CLI
def test_cli_writes_validates_and_is_strict(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "users.yaml"
    ok = runner.invoke(app, ["import", "glassflow", str(FIXTURES / "glassflow_v3_dedup.json"), "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0
    again = runner.invoke(app, ["import", "glassflow", str(FIXTURES / "glassflow_v3_dedup.json"), "-o", str(out)])
    assert again.exit_code == 1 and "--force" in again.output

    strict_out = tmp_path / "strict.yaml"
    strict = runner.invoke(
        app, ["import", "glassflow", str(FIXTURES / "glassflow_v2_join.json"), "-o", str(strict_out), "--strict"]
    )
    assert strict.exit_code == 1 and not strict_out.exists()
    assert "join.sources[1].time_window" in strict.output  # named, with rich markup escaped
    json_output = tmp_path / "kaflowsql_json.yaml"
    json_output.write_text(
        (FIXTURES / "kaflowsql_transactions.yaml").read_text().replace("format: avro", "format: json")
    )
    lenient = runner.invoke(app, ["import", "kaflowsql", str(json_output), "--strict"])
    assert lenient.exit_code == 0 and lenient.output.count("query: |") == 1  # spec on stdout
    avro = runner.invoke(app, ["import", "kaflowsql", str(FIXTURES / "kaflowsql_transactions.yaml"), "--strict"])
    assert avro.exit_code == 1 and "output.format" in avro.output
    bad = runner.invoke(app, ["import", "glassflow", str(tmp_path / "missing.json")])
    assert bad.exit_code == 1 and "cannot read file" in bad.output and "Traceback" not in bad.output


# ---------------------------------------------------------------------------- Kafka security
SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")  # what a run refuses in kafka.config without kafka.security
MTLS = FIXTURES / "glassflow_v2_mtls.json"


def fixture_params(fixture: Path) -> dict[str, Any]:
    return dict(json.loads(fixture.read_text())["source"]["connection_params"])


def every_file_text(folder: Path) -> str:
    return "".join(p.read_text() for p in sorted(folder.rglob("*")) if p.is_file())


def test_mtls_import_writes_certificate_files_beside_the_spec_and_never_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = fixture_params(MTLS)
    ca_text, cert_text, key_text = (
        base64.b64decode(params[k]).decode() for k in ("root_ca", "client_cert", "client_key")
    )
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    ran = runner.invoke(app, ["import", "glassflow", str(MTLS), "-o", "pipelines/clicks.yaml"])
    assert ran.exit_code == 1 and "cannot write" in ran.output and "Traceback" not in ran.output  # no such folder
    (tmp_path / "pipelines").mkdir()
    ran = runner.invoke(app, ["import", "glassflow", str(MTLS), "-o", "pipelines/clicks.yaml", "--strict"])
    assert ran.exit_code == 0, ran.output  # everything carried over: the key is placed by hand, not lost
    folder = tmp_path / "pipelines"
    assert runner.invoke(app, ["validate", str(folder / "clicks.yaml")]).exit_code == 0
    spec = load_spec(folder / "clicks.yaml")
    assert spec.kafka.config == {}
    assert spec.kafka.security is not None
    # Absolute: the clients open them relative to the run's working directory, not to the spec.
    ca, cert, key = (str(folder / f"clicks.kafka-{n}") for n in ("ca.pem", "client.pem", "client.key"))
    assert spec.kafka.security.model_dump(exclude_none=True) == {
        "protocol": "SSL",
        "ca": ca,
        "certificate": cert,
        "key": key,
    }
    assert Path(ca).read_text().strip() == ca_text.strip() and "BEGIN CERTIFICATE" in ca_text
    assert Path(cert).read_text().strip() == cert_text.strip() and "BEGIN CERTIFICATE" in cert_text
    assert not Path(key).exists()
    assert "not-a-real-key" in key_text and "not-a-real-key" not in every_file_text(tmp_path) + ran.output
    assert "put the client key (PKCS#8 PEM" in ran.output and f"at {key} before running" in " ".join(ran.output.split())
    assert f"wrote {ca}" in " ".join(ran.output.split())

    # Once the user has put the key there, a run's Kafka options are complete for both clients.
    Path(key).write_text(key_text)
    options = connector_options(spec.kafka, "kafka-tls.internal:9093", ["clicks"])
    assert options["kafka.security.protocol"] == "SSL"
    assert options["kafka.ssl.truststore.location"] == ca
    assert options["kafka.ssl.keystore.certificate.chain"].strip() == cert_text.strip()
    assert librdkafka_config(spec.kafka, "kafka-tls.internal:9093")["ssl.key.location"] == key

    again = runner.invoke(app, ["import", "glassflow", str(MTLS), "-o", "pipelines/other.yaml"])
    assert again.exit_code == 0, again.output  # other files: nothing in the way
    (folder / "other.yaml").unlink()
    kept = runner.invoke(app, ["import", "glassflow", str(MTLS), "-o", "pipelines/other.yaml"])
    assert kept.exit_code == 1 and "other.kafka-ca.pem" in kept.output and "--force" in kept.output
    assert not (folder / "other.yaml").exists()
    forced = runner.invoke(app, ["import", "glassflow", str(MTLS), "-o", "pipelines/other.yaml", "--force"])
    assert forced.exit_code == 0 and (folder / "other.yaml").exists()


def test_sasl_import_gives_both_kafka_clients_the_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = json.loads((FIXTURES / "glassflow_v3_dedup.json").read_text())
    params = config["sources"][0]["connection_params"]
    params.update(protocol="SASL_SSL", mechanism="SCRAM-SHA-512", username="app", password="hunter2-not-copied")
    result = import_glassflow(config_file(tmp_path, config), tmp_path / "users.yaml")
    assert result.unmapped == [] and result.files == {}  # no root_ca: the system's trust store
    spec = written(result, tmp_path)
    assert spec.kafka.config == {}
    assert spec.kafka.security is not None
    assert spec.kafka.security.model_dump(exclude_none=True) == {
        "protocol": "SASL_SSL",
        "mechanism": "SCRAM-SHA-512",
        "username": "${env:RIVERHOUSE_SECRET_USERS_DEDUP__KAFKA_USERNAME}",
        "password": "${env:RIVERHOUSE_SECRET_USERS_DEDUP__KAFKA_PASSWORD}",
    }
    assert "hunter2" not in result.to_yaml() and "app" not in str(spec.kafka.security)
    monkeypatch.setenv("RIVERHOUSE_SECRET_USERS_DEDUP__KAFKA_USERNAME", "app")
    monkeypatch.setenv("RIVERHOUSE_SECRET_USERS_DEDUP__KAFKA_PASSWORD", "pw")
    jaas = connector_options(spec.kafka, "kafka:9092", ["users"])["kafka.sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.scram.ScramLoginModule required")


def test_printed_spec_says_which_certificates_it_cannot_name(tmp_path: Path) -> None:
    """Without -o there is no file to write a certificate beside: each is reported, and the spec still validates."""
    result = import_glassflow(MTLS)
    assert result.files == {}
    assert {u.setting: u.reason for u in result.unmapped if "connection_params" in u.setting}.keys() == {
        "source.connection_params.root_ca",
        "source.connection_params.client_cert",
        "source.connection_params.client_key",
    }
    assert all("-o FILE" in u.reason for u in result.unmapped if u.setting.endswith(("root_ca", "client_cert")))
    spec = written(result, tmp_path)
    assert spec.kafka.config == {} and spec.kafka.security is not None
    assert spec.kafka.security.model_dump(exclude_none=True) == {"protocol": "SSL"}
    assert "not-a-real-key" not in result.to_yaml() and "BEGIN" not in result.to_yaml()
    printed = CliRunner().invoke(app, ["import", "glassflow", str(MTLS), "--strict"])
    assert printed.exit_code == 1 and "root_ca" in printed.output and "name: clicks_mtls" not in printed.output


@pytest.mark.parametrize("mechanism", ["GSSAPI", "OAUTHBEARER", "AWS_MSK_IAM"])
def test_mechanisms_kafka_security_cannot_state_are_dropped_with_reasons(tmp_path: Path, mechanism: str) -> None:
    config = json.loads((FIXTURES / "glassflow_v2_join.json").read_text())
    params = config["source"]["connection_params"]
    params.update(mechanism=mechanism, skip_tls_verification=True)
    if mechanism == "GSSAPI":
        params.update(
            kerberos_service_name="kafka",
            kerberos_keytab="/etc/keytabs/app.keytab",
            kerberos_realm="EXAMPLE.COM",
            kerberos_config="/etc/krb5.conf",
        )
    result = import_glassflow(config_file(tmp_path, config), tmp_path / "orders.yaml")
    reasons = {u.setting: u.reason for u in result.unmapped if "connection_params" in u.setting}
    where = "source.connection_params."
    expected = {"mechanism", "username", "password", "skip_tls_verification"}
    if mechanism == "GSSAPI":
        expected |= {"kerberos_service_name", "kerberos_keytab", "kerberos_realm", "kerberos_config"}
    assert reasons.keys() == {where + name for name in expected}
    assert mechanism in reasons[where + "mechanism"] and "kafka.security" in reasons[where + "mechanism"]
    assert "verifies" in reasons[where + "skip_tls_verification"]
    spec = written(result, tmp_path)
    assert not [k for k in spec.kafka.config if k.startswith(SECURITY_PREFIXES)]
    assert spec.kafka.security is not None
    # TLS is kept (the broker's CA still applies); the login is not stated, so SASL is not either.
    assert spec.kafka.security.protocol == "SSL" and spec.kafka.security.mechanism is None
    assert spec.kafka.security.ca == str(tmp_path / "orders.kafka-ca.pem")
    for value in ("/etc/keytabs", "EXAMPLE.COM", "krb5", "pipeline-user", "do-not-copy-me"):
        assert value not in result.to_yaml()


def test_connection_settings_without_their_protocol(tmp_path: Path) -> None:
    config = json.loads((FIXTURES / "glassflow_v2_join.json").read_text())
    params = config["source"]["connection_params"]
    params.update(protocol="SASL_PLAINTEXT", mechanism="PLAIN")  # a CA without TLS
    result = import_glassflow(config_file(tmp_path, config), tmp_path / "orders.yaml")
    assert "TLS" in {u.setting: u.reason for u in result.unmapped}["source.connection_params.root_ca"]
    security = written(result, tmp_path).kafka.security
    assert security is not None and (security.protocol, security.mechanism, security.ca) == (
        "SASL_PLAINTEXT",
        "PLAIN",
        None,
    )
    assert result.files == {}

    params.update(protocol="SSL", mechanism="PLAIN")  # a mechanism without SASL authenticates nothing
    result = import_glassflow(config_file(tmp_path, config), tmp_path / "orders.yaml")
    assert "source.connection_params.mechanism" in settings_of(result)
    security = written(result, tmp_path).kafka.security
    assert security is not None and (security.protocol, security.mechanism) == ("SSL", None)

    params.update(protocol="SASL_SSL", mechanism="NO_AUTH")  # GlassFlow's "no authentication"
    result = import_glassflow(config_file(tmp_path, config), tmp_path / "orders.yaml")
    assert not [s for s in settings_of(result) if "connection_params" in s]
    assert any("written as SSL" in n for n in result.notes)
    security = written(result, tmp_path).kafka.security
    assert security is not None and (security.protocol, security.mechanism) == ("SSL", None)

    params.update(root_ca="not a certificate")
    result = import_glassflow(config_file(tmp_path, config), tmp_path / "orders.yaml")
    assert "PEM" in {u.setting: u.reason for u in result.unmapped}["source.connection_params.root_ca"]
