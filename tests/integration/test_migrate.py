"""Migrating from GlassFlow: imported configs run on real Kafka, Spark, Delta and ClickHouse, with exact rows.

The configs are tests/fixtures/migrate/*.json, written in GlassFlow's documented v3
format; only their topic names are made unique per test. Expected rows are computed
here from the generated events with plain Python, from the semantics docs/migrating.md
states (GlassFlow's where they are honest, Riverhouse's LEFT join where GlassFlow's
docs and its join service disagree), never from Riverhouse's code.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.importers.glassflow import import_glassflow
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.spec import PipelineSpec, load_spec
from riverhouse.platform.state.settings import Settings

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[1] / "fixtures" / "migrate"
# Recent, whole-minute timestamps: a real broker's time-based retention would delete records months old.
BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=8)
WINDOW = timedelta(hours=1)  # the fixtures' dedup and join time_window


Event = tuple[str, dict[str, Any], datetime]  # (Kafka key, JSON value, Kafka timestamp)


def produce_at(bootstrap: str, topic: str, events: list[Event]) -> None:
    """Produce in timestamp order with explicit Kafka timestamps: GlassFlow's windows run on arrival."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
    for key, value, at in sorted(events, key=lambda e: e[2]):
        producer.produce(
            topic, key=key.encode(), value=json.dumps(value).encode(), timestamp=int(at.timestamp() * 1000)
        )
    assert producer.flush(30) == 0


def iso(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def imported_spec(
    tmp_path: Path, fixture: str, topics: dict[str, str], config: dict[str, Any] | None = None
) -> PipelineSpec:
    """Import the fixture (its topics renamed) and read the written spec as `riverhouse validate` does.

    `config`: the fixture as edited by the test, written under the fixture's name.
    """
    config = config or json.loads((FIXTURES / fixture).read_text())
    for source in config.get("sources", []):  # v3
        source["topic"] = topics[source["topic"]]
    for source in config.get("source", {}).get("topics", []):  # v2: the topic's name is also its source id
        source["id"], source["name"] = source["name"], topics[source["name"]]
    config_path = tmp_path / fixture
    config_path.write_text(json.dumps(config))
    result = import_glassflow(config_path)
    assert result.unmapped == []  # everything in these documented configs has a Riverhouse equivalent
    spec_path = tmp_path / "imported.yaml"
    spec_path.write_text(result.to_yaml())
    assert spec_path.read_text().startswith(
        f"# Imported from GlassFlow pipeline config {config['version']} {config_path}"
    )
    return load_spec(spec_path)


def deduplicate(events: list[Event], key: str, window: timedelta = WINDOW) -> list[Event]:
    """GlassFlow's documented dedup: an id seen within the window of a kept event is dropped; after it, new."""
    kept: list[Event] = []
    last_kept: dict[str, datetime] = {}
    for event in sorted(events, key=lambda e: e[2]):
        ident = event[1][key]
        if ident in last_kept and event[2] - last_kept[ident] <= window:
            continue
        last_kept[ident] = event[2]
        kept.append(event)
    return kept


def utc_naive(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    return value


def clickhouse_rows(settings: Settings, spec: PipelineSpec, columns: list[str]) -> list[tuple[Any, ...]]:
    with open_client(settings.clickhouse_dsn) as client:
        rows = client.query(f"SELECT {', '.join(columns)} FROM {qualified_table(spec)}").result_rows
    return sorted((tuple(utc_naive(v) for v in row) for row in rows), key=repr)


def test_glassflow_dedup_config_runs_with_glassflow_results(
    spark: Any, kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    rng = random.Random(21)
    events: list[Event] = []
    for i in range(40):
        at = BASE + timedelta(minutes=i)
        value = {"event_id": f"e{i:02d}", "user_id": f"u{i % 7}", "name": f"N{i}", "email": f"n{i}@x.io"}
        events.append((value["event_id"], {**value, "created_at": iso(at)}, at))
    originals = list(events)
    for key, value, at in rng.sample(originals, 15):  # retries within the window: dropped, first copy wins
        later = at + timedelta(minutes=rng.randint(1, 50))
        events.append((key, {**value, "name": value["name"] + "-retry", "created_at": iso(later)}, later))
    for key, value, at in rng.sample(originals, 5):  # re-sent after the window: a new event in both systems
        later = at + timedelta(hours=2)
        events.append((key, {**value, "created_at": iso(later)}, later))
    events.append(("bad", {"user_id": "u1", "name": "no id", "email": "x", "created_at": iso(BASE)}, BASE))
    produce_at(kafka, f"{topic}_users", events)

    spec = imported_spec(tmp_path, "glassflow_v3_dedup.json", {"users": f"{topic}_users"})
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()

    valid = [e for e in events if "event_id" in e[1]]
    expected = sorted(
        (
            (v["event_id"], v["user_id"], v["name"], v["email"], at.replace(tzinfo=None))
            for _, v, at in deduplicate(valid, "event_id")
        ),
        key=repr,
    )
    assert len(expected) == 45  # 40 originals + 5 re-sends; the 15 retries are gone
    columns = ["event_id", "user_id", "name", "email", "created_at"]
    assert clickhouse_rows(settings, spec, columns) == expected
    # A message GlassFlow cannot process goes to its dead-letter queue; Riverhouse quarantines it, with the reason.
    assert summary["quarantined"] == 1


def test_glassflow_unix_seconds_into_a_datetime_column_load_as_times_and_filter_as_numbers(
    spark: Any, kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    """GlassFlow reads an int64 going into a DateTime column as Unix seconds (time.Unix(v, 0)); its filters
    see the number. Before, Riverhouse loaded the number into an Int64 column."""
    config = json.loads((FIXTURES / "glassflow_v3_dedup.json").read_text())
    for field in config["sources"][0]["schema_fields"]:
        if field["name"] == "created_at":
            field["type"] = "int64"
    cutoff = int((BASE + timedelta(minutes=10)).timestamp())
    config["transforms"].append(
        {"type": "filter", "source_id": "users", "config": {"expression": f"created_at >= {cutoff}"}}
    )
    events: list[Event] = []
    for i in range(30):
        at = BASE + timedelta(minutes=i)
        value = {"event_id": f"e{i:02d}", "user_id": f"u{i % 7}", "name": f"N{i}", "email": f"n{i}@x.io"}
        events.append((value["event_id"], {**value, "created_at": int(at.timestamp())}, at))
    events += [(k, v, at + timedelta(minutes=3)) for k, v, at in events[::4]]  # redelivered copies
    produce_at(kafka, f"{topic}_users", events)

    spec = imported_spec(tmp_path, "glassflow_v3_dedup.json", {"users": f"{topic}_users"}, config)
    created = next(f for f in spec.sources["users"].fields if f.name == "created_at")
    assert (created.type, created.epoch_unit) == ("timestamp", "seconds")
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)

    expected = sorted(
        (v["event_id"], datetime.fromtimestamp(v["created_at"], UTC).replace(tzinfo=None))
        for _, v, _ in deduplicate(events, "event_id")
        if v["created_at"] >= cutoff
    )
    assert len(expected) == 20 and expected[0][1] == (BASE + timedelta(minutes=10)).replace(tzinfo=None)
    assert clickhouse_rows(settings, spec, ["event_id", "created_at"]) == expected


def test_glassflow_join_config_runs_with_left_join_results(
    spark: Any, kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    rng = random.Random(7)
    users: list[Event] = []
    for n in range(6):  # u6 never has a profile
        at = BASE + timedelta(minutes=20 * n)
        users.append((f"u{n}", {"user_id": f"u{n}", "email": f"u{n}@v1"}, at))
        if n % 2 == 0:  # a second profile within the window: dropped by users' dedup (first wins)
            users.append((f"u{n}", {"user_id": f"u{n}", "email": f"u{n}@dup"}, at + timedelta(minutes=30)))
        if n % 3 == 0:  # a later profile version after the window: kept, and the latest for later orders
            users.append((f"u{n}", {"user_id": f"u{n}", "email": f"u{n}@v2"}, at + timedelta(minutes=95)))
    orders: list[Event] = []
    for i in range(30):
        at = BASE + timedelta(minutes=rng.randint(-30, 240))
        amount = rng.choice([0.0, -5.0, 12.5, 40.0, 99.9, 7.25])
        value = {"order_id": f"o{i:02d}", "customer_id": f"u{rng.randint(0, 6)}", "amount": amount}
        orders.append((value["order_id"], {**value, "timestamp": iso(at)}, at))
    for key, value, at in rng.sample(list(orders), 6):  # producer retries within the window
        orders.append((key, dict(value), at + timedelta(minutes=rng.randint(1, 40))))
    produce_at(kafka, f"{topic}_users", users)
    produce_at(kafka, f"{topic}_orders", orders)

    topics = {"orders": f"{topic}_orders", "users": f"{topic}_users"}
    spec = imported_spec(tmp_path, "glassflow_v3_join.json", topics)
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)

    # Each kept order with amount > 0 (the config's filter, a keep condition in v3) joins the latest kept
    # profile of its customer within |t_user - t_order| <= 1h; without one it is still emitted (LEFT).
    profiles = deduplicate(users, "user_id")
    expected = []
    for _, order, at in deduplicate(orders, "order_id"):
        if not order["amount"] > 0:
            continue
        matches = [(t, p) for _, p, t in profiles if p["user_id"] == order["customer_id"] and abs(t - at) <= WINDOW]
        profile = max(matches, key=lambda m: m[0])[1] if matches else {}
        row = (
            order["order_id"],
            order["amount"],
            at.replace(tzinfo=None),
            profile.get("user_id"),
            profile.get("email"),
        )
        expected.append(row)
    expected.sort(key=repr)
    assert any(r[3] is None for r in expected) and any(r[3] is not None for r in expected)  # the data tests both
    columns = ["order_id", "amount", "created_at", "user_id", "email"]
    assert clickhouse_rows(settings, spec, columns) == expected


def test_glassflow_v2_dedup_with_filter_and_renamed_column(
    spark: Any, kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    rng = random.Random(3)
    events: list[Event] = []
    for i in range(40):
        at = BASE + timedelta(minutes=2 * i)
        value = {
            "click_id": f"c{i:02d}",
            "user_id": f"v{i % 5}",
            "source": rng.choice(["web", "app", "bot"]),
            "duration_ms": rng.choice([-1, 0, 250, 1200]),
        }
        events.append((value["click_id"], value, at))
    for key, value, at in rng.sample(list(events), 10):  # retries within the 30m window
        events.append((key, dict(value), at + timedelta(minutes=rng.randint(1, 25))))
    produce_at(kafka, f"{topic}_clicks", events)

    spec = imported_spec(tmp_path, "glassflow_v2_dedup_filter.json", {"clicks": f"{topic}_clicks"})
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)

    # A v2 filter names the rows to DROP (GlassFlow < 3.0): bots and negative durations go.
    expected = sorted(
        (v["click_id"], v["user_id"], v["duration_ms"])
        for _, v, _ in deduplicate(events, "click_id", timedelta(minutes=30))
        if not (v["source"] == "bot" or v["duration_ms"] < 0)
    )
    assert 0 < len(expected) < 40
    assert clickhouse_rows(settings, spec, ["click_id", "visitor", "duration_ms"]) == expected
