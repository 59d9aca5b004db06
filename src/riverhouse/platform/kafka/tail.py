"""Read a topic back as a consumer of a Kafka sink does: `isolation.level=read_committed`.

`riverhouse kafka tail TOPIC` prints what it reads, and a Kafka sink's check counts the rows each
Delta version put in the topic. Records of aborted transactions and transaction markers are
never returned (Kafka filters them for read_committed consumers); reading stops at each
partition's last stable offset unless asked to follow. Nothing is committed to a consumer group.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from riverhouse.platform.kafka.client import KafkaSourceError, collecting_consumer, topic_metadata

# Where reading starts: every partition's first offset, or its end (then only --follow reads anything).
BEGINNING = "beginning"
END = "end"


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int


def read_committed(
    config: dict[str, Any],
    topic: str,
    start: dict[int, int] | str = BEGINNING,
    follow: bool = False,
    idle_timeout_s: float = 60.0,
) -> Iterator[Record]:
    """The committed records of `topic` from `start` (per partition offsets, BEGINNING or END).

    Without `follow`, stops once every partition reached its end; raises KafkaSourceError when no
    progress is made for `idle_timeout_s` (an unreachable broker).
    """
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, TopicPartition

    reasons: list[str] = []
    # Partitions are assigned, never committed.
    consumer = collecting_consumer(
        config, "riverhouse-tail", reasons, **{"isolation.level": "read_committed", "enable.partition.eof": True}
    )
    try:
        metadata = topic_metadata(consumer, reasons, config, topic, f"to read topic {topic!r}")
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise KafkaSourceError(f"topic {topic!r} does not exist at {config['bootstrap.servers']}")
        partitions = sorted(info.partitions)

        def first(partition: int) -> int:
            if isinstance(start, dict):
                return start.get(partition, OFFSET_BEGINNING)
            return OFFSET_BEGINNING if start == BEGINNING else OFFSET_END

        consumer.assign([TopicPartition(topic, p, first(p)) for p in partitions])
        at_end: set[int] = set()
        quiet_since = time.monotonic()
        while follow or len(at_end) < len(partitions):
            message = consumer.poll(0.5)
            if message is None:
                if not follow and time.monotonic() - quiet_since > idle_timeout_s:
                    raise KafkaSourceError(
                        f"reading topic {topic!r} made no progress for {idle_timeout_s:.0f}s"
                        + (f": {reasons[-1]}" if reasons else "")
                    )
                continue
            quiet_since = time.monotonic()
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                raise KafkaSourceError(f"reading topic {topic!r}: {error.str()}")
            at_end.discard(message.partition())
            yield Record(
                partition=message.partition(),
                offset=message.offset(),
                key=message.key(),
                value=message.value(),
                headers={k: v for k, v in (message.headers() or [])},
                timestamp_ms=message.timestamp()[1],
            )
    finally:
        consumer.close()


def count_by_header(records: Iterator[Record], header: str) -> dict[str, int]:
    """Records per value of `header` ('' for records without it)."""
    counts: dict[str, int] = {}
    for record in records:
        value = record.headers.get(header)
        name = value.decode(errors="replace") if value is not None else ""
        counts[name] = counts.get(name, 0) + 1
    return counts
