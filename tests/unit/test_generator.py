from __future__ import annotations

import json

import pytest

from riverhouse.platform.generator import GeneratorConfig, orders, user_events

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
        if isinstance(payload, dict) and isinstance(payload.get("order_id"), str) and isinstance(payload.get("amount"), int):
            valid_ids.add(payload["order_id"])
    assert len(valid_ids) == stats.expected_unique == 500
    again, _ = orders(cfg)
    assert list(again) == records


def test_user_events_share_user_ids_with_orders() -> None:
    cfg = GeneratorConfig(count=200, users=50, duplicate_rate=0, malformed=0)
    order_users = {json.loads(v)["user_id"] for _, v in orders(cfg)[0]}
    event_users = {json.loads(v)["user_id"] for _, v in user_events(cfg)[0]}
    assert order_users <= event_users


def test_bad_generator_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate_rate"):
        GeneratorConfig(duplicate_rate=1.5)
