"""A Kafka sink's ledger: a compacted topic saying how far the sink topic holds the Delta table.

Every transaction of the sink writes, beside its rows, one ledger record keyed by the pipeline's
name: the Delta table id, the version, and whether the version is complete or, for a version
larger than one transaction, how many of its chunks are in. Kafka commits the rows and the
record together or neither, so what a `read_committed` consumer of the ledger sees is exactly
what a `read_committed` consumer of the sink topic sees. Compaction keeps the newest record
per key: reading the ledger from its start is reading one record per pipeline plus what
compaction has not reached yet.

A `riverhouse reset` writes a record that says "start over" (`reset: true`): the sink topic keeps
its records, and the next run produces the new tables' rows from their first version.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from riverhouse.platform.kafka.client import METADATA_TIMEOUT_S, KafkaSourceError, collecting_consumer, topic_metadata
from riverhouse.platform.spec_sinks import KafkaSinkSpec

LEDGER_FORMAT = 1
# How long a ledger read may take before it is an error: a ledger is small (compacted).
READ_TIMEOUT_S = 60.0


class TopicSinkError(RuntimeError):
    """A Kafka sink cannot go on; the message says what and what to do."""


@dataclass(frozen=True)
class Progress:
    """Where a sink topic stands, from its ledger's newest record for the pipeline."""

    table_id: str
    version: int  # the newest Delta version with rows in the topic
    complete: bool  # every chunk of `version` is in
    chunks: int  # chunks of `version` in the topic
    rows: int  # rows of `version` in the topic
    chunk_rows: int  # the slice size `version`'s chunks were cut with
    reset: bool = False

    def resume(self, table_id: str) -> tuple[int, int, int | None, int]:
        """(next version, its first chunk to produce, its slice size or None for the sink's, rows already in)."""
        if self.reset or self.table_id != table_id:
            return 0, 0, None, 0
        if self.complete:
            return self.version + 1, 0, None, 0
        return self.version, self.chunks, self.chunk_rows, self.rows


def ledger_key(pipeline: str) -> bytes:
    return pipeline.encode()


def progress_record(pipeline: str, topic: str, progress: Progress) -> bytes:
    record = {"format": LEDGER_FORMAT, "pipeline": pipeline, "topic": topic, "at": time.time(), **asdict(progress)}
    return json.dumps(record, sort_keys=True).encode()


def reset_record(pipeline: str, topic: str) -> bytes:
    return progress_record(pipeline, topic, Progress("", -1, True, 0, 0, 0, reset=True))


def parse_record(value: bytes | None) -> Progress | None:
    """A ledger record's progress; None for a tombstone (the key deleted). Raises ValueError for anything else."""
    if value is None:
        return None
    try:
        data = json.loads(value)
        return Progress(
            table_id=str(data["table_id"]),
            version=int(data["version"]),
            complete=bool(data["complete"]),
            chunks=int(data["chunks"]),
            rows=int(data["rows"]),
            chunk_rows=int(data["chunk_rows"]),
            reset=bool(data.get("reset", False)),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a Riverhouse ledger record ({type(exc).__name__}: {exc})") from None


def read_progress(config: dict[str, Any], ledger: str, pipeline: str) -> Progress | None:
    """The pipeline's newest committed ledger record (isolation.level=read_committed); None if it has none.

    Read after the producer's `init_transactions`, which completes or aborts whatever transaction
    a previous instance left open: the ledger's last stable offset is then its end.
    """
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    reasons: list[str] = []
    # Partitions are assigned, never committed.
    consumer = collecting_consumer(
        config, "riverhouse-ledger", reasons, **{"isolation.level": "read_committed", "enable.partition.eof": True}
    )
    key = ledger_key(pipeline)
    try:
        try:
            metadata = topic_metadata(consumer, reasons, config, ledger, f"to read the ledger {ledger!r}")
        except KafkaSourceError as exc:
            raise TopicSinkError(str(exc)) from None
        info = metadata.topics.get(ledger)
        if info is None or info.error is not None or not info.partitions:
            return None
        partitions = sorted(info.partitions)
        consumer.assign([TopicPartition(ledger, p, OFFSET_BEGINNING) for p in partitions])
        found: Progress | None = None
        done: set[int] = set()
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(done) < len(partitions):
            if time.monotonic() > deadline:
                raise TopicSinkError(
                    f"reading the ledger {ledger!r} took longer than {READ_TIMEOUT_S:.0f}s "
                    f"({reasons[-1] if reasons else 'no error reported'}): is Kafka reachable?"
                )
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    done.add(message.partition())
                    continue
                raise TopicSinkError(f"reading the ledger {ledger!r}: {message.error().str()}")
            if message.key() == key:
                try:
                    found = parse_record(message.value())
                except ValueError as exc:
                    raise TopicSinkError(
                        f"the ledger {ledger!r} holds a record for pipeline {pipeline!r} at offset {message.offset()} "
                        f"that Riverhouse did not write: {exc}. Only Riverhouse writes its ledger; `riverhouse reset "
                        f"{pipeline}` starts the pipeline over"
                    ) from None
        return found
    finally:
        consumer.close()


def ensure_topics(config: dict[str, Any], sink: KafkaSinkSpec, log: Callable[[str], None]) -> None:
    """Create the sink topic (its `partitions`, or the broker's default) and the compacted ledger if missing."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(config)
    try:
        existing = set(admin.list_topics(timeout=METADATA_TIMEOUT_S).topics)
    except KafkaException as exc:
        raise KafkaSourceError(
            f"cannot reach Kafka at {config['bootstrap.servers']} to prepare topic {sink.topic!r}: {exc.args[0].str()}"
        ) from None
    wanted = []
    if sink.topic not in existing:
        wanted.append(NewTopic(sink.topic, num_partitions=sink.partitions or -1, replication_factor=-1))
    if sink.ledger not in existing:
        # One partition: the ledger is read whole at every start, and compaction keeps it small.
        wanted.append(
            NewTopic(sink.ledger, num_partitions=1, replication_factor=-1, config={"cleanup.policy": "compact"})
        )
    if not wanted:
        return
    for name, future in admin.create_topics(wanted, request_timeout=METADATA_TIMEOUT_S).items():
        try:
            future.result(timeout=METADATA_TIMEOUT_S * 2)
            log(f"created Kafka topic {name}" + (" (compacted: the sink's ledger)" if name == sink.ledger else ""))
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise TopicSinkError(
                f"cannot create Kafka topic {name!r}: {error.str()}. Create it (the ledger "
                f"{sink.ledger!r} with cleanup.policy=compact) or grant the pipeline's principal CREATE on it"
            ) from None
