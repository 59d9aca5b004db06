"""Imported GlassFlow pipelines with nested fields, arrays and maps run on the real broker, Spark, Delta and
ClickHouse, with exact rows.

The configs are tests/fixtures/migrate/corpus/gf_v3_nested_dedup.json (a dedup on a nested key, arrays
and a map, in the shape of GlassFlow's getting-started demo) and gf_v2_nested_join.json (an older "2.0.0"
export joining on a nested key, with a v2 drop filter). Expected rows are computed here from the produced
events in plain Python, from the semantics docs/migrating.md states (GlassFlow's dedup; the LEFT join;
expr-lang's null-as-a-value filters; a missing array or map loads as an empty one), never from Riverhouse's
code.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.importers.glassflow import import_glassflow
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.spec import PipelineSpec, load_spec
from riverhouse.platform.state.settings import Settings
from tests.integration.test_migrate import BASE, WINDOW, Event, clickhouse_rows, iso, produce_at

pytestmark = pytest.mark.integration

CORPUS = Path(__file__).parents[1] / "fixtures" / "migrate" / "corpus"


def imported_spec(tmp_path: Path, fixture: str, topics: dict[str, str]) -> PipelineSpec:
    """Import the corpus config (its topics renamed), write the spec, and load it as `riverhouse validate` does."""
    config = json.loads((CORPUS / fixture).read_text())
    for source in config.get("sources", []):  # v3
        source["topic"] = topics[source["topic"]]
    for source in config.get("source", {}).get("topics", []):  # v2: the topic's name is also its source id
        source["id"], source["name"] = source["name"], topics[source["name"]]
    config_path = tmp_path / fixture
    config_path.write_text(json.dumps(config))
    result = import_glassflow(config_path, tmp_path / "imported.yaml")
    assert {u.setting for u in result.unmapped} <= {"source.provider", "sink.provider"}  # UI labels only
    spec_path = tmp_path / "imported.yaml"
    spec_path.write_text(result.to_yaml())
    return load_spec(spec_path)


def first_per_window(events: list[Event], key: Any) -> list[Event]:
    """GlassFlow's documented dedup: an id seen within the window of a kept event is dropped; after it, new."""
    kept: list[Event] = []
    last_kept: dict[Any, Any] = {}
    for event in sorted(events, key=lambda e: e[2]):
        ident = key(event[1])
        if ident in last_kept and event[2] - last_kept[ident] <= WINDOW:
            continue
        last_kept[ident] = event[2]
        kept.append(event)
    return kept


def test_imported_nested_dedup_loads_nested_values_arrays_and_maps_exactly(
    spark: Any, kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    rng = random.Random(30)
    events: list[Event] = []
    for i in range(36):
        at = BASE + timedelta(minutes=3 * i)
        value: dict[str, Any] = {
            "event_id": f"e{i:02d}",
            "account": {"id": f"a{i % 12}", "profile": {"name": f"N{i}", "age": 20 + i}},
            "labels": rng.sample(["new", "promo", "mobile", "web"], rng.randint(0, 3)),
            "scores": [round(rng.random(), 3), None][: rng.randint(0, 2)],
            "signed_up_at": iso(at),
        }
        if i % 4:  # a missing map loads as an empty one (ClickHouse has no Nullable(Map))
            value["context"] = {"utm": rng.choice(["ads", "mail"]), "step": str(i)}
        if i % 5 == 0:  # a missing nested value is null
            del value["account"]["profile"]["age"]
        events.append((value["event_id"], value, at))
    # Records GlassFlow would send to its DLQ: quarantined here, with the reason.
    events.append(("bad1", {"event_id": "x1", "account": {"profile": {"name": "no id"}}, "labels": []}, BASE))
    events.append(("bad2", {"event_id": "x2", "account": "a1", "labels": []}, BASE))
    events.append(("bad3", {"event_id": "x3", "account": {"id": "a1"}, "labels": "promo"}, BASE))
    produce_at(kafka, f"{topic}_signups", events)

    spec = imported_spec(tmp_path, "gf_v3_nested_dedup.json", {"signups": f"{topic}_signups"})
    summary = Pipeline(spec, settings, spark=spark, log=lambda m: None).run()

    valid = [e for e in events if isinstance(e[1]["account"], dict) and "id" in e[1]["account"]]
    valid = [e for e in valid if isinstance(e[1]["labels"], list)]
    expected = sorted(
        (
            (
                v["event_id"],
                v["account"]["id"],
                v["account"]["profile"]["name"],
                v["account"]["profile"].get("age"),
                v["labels"],
                v["scores"],
                v.get("context", {}),
                at.replace(tzinfo=None),
            )
            for _, v, at in first_per_window(valid, lambda v: v["account"]["id"])
        ),
        key=repr,
    )
    # 12 accounts, each seen every 36 minutes: the copy 36 min later is dropped, the one 72 min later is new.
    assert len(expected) == 24
    assert any(row[3] is None for row in expected) and any(row[6] == {} for row in expected)
    columns = ["event_id", "account_id", "name", "age", "labels", "scores", "context", "signed_up_at"]
    assert clickhouse_rows(settings, spec, columns) == expected
    assert summary["quarantined"] == 3


def test_imported_nested_join_key_with_null_safe_v2_filter_runs_exactly(
    spark: Any, kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    rng = random.Random(31)
    buyers: list[Event] = []
    for n in range(6):  # b6 never appears
        at = BASE + timedelta(minutes=25 * n)
        profile = {"buyer": {"id": f"b{n}", "name": f"Buyer {n}"}, "tiers": ["gold", "eu"][: n % 3]}
        buyers.append((f"b{n}", profile, at))
        if n % 2 == 0:  # a copy within the window: dropped by the buyers' dedup (first wins)
            copy = {"buyer": {"id": f"b{n}", "name": f"Buyer {n} copy"}, "tiers": ["copy"]}
            buyers.append((f"b{n}", copy, at + timedelta(minutes=20)))
        if n % 3 == 0:  # a new version after the window: kept, and the latest for later purchases
            later = {"buyer": {"id": f"b{n}", "name": f"Buyer {n} v2"}, "tiers": ["platinum"]}
            buyers.append((f"b{n}", later, at + timedelta(minutes=100)))
    purchases: list[Event] = []
    for i in range(32):
        at = BASE + timedelta(minutes=rng.randint(-30, 240), seconds=i)
        value: dict[str, Any] = {"purchase_id": f"p{i:02d}", "buyer_id": f"b{rng.randint(0, 6)}", "amount": i * 1.5}
        status = rng.choice(["paid", "cancelled", None, "missing"])
        if status == "missing":
            pass  # no status key at all
        else:
            value["status"] = status
        purchases.append((value["purchase_id"], value, at))
    for key, value, at in rng.sample(list(purchases), 6):  # producer retries within the window
        purchases.append((key, dict(value), at + timedelta(minutes=rng.randint(1, 40))))
    produce_at(kafka, f"{topic}_buyers", buyers)
    produce_at(kafka, f"{topic}_purchases", purchases)

    topics = {"purchases": f"{topic}_purchases", "buyers": f"{topic}_buyers"}
    spec = imported_spec(tmp_path, "gf_v2_nested_join.json", topics)
    Pipeline(spec, settings, spark=spark, log=lambda m: None).run(drain=True)

    # A v2 filter names the rows to DROP: `status == 'cancelled'`. In expr-lang a missing status is nil, and
    # nil == 'cancelled' is false: those purchases are kept. Each kept purchase joins the latest kept buyer
    # profile with its id within |t_buyer - t_purchase| <= 1h; without one it is still emitted (LEFT).
    profiles = first_per_window(buyers, lambda v: v["buyer"]["id"])
    expected = []
    for _, purchase, at in first_per_window(purchases, lambda v: v["purchase_id"]):
        if purchase.get("status") == "cancelled":
            continue
        matches = [(t, p) for _, p, t in profiles if p["buyer"]["id"] == purchase["buyer_id"] and abs(t - at) <= WINDOW]
        profile = max(matches, key=lambda m: m[0])[1] if matches else None
        expected.append(
            (
                purchase["purchase_id"],
                purchase["buyer_id"],
                purchase["amount"],
                purchase.get("status"),
                profile["buyer"]["name"] if profile else None,
                profile["tiers"] if profile else [],  # an unmatched array loads as an empty one
            )
        )
    expected.sort(key=repr)
    assert any(r[3] is None for r in expected)  # the null-safe filter kept missing statuses
    assert any(r[4] is None for r in expected) and any(r[4] is not None for r in expected)
    assert any(r[5] for r in expected)  # arrays travel through the join
    columns = ["purchase_id", "buyer_id", "amount", "status", "buyer_name", "tiers"]
    assert clickhouse_rows(settings, spec, columns) == expected
