from __future__ import annotations

import json
from datetime import timedelta

import pytest

from riverhouse.platform.kafka.generator import (
    GeneratedStats,
    GeneratorConfig,
    expected_join,
    orders,
    user_events,
)

pytestmark = pytest.mark.unit


def test_orders_counts_add_up_and_are_deterministic() -> None:
    cfg = GeneratorConfig(count=500, duplicate_rate=0.2, malformed=7, out_of_order=0.1, seed=3)
    records, stats = orders(cfg)
    records = list(records)
    assert len(records) == stats.messages == 500 + 100 + 7
    valid_ids = set()
    for _, value in records:
        try:
            payload = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            continue
        if (
            isinstance(payload, dict)
            and isinstance(payload.get("order_id"), str)
            and isinstance(payload.get("amount"), int)
        ):
            valid_ids.add(payload["order_id"])
    assert len(valid_ids) == stats.expected_unique == 500
    again, _ = orders(cfg)
    assert list(again) == records


def test_user_events_share_user_ids_with_orders() -> None:
    cfg = GeneratorConfig(count=200, users=50, duplicate_rate=0, malformed=0)
    order_users = {json.loads(v)["user_id"] for _, v in orders(cfg)[0]}
    records, stats = user_events(cfg, missing_users=0)
    event_users = {json.loads(v)["user_id"] for _, v in records}
    assert order_users <= event_users
    assert len(stats.events) >= 50  # some users have a second version


def test_expected_join_reference_answer() -> None:
    orders_stats = GeneratedStats(
        topic="orders",
        events=[
            {"order_id": "o1", "user_id": "a", "created_at": "2026-01-01T10:00:00.000Z"},
            {"order_id": "o2", "user_id": "b", "created_at": "2026-01-01T10:00:00.000Z"},
            {"order_id": "o3", "user_id": "c", "created_at": "2026-01-01T10:00:00.000Z"},
        ],
    )
    users_stats = GeneratedStats(
        topic="user_events",
        events=[
            {"user_id": "a", "name": "A1", "created_at": "2026-01-01T09:30:00.000Z"},
            {"user_id": "a", "name": "A2", "created_at": "2026-01-01T10:45:00.000Z"},
            {"user_id": "a", "name": "A3", "created_at": "2026-01-01T11:30:00.000Z"},  # outside 1h
            {"user_id": "b", "name": "B", "created_at": "2026-01-01T08:00:00.000Z"},  # outside 1h
        ],
    )
    answer = expected_join(orders_stats, users_stats, timedelta(hours=1))
    assert answer["names"] == {"o1": "A2", "o2": None, "o3": None}
    assert (answer["expected_joined"], answer["expected_unmatched"]) == (1, 2)


def test_bad_generator_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate_rate"):
        GeneratorConfig(duplicate_rate=1.5)
