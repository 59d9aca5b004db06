"""Synthetic events for demos, tests and benchmarks (GlassGen-like).

Orders and user events share user ids. The generator injects what real Kafka
topics carry: producer-retry duplicates (the same payload again), out-of-order
event times and malformed records. It also counts what a correct pipeline must
output (`expected_unique`) from its own bookkeeping, independently of the
pipeline code, so tests and the demo compare against an outside answer.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

# Malformed shapes, each of which a pipeline must quarantine with a reason.
MALFORMED_KINDS = ("invalid_json", "wrong_type", "missing_key", "null_key", "invalid_utf8", "not_an_object")


@dataclass(frozen=True)
class GeneratorConfig:
    count: int = 10_000  # distinct events
    duplicate_rate: float = 0.10  # extra copies, as a fraction of `count`
    out_of_order: float = 0.05  # fraction whose event time is earlier than their predecessors'
    malformed: int = 10  # extra malformed records
    users: int = 1_000
    seed: int = 42
    start: datetime = field(default_factory=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    spacing: timedelta = timedelta(milliseconds=100)
    max_lateness: timedelta = timedelta(minutes=10)

    def __post_init__(self) -> None:
        if self.count < 0 or self.malformed < 0 or self.users <= 0:
            raise ValueError("count and malformed must be >= 0 and users > 0")
        for name in ("duplicate_rate", "out_of_order"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")


@dataclass
class GeneratedStats:
    topic: str
    messages: int = 0
    unique: int = 0
    duplicates: int = 0
    malformed: int = 0
    out_of_order: int = 0
    # The distinct valid events, as produced: the outside answer tests and the demo compare with.
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def expected_unique(self) -> int:
        return self.unique

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "messages": self.messages,
            "unique": self.unique,
            "duplicates": self.duplicates,
            "malformed": self.malformed,
            "out_of_order": self.out_of_order,
            "expected_unique": self.expected_unique,
        }


Record = tuple[bytes | None, bytes | None]


def _iso(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _malformed(kind: str, rng: random.Random, index: int) -> Record:
    key = f"bad-{index}".encode()
    if kind == "invalid_json":
        return key, b'{"order_id": "broken", "amount": '
    if kind == "wrong_type":
        return key, json.dumps(
            {
                "order_id": f"bad-{index}",
                "user_id": "u0",
                "amount": "lots",
                "price": 1.0,
                "created_at": "2026-01-01T00:00:00Z",
            }
        ).encode()
    if kind == "missing_key":
        return key, json.dumps({"user_id": "u0", "amount": 1, "price": 1.0}).encode()
    if kind == "null_key":
        return key, json.dumps({"order_id": None, "user_id": "u0", "amount": 1, "price": 1.0}).encode()
    if kind == "invalid_utf8":
        return key, b'{"order_id": "\xff\xfe", "amount": 1}'
    return key, b'["not", "an", "object"]'


def _with_duplicates_and_malformed(
    events: list[tuple[str, bytes]],
    cfg: GeneratorConfig,
    rng: random.Random,
    stats: GeneratedStats,
    key_field: str,
) -> Iterator[Record]:
    n_dupes = round(cfg.count * cfg.duplicate_rate)
    # A duplicate is a producer retry: the same payload again, soon after the original.
    dupes_after: dict[int, int] = {}
    for _ in range(n_dupes):
        original = rng.randrange(len(events)) if events else 0
        dupes_after[original] = dupes_after.get(original, 0) + 1
    malformed_at = sorted(rng.randrange(max(1, len(events))) for _ in range(cfg.malformed))
    m = 0
    for index, (key, payload) in enumerate(events):
        yield key.encode(), payload
        stats.messages += 1
        for _ in range(dupes_after.get(index, 0)):
            yield key.encode(), payload
            stats.messages += 1
            stats.duplicates += 1
        while m < len(malformed_at) and malformed_at[m] == index:
            yield _malformed(MALFORMED_KINDS[m % len(MALFORMED_KINDS)], rng, m)
            stats.messages += 1
            stats.malformed += 1
            m += 1


def orders(cfg: GeneratorConfig, stats: GeneratedStats | None = None) -> tuple[Iterator[Record], GeneratedStats]:
    """Orders: order_id, user_id, amount, price, created_at."""
    rng = random.Random(cfg.seed)
    stats = stats or GeneratedStats(topic="orders")
    events: list[tuple[str, bytes]] = []
    for i in range(cfg.count):
        ts = cfg.start + cfg.spacing * i
        if rng.random() < cfg.out_of_order:
            ts -= timedelta(seconds=rng.uniform(1, cfg.max_lateness.total_seconds()))
            stats.out_of_order += 1
        order_id = f"o-{cfg.seed}-{i:09d}"
        payload = {
            "order_id": order_id,
            "user_id": f"u{rng.randrange(cfg.users):06d}",
            "amount": rng.randint(1, 10),
            "price": round(rng.uniform(1, 500), 2),
            "created_at": _iso(ts),
        }
        events.append((order_id, json.dumps(payload, separators=(",", ":")).encode()))
        stats.events.append(payload)
    stats.unique = len({k for k, _ in events})
    return _with_duplicates_and_malformed(events, cfg, rng, stats, "order_id"), stats


def user_events(
    cfg: GeneratorConfig,
    stats: GeneratedStats | None = None,
    missing_users: float = 0.05,
    second_version: float = 0.2,
    spread: timedelta = timedelta(minutes=70),
) -> tuple[Iterator[Record], GeneratedStats]:
    """User profile events: event_id, user_id, name, email, created_at.

    One event per user (a `missing_users` fraction has none), at a time within
    `spread` of the orders' start; a `second_version` fraction gets a renamed
    profile later. Orders reference the same user ids, so some orders find their
    user within a join window and some do not.
    """
    rng = random.Random(cfg.seed + 1)
    stats = stats or GeneratedStats(topic="user_events")
    events: list[tuple[str, bytes]] = []
    span = spread.total_seconds()
    n = 0
    for user in range(cfg.users):
        if rng.random() < missing_users:
            continue
        at = cfg.start + timedelta(seconds=rng.uniform(-span, span))
        versions = [at] + ([at + timedelta(minutes=rng.uniform(1, 30))] if rng.random() < second_version else [])
        for version, ts in enumerate(versions):
            payload = {
                "event_id": f"e-{cfg.seed}-{n:09d}",
                "user_id": f"u{user:06d}",
                "name": f"User {user}" + (f" v{version + 1}" if version else ""),
                "email": f"user{user}@example.com",
                "created_at": _iso(ts),
            }
            n += 1
            events.append((payload["event_id"], json.dumps(payload, separators=(",", ":")).encode()))
            stats.events.append(payload)
    rng.shuffle(events)
    stats.unique = len(events)
    dup_cfg = replace(cfg, count=len(events))
    return _with_duplicates_and_malformed(events, dup_cfg, rng, stats, "event_id"), stats


def _parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def expected_join(
    orders_stats: GeneratedStats, users_stats: GeneratedStats, window: timedelta, key: str = "user_id"
) -> dict[str, Any]:
    """Reference answer for a temporal join of the generated orders with user events.

    Plain Python over the generator's own events, independent of the pipeline: each
    distinct order matches the latest user event with the same key within `window`.
    """
    by_user: dict[str, list[tuple[datetime, str]]] = {}
    for event in users_stats.events:
        by_user.setdefault(event[key], []).append((_parse_iso(event["created_at"]), event["name"]))
    matched: dict[str, str | None] = {}
    for order in orders_stats.events:
        at = _parse_iso(order["created_at"])
        candidates = [(t, name) for t, name in by_user.get(order[key], []) if abs(t - at) <= window]
        matched[order["order_id"]] = max(candidates)[1] if candidates else None
    joined = sum(1 for v in matched.values() if v is not None)
    return {"expected_joined": joined, "expected_unmatched": len(matched) - joined, "names": matched}


def user_tiers(cfg: GeneratorConfig, stats: GeneratedStats | None = None) -> tuple[Iterator[Record], GeneratedStats]:
    """A dimension topic: user_id, tier, updated_at (one row per user, some updated)."""
    rng = random.Random(cfg.seed + 2)
    stats = stats or GeneratedStats(topic="user_tiers")
    records: list[Record] = []
    for user in range(cfg.users):
        for version in range(1 + (rng.random() < 0.1)):
            payload = {
                "user_id": f"u{user:06d}",
                "tier": rng.choice(["bronze", "silver", "gold"]),
                "updated_at": _iso(cfg.start - timedelta(days=30 - version)),
            }
            records.append((payload["user_id"].encode(), json.dumps(payload, separators=(",", ":")).encode()))
            stats.events.append(payload)
    stats.messages = len(records)
    stats.unique = cfg.users
    return iter(records), stats


GENERATORS: dict[str, Callable[..., tuple[Iterator[Record], GeneratedStats]]] = {
    "orders": orders,
    "user_events": user_events,
    "user_tiers": user_tiers,
}


def producer_config(bootstrap: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "compression.type": "lz4",  # smaller segments and fetches, as most production producers do
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 512 * 1024,
        "log_level": 3,
        **(extra or {}),
    }


def produce(
    bootstrap: str,
    topic: str,
    records: Iterator[Record],
    rate: float | None = None,
    on_progress: Callable[[int], None] | None = None,
    producer_extra: dict[str, Any] | None = None,
    partitions: int | None = None,
) -> int:
    """Produce records (optionally at `rate` messages/s); returns how many were acknowledged.

    `partitions`: use only the topic's first N partitions (a record goes to crc32(key) mod N,
    so copies of a key share one, as with Kafka's own partitioner); by default all of them.
    """
    from confluent_kafka import KafkaException, Producer

    producer = Producer(producer_config(bootstrap, producer_extra))
    route: dict[str, int] = {}
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    started = time.monotonic()
    sent = 0
    for key, value in records:
        if partitions:
            route["partition"] = zlib.crc32(key or b"") % partitions
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=delivered, **route)
                break
            except BufferError:
                producer.poll(0.05)
        sent += 1
        if sent % 1000 == 0:
            producer.poll(0)
            if on_progress:
                on_progress(1000)
            if rate:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
    remaining = producer.flush(60)
    if on_progress and sent % 1000:
        on_progress(sent % 1000)
    if remaining or errors:
        raise KafkaException(
            f"{remaining + len(errors)} of {sent} messages to topic {topic!r} were not delivered"
            + (f": {errors[0]}" if errors else "")
        )
    return sent
