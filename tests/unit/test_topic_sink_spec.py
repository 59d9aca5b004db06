"""Kafka sinks in the spec (`sink.kind: kafka`, `sinks:`), their JSON records and their ledger's resume rule."""

from __future__ import annotations

import copy
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from riverhouse.platform.sink.topic_format import JsonRows
from riverhouse.platform.sink.topic_ledger import Progress, parse_record, progress_record, reset_record
from riverhouse.platform.spec import NoClickHouseSink, SpecError, check_together, parse_spec
from riverhouse.platform.spec_sinks import transactional_id
from riverhouse.platform.state.reset import plan_reset
from riverhouse.platform.state.settings import Settings
from tests.conftest import REPO

pytestmark = pytest.mark.unit

TOPIC_SINK = {"kind": "kafka", "topic": "orders_clean", "key": ["order_id"]}


def base() -> dict:
    return yaml.safe_load((REPO / "pipelines" / "orders_dedup.yaml").read_text())


def with_sinks(*sinks: dict) -> dict:
    data = base()
    clickhouse = data.pop("sink")
    data["sinks"] = [clickhouse if s == "clickhouse" else s for s in sinks]
    return data


def problems(data: dict) -> list[tuple[str, str, str]]:
    with pytest.raises(SpecError) as info:
        parse_spec(data, "test.yaml")
    return info.value.problems


def test_a_spec_without_kind_is_the_clickhouse_sink_it_always_was() -> None:
    spec = parse_spec(base())
    assert spec.sink.table == "orders" and spec.topic_sinks == [] and spec.output_name == "orders"
    dumped = spec.model_dump(mode="json", exclude_none=True)
    assert dumped["sink"]["table"] == "orders" and "sinks" not in dumped
    assert parse_spec(dumped) == spec  # a dump reads back as the same spec


def test_a_topic_as_the_only_sink() -> None:
    data = base()
    data["sink"] = dict(TOPIC_SINK)
    spec = parse_spec(data)
    assert spec.clickhouse_sink is None
    (sink,) = spec.topic_sinks
    assert (sink.topic, sink.key, sink.format, sink.ledger) == (
        "orders_clean",
        ["order_id"],
        "json",
        "riverhouse-ledger.orders_clean",
    )
    assert spec.output_name == spec.name  # gold and Dagster names need a name without a ClickHouse table
    assert transactional_id(spec.name, sink) == "riverhouse.orders_dedup.orders_clean"
    with pytest.raises(NoClickHouseSink, match="no ClickHouse sink"):
        _ = spec.sink


def test_clickhouse_and_topic_side_by_side() -> None:
    spec = parse_spec(with_sinks("clickhouse", TOPIC_SINK, {**TOPIC_SINK, "topic": "orders_audit", "key": None}))
    assert spec.sink.table == "orders"
    assert [s.topic for s in spec.topic_sinks] == ["orders_clean", "orders_audit"]
    assert parse_spec(spec.model_dump(mode="json", exclude_none=True)) == spec


def test_sink_problems_are_named_where_they_are() -> None:
    data = base()
    data["sink"] = {**TOPIC_SINK, "tpoic": "x"}
    assert [p[0] for p in problems(data)] == ["sink.tpoic"]
    data["sink"] = {"kind": "kafak", "topic": "x"}
    assert problems(data)[0][:2] == ("sink", "a sink's kind is one of clickhouse, kafka (default clickhouse)")
    data["sink"] = {**TOPIC_SINK, "topic": "bad topic!"}
    found = problems(data)
    assert found[0][0] == "sink.topic" and "legal Kafka topic" in found[0][1]
    found = problems(with_sinks("clickhouse", {**TOPIC_SINK, "format": "xml"}))
    assert found[0][0] == "sinks[1].format" and "json" in found[0][2]


@pytest.mark.parametrize(
    ("sinks", "message"),
    [
        ((TOPIC_SINK, {**TOPIC_SINK, "key": ["nope"]}), "sinks[1].key column 'nope' is not a field of source"),
        (({**TOPIC_SINK, "topic": "orders"},), "sinks[0].topic 'orders' is the topic of source 'orders'"),
        (
            ({**TOPIC_SINK, "ledger_topic": "orders"},),
            "sinks[0].ledger_topic 'orders' is the topic of source 'orders'",
        ),
        ((TOPIC_SINK, TOPIC_SINK), "sinks[1].topic 'orders_clean' is already written by sinks[0]"),
        (("clickhouse", "clickhouse"), "at most one ClickHouse table"),
        (
            ({**TOPIC_SINK, "ledger_topic": "orders_clean"},),
            "is the sink's own topic: the ledger needs a topic of its own",
        ),
    ],
)
def test_topic_sink_rules(sinks: tuple, message: str) -> None:
    assert any(message in p[1] for p in problems(with_sinks(*sinks))), problems(with_sinks(*sinks))


def test_one_of_sink_and_sinks() -> None:
    data = base()
    data["sinks"] = [TOPIC_SINK]
    assert "not both" in problems(data)[0][1]
    data = base()
    del data["sink"]
    assert "has no sink" in problems(data)[0][1]


def test_a_topic_key_may_be_written_as_a_field_path() -> None:
    data = base()
    data["sources"]["orders"]["fields"]["customer"] = {"path": "customer.id", "type": "string"}
    data["sink"] = {**TOPIC_SINK, "key": ["customer.id"]}
    assert parse_spec(data).topic_sinks[0].key == ["customer"]


def test_join_pipelines_key_their_topic_by_output_columns() -> None:
    data = yaml.safe_load((REPO / "pipelines" / "orders_enriched.yaml").read_text())
    clickhouse = data.pop("sink")
    data["sinks"] = [clickhouse, {"kind": "kafka", "topic": "enriched", "key": ["order_id"]}]
    spec = parse_spec(data)
    assert spec.output_name == clickhouse["table"]  # gold keeps its name when a topic is added
    data["sinks"][1]["key"] = ["price_total_nope"]
    assert "is not an output column" in problems(data)[0][1]


def test_two_specs_cannot_write_one_topic() -> None:
    first = parse_spec(with_sinks("clickhouse", TOPIC_SINK))
    other = copy.deepcopy(with_sinks(TOPIC_SINK))
    other["name"] = "orders_again"
    second = parse_spec(other)
    accepted, errors = check_together([("a.yaml", first), ("b.yaml", second)])
    assert [s.name for s in accepted] == ["orders_dedup"]
    (error,) = errors
    assert error.source == "b.yaml"
    # one problem: the default ledger, named after the topic, clashes too and goes unsaid
    assert [p[:2] for p in error.problems] == [
        ("sinks[0].topic", "Kafka topic 'orders_clean' is already written by a.yaml")
    ]
    # a pipeline may read another's output: chaining is not a clash
    chained = base()
    chained["name"], chained["sources"]["orders"]["topic"] = "downstream", "orders_clean"
    chained["sink"]["table"] = "downstream"
    accepted, errors = check_together([("a.yaml", first), ("c.yaml", parse_spec(chained))])
    assert errors == [] and len(accepted) == 2


# ------------------------------------------------------------------------ JSON records
def test_json_records_and_keys() -> None:
    rows = pa.table(
        {
            "order_id": ["o-1", 'o"2', "line\nbreak"],
            "amount": pa.array([3, None, -7], pa.int32()),
            "price": [9.5, float("nan"), float("inf")],
            "created_at": pa.array(
                [datetime(2026, 3, 1, 10, 0, 0, 250000, tzinfo=UTC), None, datetime(2026, 3, 2, tzinfo=UTC)],
                pa.timestamp("us", tz="UTC"),
            ),
            "day": pa.array([date(2026, 3, 1)] * 3),
            "total": pa.array([Decimal("10.50")] * 3, pa.decimal128(9, 2)),
            "tags": [["a", "b"], None, []],
            "attrs": pa.array([[("k", "v")], [], None], pa.map_(pa.string(), pa.string())),
            "paid": [True, False, None],
        }
    )
    encoder = JsonRows(rows.column_names, ["order_id"])
    values = [json.loads(v) for v in encoder.values(rows)]
    assert values[0] == {
        "order_id": "o-1",
        "amount": 3,
        "price": 9.5,
        "created_at": "2026-03-01T10:00:00.250000Z",
        "day": "2026-03-01",
        "total": "10.50",
        "tags": ["a", "b"],
        "attrs": {"k": "v"},
        "paid": True,
    }
    assert values[1]["order_id"] == 'o"2' and values[1]["amount"] is None and values[1]["price"] == "NaN"
    assert values[1]["created_at"] is None and values[1]["tags"] is None and values[1]["attrs"] == {}
    assert values[2]["order_id"] == "line\nbreak" and values[2]["price"] == "Infinity" and values[2]["paid"] is None
    assert list(json.loads(encoder.values(rows)[0])) == rows.column_names  # the output's column order
    assert encoder.keys(rows) == [b"o-1", b'o"2', b"line\nbreak"]
    assert JsonRows(rows.column_names, ["amount"]).keys(rows) == [b"3", None, b"-7"]  # a null key: no key
    assert JsonRows(rows.column_names, ["created_at"]).keys(rows)[0] == b"2026-03-01T10:00:00.250000Z"
    assert json.loads(JsonRows(rows.column_names, ["order_id", "amount"]).keys(rows)[1]) == {
        "order_id": 'o"2',
        "amount": None,
    }
    assert JsonRows(rows.column_names, []).keys(rows) == [None, None, None]


# ------------------------------------------------------------------------ the ledger
def test_where_a_sink_resumes() -> None:
    table = "table-a"
    # nothing yet, a reset, or another table's progress after a reset: from the first version
    assert Progress(table, 7, True, 3, 100, 50, reset=True).resume(table) == (0, 0, None, 0)
    # a complete version: the next one, cut with the sink's own slice size
    assert Progress(table, 7, True, 3, 100, 50).resume(table) == (8, 0, None, 0)
    # a version in part: its next chunk, cut as it was cut before, with the rows already in
    assert Progress(table, 7, False, 2, 100, 50).resume(table) == (7, 2, 50, 100)


def test_ledger_records_read_back_and_foreign_ones_are_refused() -> None:
    progress = Progress("t", 4, False, 2, 120, 60)
    assert parse_record(progress_record("p", "topic", progress)) == progress
    assert parse_record(reset_record("p", "topic")).reset
    assert parse_record(None) is None  # a tombstone
    with pytest.raises(ValueError, match="not a Riverhouse ledger record"):
        parse_record(b'{"version": 3}')


def test_reset_plan_keeps_the_topic_and_starts_the_ledger_over(tmp_path: Path) -> None:
    data = base()
    data["sink"] = dict(TOPIC_SINK)
    plan = plan_reset(parse_spec(data), Settings.from_env(tmp_path / "home"))
    assert plan.clickhouse_table == "" and plan.topics == {"orders_clean": "riverhouse-ledger.orders_clean"}
    (line,) = [line for line in plan.describe() if "Kafka" in line]
    assert "riverhouse-ledger.orders_clean" in line and "keeps its records" in line
    assert not any("ClickHouse" in line for line in plan.describe())


def test_an_avro_sinks_registry_credentials_are_resolved_only_when_it_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sink that writes nothing (`riverhouse reset` builds one to mark its ledger) needs no
    registry secret; the first chunk it writes does, and a missing one is named."""
    from riverhouse.platform.sink.topic_avro import encoder_for

    data = base()
    secret = f"RIVERHOUSE_SECRET_{data['name'].upper()}__REGISTRY_PASSWORD"
    monkeypatch.delenv(secret, raising=False)
    registry = {
        "url": "http://127.0.0.1:9/apis/ccompat/v7",
        "auth": {"username": "u", "password": f"${{env:{secret}}}"},
    }
    data["sink"] = {**TOPIC_SINK, "format": "avro", "schema_registry": registry}
    spec = parse_spec(data)
    encoder = encoder_for(spec.topic_sinks[0], spec.name, ["order_id"], ["order_id"])
    rows = pa.table({"order_id": ["a"]})
    assert encoder.keys(rows) == [b"a"]  # keys need no registry
    with pytest.raises(SpecError, match=secret):
        encoder.prepare(rows)
