"""Produce new Delta versions into a Kafka topic, exactly once, with Kafka transactions and a ledger.

For each Delta version after the ledger's (topic_ledger.py), the rows it inserted are read from
the files its commit added and cut into chunks exactly as the ClickHouse loader cuts them
(`version_chunks`: by file, then slices of `transaction_rows`). A version's chunks go into one
Kafka transaction, or into several when they hold more than `transaction_rows` rows; each
transaction also writes the ledger record saying how far the topic now holds the table. Kafka
makes the rows and the record visible together or not at all, so after a crash anywhere the
ledger (read `read_committed`) names exactly what a `read_committed` consumer of the topic has
seen, and the next run produces the rest: a transaction cut short is aborted (by the broker's
timeout, or when the next producer with the same `transactional.id` starts) and produced again.

The producer's `transactional.id` is stable per pipeline and topic (spec_sinks.transactional_id),
so a new instance fences the old one: a fenced producer stops with TopicSinkFenced.

Why the driver produces: a transaction belongs to one producer, and the version's rows and its
ledger record must share it. Executors producing in parallel would each need their own
transactional id and their own ledger entries; Kafka has no atomic commit across producers, so
a version would become visible piece by piece, and the order of a key's records across versions
would depend on task timing. The rows are read from the committed Parquet files without Spark
(as the ClickHouse loader reads them), encoded with Arrow's kernels, and batched and compressed
by librdkafka's own threads; memory is bounded by one transaction.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from riverhouse.platform.faults import crash_point
from riverhouse.platform.kafka.bootstrap import resolve_bootstrap
from riverhouse.platform.kafka.client import librdkafka_config, watermarks
from riverhouse.platform.sink.clickhouse import PARTITION_COLUMN, sink_table_path
from riverhouse.platform.sink.topic_avro import encoder_for
from riverhouse.platform.sink.topic_ledger import (
    Progress,
    TopicSinkError,
    ensure_topics,
    ledger_key,
    progress_record,
    read_progress,
    reset_record,
)
from riverhouse.platform.sink.versions import SinkColumns, is_rebuild, version_chunks
from riverhouse.platform.spec import KafkaSinkSpec, PipelineSpec
from riverhouse.platform.spec_sinks import transactional_id
from riverhouse.platform.state.checkpoints import pipeline_lock
from riverhouse.platform.state.delta_log import MARK_REBUILD, Commit, DeltaLog
from riverhouse.platform.state.settings import Settings

__all__ = ["ProduceResult", "TopicSink", "TopicSinkError", "TopicSinkFenced", "produce_topics", "reset_topic_sink"]

# Record headers: the Delta version a record comes from, and a backfill's window.
VERSION_HEADER = "riverhouse.version"
REBUILD_HEADER = "riverhouse.rebuild"
INIT_TIMEOUT_S = 60.0
COMMIT_TIMEOUT_S = 120.0
# How long a transaction may stay open. It is also how long read_committed consumers of the topic
# can be held at a crashed run's open transaction (until the next run aborts it): short, but room
# for a whole bounded transaction at a slow 5,000 rows/s.
MIN_TRANSACTION_TIMEOUT_MS = 60_000
MAX_TRANSACTION_TIMEOUT_MS = 900_000  # the broker's transaction.max.timeout.ms default
ABORTABLE_ATTEMPTS = 3
LOCK_WAIT_S = 600.0
_quiet = logging.getLogger("riverhouse.kafka.sink")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def transaction_timeout_ms(transaction_rows: int) -> int:
    return max(MIN_TRANSACTION_TIMEOUT_MS, min(MAX_TRANSACTION_TIMEOUT_MS, transaction_rows // 5))


class TopicSinkFenced(TopicSinkError):
    """Another producer with this sink's transactional.id started: this one must stop."""


@dataclass
class ProduceResult:
    """What one pass of a Kafka sink produced, and where it started (for the topic's check)."""

    topic: str
    versions_produced: list[int] = field(default_factory=list)
    rows: int = 0
    transactions: int = 0
    rows_per_version: dict[int, int] = field(default_factory=dict)
    # The version this pass began with, and its rows already in the topic before it (a version
    # a crashed run had produced in part).
    first_version: int | None = None
    rows_before: int = 0
    start_offsets: dict[int, int] = field(default_factory=dict)  # partition -> end offset before this pass
    last_version: int | None = None  # the newest version the topic holds completely
    delta_version: int | None = None
    table_id: str = ""
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "versions_produced": len(self.versions_produced),
            "rows_produced": self.rows,
            "transactions": self.transactions,
            "last_version": self.last_version,
            "delta_version": self.delta_version,
            "seconds": round(self.seconds, 3),
        }


class TopicSink:
    """One Kafka sink of a pipeline: its transactional producer, held open across passes (continuous mode).

    Use as a context manager, or call `close()`. Not thread-safe: one thread produces.
    """

    def __init__(self, spec: PipelineSpec, sink: KafkaSinkSpec, settings: Settings, log: Callable[[str], None] = print):
        self.spec = spec
        self.sink = sink
        self.settings = settings
        self.log = log
        self.transactional_id = transactional_id(spec.name, sink)
        self.columns = SinkColumns.of(spec)
        key = sink.key if sink.key is not None else ([] if spec.is_join else list(spec.sink_source.key))
        self.encoder = encoder_for(sink, spec.name, self.columns.columns, key)
        self._config: dict[str, Any] | None = None
        self._producer: Any = None
        self._reasons: list[str] = []
        # The ledger's newest record for the pipeline, once read: after that, only this producer
        # (which fenced every other) writes it.
        self._progress: Progress | None = None
        self._progress_known = False

    # ------------------------------------------------------------------ lifecycle
    @property
    def config(self) -> dict[str, Any]:
        """librdkafka settings of the pipeline's Kafka (resolved secrets: never log them)."""
        if self._config is None:
            self._config = librdkafka_config(self.spec.kafka, resolve_bootstrap(self.spec, self.settings))
            self._config["logger"] = _quiet  # errors reach the user once, in the error raised
        return self._config

    def open(self) -> None:
        """Create the topics if missing, start the producer and fence any previous instance."""
        if self._producer is not None:
            return
        from confluent_kafka import KafkaException, Producer

        ensure_topics(self.config, self.sink, self.log)
        producer = Producer(
            {
                **self.config,
                "transactional.id": self.transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                # Java's partitioner: a key lands where Kafka Streams, Spark or a Java producer puts it.
                "partitioner": "murmur2_random",
                "compression.type": self.sink.compression,
                "linger.ms": 20,
                # A whole transaction fits in the local queue; failures are reported by the commit.
                "queue.buffering.max.messages": min(2_000_000, 2 * self.sink.transaction_rows + 10_000),
                "delivery.report.only.error": True,
                "transaction.timeout.ms": transaction_timeout_ms(self.sink.transaction_rows),
                "error_cb": lambda err: self._reasons.append(err.str()),
            }
        )
        try:
            # Completes or aborts the transaction a previous instance left open, and fences it.
            producer.init_transactions(INIT_TIMEOUT_S)
        except KafkaException as exc:
            raise TopicSinkError(
                f"cannot start transactions on Kafka at {self.config['bootstrap.servers']} for topic "
                f"{self.sink.topic!r} (transactional.id {self.transactional_id}): {self._reason(exc)}. A broker "
                "with fewer than 3 nodes needs transaction.state.log.replication.factor and "
                "transaction.state.log.min.isr at most its node count"
            ) from None
        self._producer = producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
            self._progress_known = False

    def __enter__(self) -> TopicSink:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ producing
    def produce_new_versions(self) -> ProduceResult:
        """Produce every Delta version the ledger does not hold yet; one sink pass at a time per topic."""
        lock = f"topic.{self.sink.topic}.lock"
        with pipeline_lock(
            Path(self.settings.checkpoints) / self.spec.name, self.spec.name, LOCK_WAIT_S, lock, self.log
        ):
            self.open()
            try:
                return self._produce()
            except BaseException:
                self._progress_known = False  # what is committed is the ledger's to say
                raise

    def _produce(self) -> ProduceResult:
        started = time.monotonic()
        result = ProduceResult(topic=self.sink.topic)
        path = sink_table_path(self.spec, self.settings.warehouse)
        delta = DeltaLog(path)
        current = delta.latest_version()
        if current is None:
            raise TopicSinkError(f"Delta table {path} does not exist yet: run the pipeline first")
        table_id = delta.table_id()
        result.delta_version, result.table_id = current, table_id
        if not self._progress_known:
            self._progress = read_progress(self.config, self.sink.ledger, self.spec.name)
            self._progress_known = True
        progress = self._progress
        self._refuse_other_table(progress, table_id)
        version, chunk, chunk_rows, rows_before = progress.resume(table_id) if progress else (0, 0, None, 0)
        result.first_version, result.rows_before = version, rows_before
        result.last_version = version - 1 if version > 0 else None
        result.start_offsets = {
            p: high for p, (_, high) in watermarks(self.config, [self.sink.topic])[self.sink.topic].items()
        }
        recorded = version - 1  # the newest version the ledger holds completely
        while version <= current:
            commit = delta.commit(version)
            size = chunk_rows or self.sink.transaction_rows
            produced = self._produce_version(delta, commit, table_id, chunk, size, rows_before, result)
            if produced:
                recorded = version
            result.last_version = version
            version, chunk, chunk_rows, rows_before = version + 1, 0, None, 0
        if recorded < current:
            # The newest versions had no rows for the topic: say in the ledger that they are done.
            self._transaction([], Progress(table_id, current, True, 0, 0, self.sink.transaction_rows), current, None)
            result.transactions += 1
        result.seconds = time.monotonic() - started
        return result

    def _produce_version(
        self,
        delta: DeltaLog,
        commit: Commit,
        table_id: str,
        first_chunk: int,
        size: int,
        rows_before: int,
        result: ProduceResult,
    ) -> bool:
        """Produce a version's chunks from `first_chunk` on, in transactions of at most `transaction_rows` rows.

        Returns whether a transaction recorded the version as complete in the ledger.
        """
        version = commit.version
        rebuild = str(commit.user_metadata[MARK_REBUILD]) if is_rebuild(commit) else None
        limit = self.sink.transaction_rows
        pending: list[pa.Table] = []
        pending_rows, in_topic, chunks, partial = 0, rows_before, 0, False
        for index, (_, rows) in enumerate(version_chunks(delta, commit, self.columns, size)):
            chunks = index + 1
            if index < first_chunk:
                continue  # in the topic already (a version a crashed run had produced in part)
            rows = rows.drop_columns([PARTITION_COLUMN])
            if pending and pending_rows + rows.num_rows > limit:
                in_topic += pending_rows
                self._transaction(pending, Progress(table_id, version, False, index, in_topic, size), version, rebuild)
                self._count(result, version, pending_rows)
                pending, pending_rows, partial = [], 0, True
            if rows.num_rows:
                pending.append(rows)
                pending_rows += rows.num_rows
        if not pending and not partial:
            return False  # no rows for the topic: the next record in the ledger covers this version
        in_topic += pending_rows
        self._transaction(pending, Progress(table_id, version, True, chunks, in_topic, size), version, rebuild)
        self._count(result, version, pending_rows)
        if rebuild is not None:
            self.log(f"topic {self.sink.topic}: re-emitted backfill {rebuild} as Delta version {version}")
        return True

    def _count(self, result: ProduceResult, version: int, rows: int) -> None:
        result.transactions += 1
        result.rows += rows
        result.rows_per_version[version] = result.rows_per_version.get(version, 0) + rows
        if version not in result.versions_produced:
            result.versions_produced.append(version)

    def _transaction(self, chunks: list[pa.Table], progress: Progress, version: int, rebuild: str | None) -> None:
        """Rows and the ledger record in one Kafka transaction; an abortable failure is retried whole."""
        from confluent_kafka import KafkaException

        headers = [(VERSION_HEADER, str(version).encode())]
        if rebuild is not None:
            headers.append((REBUILD_HEADER, rebuild.encode()))
        record = progress_record(self.spec.name, self.sink.topic, progress)
        for rows in chunks:
            self.encoder.prepare(rows)  # an Avro schema registered before the transaction begins
        for attempt in range(1, ABORTABLE_ATTEMPTS + 1):
            crash_point("before_topic_transaction")
            try:
                self._producer.begin_transaction()
                for rows in chunks:
                    self._send(rows, headers)
                self._producer.produce(self.sink.ledger, key=ledger_key(self.spec.name), value=record)
                self._producer.flush(COMMIT_TIMEOUT_S)
                crash_point("during_topic_transaction")  # the rows are at the broker, not committed
                self._commit()
                self._progress = progress
                crash_point("after_topic_commit")
                return
            except KafkaException as exc:
                error = exc.args[0]
                if self._fenced(error):
                    raise TopicSinkFenced(
                        f"topic {self.sink.topic!r}: another instance of pipeline {self.spec.name!r} started "
                        f"producing with transactional.id {self.transactional_id}, so Kafka fenced this one. Nothing "
                        "this run had not committed is visible to read_committed consumers; the newer instance "
                        "goes on from the ledger. Run one instance of a pipeline at a time"
                    ) from None
                if not error.txn_requires_abort() or attempt == ABORTABLE_ATTEMPTS:
                    self._abort_quietly()  # consumers need not wait for the transaction's timeout
                    raise TopicSinkError(
                        f"producing Delta version {version} to topic {self.sink.topic!r} failed: {self._reason(exc)}"
                    ) from None
                self.log(
                    f"topic {self.sink.topic}: transaction of Delta version {version} aborted "
                    f"({self._reason(exc)}), producing it again ({attempt}/{ABORTABLE_ATTEMPTS - 1})"
                )
                self._producer.abort_transaction(COMMIT_TIMEOUT_S)
            except Exception:  # not Kafka's (an encoding error): read_committed consumers need not wait
                self._abort_quietly()
                raise

    def _send(self, rows: pa.Table, headers: list[tuple[str, bytes]]) -> None:
        # The per-record call is the sink's hot loop (~1 µs of Python each): kept bare.
        producer, topic = self._producer, self.sink.topic
        produce = producer.produce
        for key, value in zip(self.encoder.keys(rows), self.encoder.values(rows), strict=True):
            try:
                produce(topic, value, key, headers=headers)
            except BufferError:  # the local queue is full: let librdkafka deliver some, then go on
                while True:
                    producer.poll(0.05)
                    try:
                        produce(topic, value, key, headers=headers)
                        break
                    except BufferError:
                        continue
        producer.poll(0)  # serve delivery reports: the queue of events stays small

    def _abort_quietly(self) -> None:
        from confluent_kafka import KafkaException

        with contextlib.suppress(KafkaException):
            self._producer.abort_transaction(10)

    def _commit(self) -> None:
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while True:
            try:
                self._producer.commit_transaction(COMMIT_TIMEOUT_S)
                return
            except KafkaException as exc:
                # A retriable commit error (a timeout, a coordinator moving) may be retried as is.
                if not exc.args[0].retriable() or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _fenced(self, error: Any) -> bool:
        """Fenced, directly or as the fatal error behind a later call's "Local: Fatal error"."""
        from confluent_kafka import KafkaError, KafkaException

        fenced = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
        if error.code() in fenced:
            return True
        if error.code() != KafkaError._FATAL:
            return False
        # librdkafka's own thread may learn of the fence first (a partition added to the transaction);
        # produce() then says only "fatal". A transactional call returns the fatal error itself.
        try:
            self._producer.abort_transaction(1)
        except KafkaException as exc:
            return exc.args[0].code() in fenced
        return False

    def _reason(self, exc: Exception) -> str:
        text = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        return text if not self._reasons or self._reasons[-1] in text else f"{text} ({self._reasons[-1]})"

    def _refuse_other_table(self, progress: Progress | None, table_id: str) -> None:
        if progress is None or progress.reset or progress.table_id == table_id:
            return
        raise TopicSinkError(
            f"topic {self.sink.topic!r} holds rows of another Delta table of pipeline {self.spec.name!r} (up to "
            f"its version {progress.version}): the table was re-created. Producing this one would send its rows "
            f"again. `riverhouse reset {self.spec.name}` records in the ledger {self.sink.ledger!r} that the "
            "pipeline starts over (the topic keeps its records; consumers then see the rows again)"
        )

    def reset(self) -> bool:
        """Record in the ledger that the pipeline starts over; False when the ledger holds nothing of it."""
        lock = f"topic.{self.sink.topic}.lock"
        with pipeline_lock(Path(self.settings.checkpoints) / self.spec.name, self.spec.name, 0.0, lock):
            progress = read_progress(self.config, self.sink.ledger, self.spec.name)
            if progress is None or progress.reset:
                return False
            self.open()  # fences any producer of this sink still running elsewhere
            self._producer.begin_transaction()
            record = reset_record(self.spec.name, self.sink.topic)
            self._producer.produce(self.sink.ledger, key=ledger_key(self.spec.name), value=record)
            self._commit()
            return True


def reset_topic_sink(spec: PipelineSpec, sink: KafkaSinkSpec, settings: Settings, log: Callable[[str], None]) -> bool:
    """`riverhouse reset`'s part in a Kafka sink: the ledger says the pipeline starts over; the topic keeps its rows."""
    topic_sink = TopicSink(spec, sink, settings, log)
    try:
        return topic_sink.reset()
    finally:
        topic_sink.close()


def produce_topics(
    spec: PipelineSpec,
    settings: Settings,
    log: Callable[[str], None] = print,
    sinks: dict[str, TopicSink] | None = None,
    topic: str | None = None,
) -> list[ProduceResult]:
    """Produce new Delta versions into every Kafka sink of the pipeline (or only `topic`'s).

    `sinks`: open sinks to reuse, by topic (continuous mode keeps its producers); by default
    each is opened for this pass and closed after it.
    """
    results = []
    for sink_spec in spec.topic_sinks:
        if topic is not None and sink_spec.topic != topic:
            continue
        if sinks is not None and sink_spec.topic in sinks:
            results.append(sinks[sink_spec.topic].produce_new_versions())
            continue
        with TopicSink(spec, sink_spec, settings, log) as sink:
            results.append(sink.produce_new_versions())
    return results
