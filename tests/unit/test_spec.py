"""Spec validation: every problem reported with its path; unsafe input rejected."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from riverhouse.platform.spec import SpecError, load_spec, load_specs, parse_spec, parse_window
from tests.conftest import REPO, orders_spec

pytestmark = pytest.mark.unit


def base() -> dict:
    return yaml.safe_load((REPO / "pipelines" / "orders_dedup.yaml").read_text())


def problems(data: dict) -> list[tuple[str, str, str]]:
    with pytest.raises(SpecError) as info:
        parse_spec(data, "test.yaml")
    return info.value.problems


def test_example_specs_are_valid() -> None:
    specs = load_specs(REPO / "pipelines")
    assert "orders_dedup" in {s.name for s in specs}
    spec = load_spec(REPO / "pipelines" / "orders_dedup.yaml")
    assert spec.sink_source.dedup is not None
    assert spec.sink_source.dedup.window == timedelta(hours=1)
    assert spec.sink_source.required_fields == ["order_id"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("1h", timedelta(hours=1)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(weeks=1)),
    ],
)
def test_windows_parse(text: str, expected: timedelta) -> None:
    assert parse_window(text) == expected


@pytest.mark.parametrize("window", ["0s", "0h", "8d", "2w", "169h", "abc", "1 fortnight", "-1h"])
def test_invalid_windows_are_rejected_with_path(window: str) -> None:
    data = base()
    data["sources"]["orders"]["dedup"]["window"] = window
    found = problems(data)
    assert [p[0] for p in found] == ["sources.orders.dedup.window"]
    assert found[0][2]  # a hint


def test_unknown_fields_are_rejected_everywhere() -> None:
    data = base()
    data["sink"]["tabel"] = "x"
    data["sources"]["orders"]["dedupe"] = {"window": "1h"}
    paths = {p[0] for p in problems(data)}
    assert paths == {"sink.tabel", "sources.orders.dedupe"}


@pytest.mark.parametrize("bad", ["order id", "orders;DROP TABLE x", "1abc", "a-b", "`x`", "x" * 64, ""])
def test_unsafe_identifiers_are_rejected(bad: str) -> None:
    data = base()
    data["sink"]["table"] = bad
    found = problems(data)
    assert found[0][0] == "sink.table"
    assert "safe SQL identifier" in found[0][1]


def test_unsafe_field_name_is_rejected() -> None:
    data = base()
    data["sources"]["orders"]["fields"]["bad name"] = "string"
    assert any("safe SQL identifier" in p[1] for p in problems(data))


def test_references_must_exist() -> None:
    data = base()
    data["sources"]["orders"]["key"] = ["nope"]
    assert "key field 'nope' is not in fields" in problems(data)[0][1]
    data = base()
    data["sink"]["order_by"] = ["nope"]
    assert "order_by column 'nope'" in problems(data)[0][1]
    data = base()
    data["sources"]["orders"]["event_time"]["field"] = "user_id"
    assert "use timestamp" in problems(data)[0][1]


def test_epoch_unit_applies_to_json_timestamps_and_a_long_event_time_only() -> None:
    data = base()
    data["sources"]["orders"]["fields"]["created_at"] = {"type": "timestamp", "epoch_unit": "seconds"}
    assert parse_spec(data).sources["orders"].field("created_at").epoch_unit == "seconds"
    data["sources"]["orders"]["fields"]["created_at"] = {"type": "timestamp", "epoch_unit": "minutes"}
    assert "seconds" in problems(data)[0][1]  # pydantic names the allowed units
    data = base()
    data["sources"]["orders"]["fields"]["user_id"] = {"type": "string", "epoch_unit": "seconds"}
    assert "epoch_unit applies to timestamp fields and to a long event-time field, not string" in problems(data)[0][1]
    data = base()
    data["sources"]["orders"]["fields"]["n"] = {"type": "long", "epoch_unit": "seconds"}
    assert "applies to the event_time field only" in problems(data)[0][1]
    data["sources"]["orders"]["event_time"]["field"] = "n"
    assert parse_spec(data).sources["orders"].field("n").epoch_unit == "seconds"
    schema = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}, TIMESTAMP_MILLIS]}
    avro = {"topic": "t", "format": "avro", "key": ["id"], "avro_schema": schema}
    avro["fields"] = {"id": "string", "at": {"type": "timestamp", "epoch_unit": "seconds"}}
    data = {"name": "av", "sources": {"s": avro}, "sink": {"table": "av", "order_by": ["id"]}}
    assert "an Avro timestamp has its unit in its logical type" in problems(data)[0][1]


TIMESTAMP_MILLIS = {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}


def test_bad_topic_and_reserved_kafka_settings() -> None:
    data = base()
    data["sources"]["orders"]["topic"] = "bad topic!"
    assert "legal Kafka topic" in problems(data)[0][1]
    data = base()
    data["kafka"]["config"] = {"group.id": "mine"}
    assert "managed by Riverhouse" in problems(data)[0][1]


def test_several_problems_are_all_reported() -> None:
    data = base()
    data["name"] = "bad name"
    data["sources"]["orders"]["dedup"]["window"] = "8d"
    data["sink"]["batch_size"] = 0
    assert {p[0] for p in problems(data)} == {"name", "sources.orders.dedup.window", "sink.batch_size"}


def test_env_refs_resolve_and_secrets_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    data = base()
    data["kafka"]["security"] = {"protocol": "SSL", "certificate": "/c.pem", "key": "/k.pem"}
    data["kafka"]["config"] = {"client.id": "svc", "ssl.key.password": "${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__RH_TEST}"}
    spec = parse_spec(data)
    monkeypatch.setenv("RIVERHOUSE_SECRET_ORDERS_DEDUP__RH_TEST", "s3cret")
    assert spec.kafka.resolved_config()["ssl.key.password"] == "s3cret"
    assert spec.kafka.redacted_config() == {"client.id": "svc", "ssl.key.password": "***"}
    monkeypatch.delenv("RIVERHOUSE_SECRET_ORDERS_DEDUP__RH_TEST")
    with pytest.raises(SpecError, match="RIVERHOUSE_SECRET_ORDERS_DEDUP__RH_TEST is not set"):
        spec.kafka.resolved_config()


def test_validate_cli_prints_every_problem_and_exits_1(tmp_path: Path) -> None:
    data = base()
    data["sources"]["orders"]["dedup"]["window"] = "0s"
    data["sink"]["table"] = "orders; drop"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    proc = subprocess.run(
        [sys.executable, "-m", "riverhouse.cli", "validate", str(bad), str(broken)], capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert "sources.orders.dedup.window" in proc.stderr
    assert "sink.table" in proc.stderr
    assert "hint:" in proc.stderr
    assert "invalid YAML" in proc.stderr and "line 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "riverhouse.cli", "validate", str(REPO / "pipelines" / "orders_dedup.yaml")],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr


def test_test_helper_spec_is_valid() -> None:
    assert orders_spec("t1").sink.table == "orders_test_orders"


def test_spec_round_trips_through_yaml() -> None:
    spec = load_spec(REPO / "pipelines" / "orders_dedup.yaml")
    dumped = yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True))
    assert "window: 1h" in dumped
    assert parse_spec(yaml.safe_load(dumped)) == spec


def test_owners_must_be_emails_or_teams() -> None:
    data = base()
    data["owners"] = ["team:data", "ana@example.com", "nobody"]
    found = problems(data)
    assert found[0][0] == "owners" and "'nobody'" in found[0][1]


def test_one_security_section_maps_to_the_java_client_and_librdkafka(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from riverhouse.platform.kafka.client import connector_options, java_security, librdkafka_security

    (tmp_path / "client.pem").write_text("-----BEGIN CERTIFICATE-----\nCERT\n-----END CERTIFICATE-----\n")
    (tmp_path / "client.key").write_text("-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n")
    data = base()
    data["kafka"]["security"] = {
        "protocol": "SASL_SSL",
        "mechanism": "SCRAM-SHA-512",
        "username": "svc",
        "password": "${env:RIVERHOUSE_SECRET_ORDERS_DEDUP__TEST}",
        "ca": "/etc/ca.pem",
        "certificate": str(tmp_path / "client.pem"),
        "key": str(tmp_path / "client.key"),
    }
    spec = parse_spec(data)
    monkeypatch.setenv("RIVERHOUSE_SECRET_ORDERS_DEDUP__TEST", 'pa"ss')
    assert librdkafka_security(spec.kafka.security) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": 'pa"ss',
        "ssl.ca.location": "/etc/ca.pem",
        "ssl.certificate.location": str(tmp_path / "client.pem"),
        "ssl.key.location": str(tmp_path / "client.key"),
    }
    assert java_security(spec.kafka.security) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="svc" password="pa\\"ss";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/ca.pem",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "-----BEGIN CERTIFICATE-----\nCERT\n-----END CERTIFICATE-----\n",
        "ssl.keystore.key": "-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n",
    }
    options = connector_options(spec.kafka, "b:9093", ["orders"])
    assert options["kafka.isolation.level"] == "read_committed" and options["includeHeaders"] == "true"
    assert options["kafka.security.protocol"] == "SASL_SSL" and options["failOnDataLoss"] == "true"


def test_security_section_problems_are_reported() -> None:
    data = base()
    data["kafka"]["security"] = {"protocol": "SASL_SSL", "mechanism": "PLAIN", "username": "u", "password": "hunter2"}
    assert "environment reference" in problems(data)[0][1]
    data["kafka"]["security"] = {"protocol": "SASL_SSL", "username": "u"}
    assert "needs mechanism, username and password" in problems(data)[0][1]
    data["kafka"]["security"] = {"protocol": "SSL", "certificate": "/c.pem"}
    assert "certificate and key together" in problems(data)[0][1]


def test_security_in_kafka_config_is_refused_at_validation() -> None:
    """Security is stated once, in kafka.security, for both clients: kafka.config takes no security setting."""
    data = base()
    data["kafka"]["config"] = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    found = problems(data)
    assert [where for where, _, _ in found] == ["kafka.config.security.protocol", "kafka.config.sasl.mechanism"]
    assert all("state it once in kafka.security" in message for _, message, _ in found)
