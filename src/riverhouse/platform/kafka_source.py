"""Kafka as a Spark 4 Python Data Source (`format("riverhouse_kafka")`).

Spark's own Kafka source ships only through Maven; this one is pure Python on
confluent-kafka (librdkafka) and runs on any Spark 4 cluster with no extra jars.

Offsets are `{topic: {partition: next_offset}}` and live in Spark's checkpoint,
which is the only source of truth for progress: no consumer-group commits are
needed for correctness. Each micro-batch plans one input partition per
(topic, partition, [start, end)); executors `assign()` at `start` and read up
to `end`, so replaying a batch reads exactly the same records.

Options:
  bootstrap.servers     required
  subscribe             comma-separated topics
  startingOffsets       earliest (default) | latest
  maxOffsetsPerTrigger  admission control: at most this many records per micro-batch
  failOnDataLoss        true (default): fail when planned offsets were deleted by retention
  kafka.<setting>       passed to librdkafka (SASL/SSL...); `${env:NAME}` is resolved
                        where the client is created, so secrets stay out of Spark plans.
  parse.fields          JSON [[name, type], ...]: also parse each value with Arrow's JSON
                        reader into a `_parsed` struct column (see arrow_parse.py)
  parse.maxMessageBytes values larger than this are left to the JVM parse
  spool.dir             local mode only, with parse.fields and validate.rules: records that
  validate.rules        pass every check are finished here and written to an Arrow file in
                        spool.dir; Spark gets one marker row per file (`_spool` column, see
                        arrow_validate.py) and the rest of the records as before
"""

from __future__ import annotations

import bisect
import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

FORMAT_NAME = "riverhouse_kafka"
KAFKA_SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
)
ARROW_BATCH_ROWS = 20_000
CONSUME_BATCH = 10_000
METADATA_TIMEOUT_S = 15.0
STALL_TIMEOUT_S = 60.0

Offsets = dict[str, dict[str, int]]


class KafkaSourceError(RuntimeError):
    pass


def _client_config(options: dict[str, str]) -> dict[str, Any]:
    from riverhouse.platform.envrefs import resolve_env_refs

    bootstrap = options.get("bootstrap.servers")
    if not bootstrap:
        raise KafkaSourceError("the riverhouse_kafka source needs option bootstrap.servers")
    # librdkafka's own log would repeat a down broker many times a second on stderr; its
    # errors reach the user once, through error_cb, in the message of the error raised.
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": 0}
    for key, value in options.items():
        if key.startswith("kafka."):
            config[key[len("kafka.") :]] = resolve_env_refs(value, key)
    return config


def _topics(options: dict[str, str]) -> list[str]:
    topics = [t.strip() for t in options.get("subscribe", "").split(",") if t.strip()]
    if not topics:
        raise KafkaSourceError("the riverhouse_kafka source needs option subscribe=<topic>[,<topic>...]")
    return topics


def _parse_fields(options: dict[str, str]) -> list[tuple[str, str]] | None:
    from riverhouse.platform.arrow_parse import decode_fields

    text = options.get("parse.fields")
    return decode_fields(text) if text else None


def _arrow_schema(parse_fields: list[tuple[str, str]] | None = None, spool: bool = False) -> Any:
    import pyarrow as pa

    from riverhouse.platform.arrow_parse import PARSED_COLUMN, struct_type
    from riverhouse.platform.arrow_validate import SPOOL_COLUMN

    extra = [(PARSED_COLUMN, struct_type(parse_fields))] if parse_fields else []
    if spool and parse_fields:
        extra.append((SPOOL_COLUMN, pa.string()))
    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
            (
                "headers",
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
            *extra,
        ]
    )


@dataclass
class KafkaInputPartition(InputPartition):
    topic: str
    partition: int
    start: int
    end: int


def watermarks(config: dict[str, Any], topics: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
    """(low, high) offsets of every partition of the topics; a missing topic has none."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    # librdkafka reports why a broker cannot be used (authentication, TLS) only to error_cb;
    # the metadata call itself just times out with "transport failure".
    reasons: list[str] = []
    consumer = Consumer(
        {
            **config,
            "group.id": f"riverhouse-meta-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "error_cb": lambda err: reasons.append(err.str()),
        }
    )
    try:
        out: dict[str, dict[int, tuple[int, int]]] = {}
        for topic in topics:
            try:
                metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
            except KafkaException as exc:
                consumer.poll(0.2)  # serves error_cb: the reason, if librdkafka knows one
                raise KafkaSourceError(
                    f"cannot reach Kafka at {config['bootstrap.servers']} to list topic {topic!r}: "
                    f"{_best_reason(reasons) or exc.args[0].str()}"
                ) from None
            info = metadata.topics.get(topic)
            if info is None or info.error is not None or not info.partitions:
                out[topic] = {}
                continue
            try:
                out[topic] = {p: _watermark(consumer, TopicPartition(topic, p)) for p in sorted(info.partitions)}
            except KafkaException as exc:  # the broker went away between the two calls
                consumer.poll(0.2)
                raise KafkaSourceError(
                    f"cannot reach Kafka at {config['bootstrap.servers']} to read the offsets of topic {topic!r}: "
                    f"{_best_reason(reasons) or exc.args[0].str()}"
                ) from None
        return out
    finally:
        consumer.close()


def _watermark(consumer: Any, partition: Any) -> tuple[int, int]:
    """(low, high) of one partition, retrying what Kafka says is transient (a leader being elected)."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + METADATA_TIMEOUT_S
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            if not exc.args[0].retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _best_reason(reasons: list[str]) -> str:
    """The error that explains a failed connection: authentication or TLS first, then the latest."""
    for word in ("SASL", "uthentication", "SSL", "certificate"):
        for reason in reversed(reasons):
            if word in reason:
                return reason
    return reasons[-1] if reasons else ""


def lost_offsets(start: Offsets, low: Offsets, high: Offsets) -> list[str]:
    """What Kafka no longer holds of what the checkpoint says comes next, one line per partition.

    Records deleted by retention (the next offset is below the low watermark), partitions that
    disappeared and offsets that went backwards (the topic was deleted or recreated).
    """
    lost = []
    for topic, parts in sorted(start.items()):
        for partition, offset in sorted(parts.items(), key=lambda kv: int(kv[0])):
            name = f"{topic}[{partition}]"
            if partition not in high.get(topic, {}):
                lost.append(f"{name}: the partition no longer exists (the topic was deleted or recreated with fewer)")
            elif offset > high[topic][partition]:
                lost.append(
                    f"{name}: Kafka's offsets end at {high[topic][partition]}, before the next offset to read "
                    f"({offset}): the topic was deleted and recreated"
                )
            elif offset < low[topic][partition]:
                lost.append(
                    f"{name}: offsets {offset}..{low[topic][partition] - 1} "
                    f"({low[topic][partition] - offset} records) were deleted by retention before they were read"
                )
    return lost


def bound_offsets(start: Offsets, latest: Offsets, max_rows: int | None) -> Offsets:
    """End offsets for the next batch: all of `latest`, or at most `max_rows` records.

    The budget is shared across partitions in proportion to their backlog, and every
    partition with a backlog advances by at least one record so none starves.
    """
    backlog = {
        (t, p): max(0, end - start.get(t, {}).get(p, end)) for t, parts in latest.items() for p, end in parts.items()
    }
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        return {t: dict(parts) for t, parts in latest.items()}
    out: Offsets = {t: dict(start.get(t, {})) for t in latest}
    for (t, p), pending in sorted(backlog.items()):
        base = start.get(t, {}).get(p, latest[t][p])
        take = min(pending, max(1, (max_rows * pending) // total)) if pending else 0
        out[t][p] = base + take
    return out


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]):
        # Spark hands options over case-insensitively (lower-cased keys).
        self.options = {str(k).lower(): str(v) for k, v in options.items()}
        self.topics = _topics(self.options)
        self.starting = self.options.get("startingoffsets", "earliest").lower()
        if self.starting not in ("earliest", "latest"):
            raise KafkaSourceError(f"startingOffsets must be earliest or latest, got {self.starting!r}")
        max_rows = self.options.get("maxoffsetspertrigger")
        self.max_rows = int(max_rows) if max_rows else None
        self.fail_on_data_loss = self.options.get("failondataloss", "true").lower() != "false"
        self._available_now_target: Offsets | None = None
        self._last_high: Offsets | None = None  # from the latest latestOffset() call
        self._skipped_from: Offsets = {}  # where reading resumed after skipped data loss

    # -- planning (driver side) -------------------------------------------------
    def _current(self) -> tuple[Offsets, Offsets]:
        marks = watermarks(_client_config(self.options), self.topics)
        low = {t: {str(p): lo for p, (lo, _) in parts.items()} for t, parts in marks.items()}
        high = {t: {str(p): hi for p, (_, hi) in parts.items()} for t, parts in marks.items()}
        return low, high

    def initialOffset(self) -> dict:
        low, high = self._current()
        return low if self.starting == "earliest" else high

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._current()[1]

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        low, high = self._current()
        self._last_high = high
        latest = self._available_now_target or high
        start = self._after_data_loss(start, low, high)
        # Partitions that appeared since the query started are read from their beginning.
        start_full: Offsets = {t: dict(start.get(t, {})) for t in latest}
        for t, parts in latest.items():
            for p in parts:
                start_full[t].setdefault(p, low.get(t, {}).get(p, 0))
        # Spark 4.3 passes ReadAllAvailable to Python sources under availableNow; bounded
        # batches are what keep the driver's memory flat, so the option still applies
        # (as it does for Spark's own Kafka source).
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_rows
        end = bound_offsets(start_full, latest, max_rows)
        # Never move backwards (a target taken before a partition grew).
        for t, parts in end.items():
            for p, off in parts.items():
                parts[p] = max(off, start_full[t].get(p, off))
        return end

    def _after_data_loss(self, start: Offsets, low: Offsets, high: Offsets) -> Offsets:
        """`start`, or a KafkaSourceError naming what Kafka lost (failOnDataLoss=true, the default).

        With failOnDataLoss=false the lost records are skipped: reading goes on from the low
        watermark, and how many were skipped is printed (on the driver's stderr).
        """
        lost = lost_offsets(start, low, high)
        if not lost:
            return start
        if self.fail_on_data_loss:
            raise KafkaSourceError(
                "records the pipeline has not read are no longer in Kafka: "
                + "; ".join(lost)
                + ". Nothing was written for them. To skip what was lost and go on, set "
                "kafka.fail_on_data_loss: false in the spec and run again."
            )
        print("riverhouse: skipping records lost in Kafka (fail_on_data_loss is false): " + "; ".join(lost),
              file=sys.stderr, flush=True)  # fmt: skip
        moved: Offsets = {}
        for topic, parts in start.items():
            moved[topic] = {}
            for partition, offset in parts.items():
                if partition not in high.get(topic, {}):
                    continue
                gone = offset < low[topic][partition] or offset > high[topic][partition]
                moved[topic][partition] = low[topic][partition] if gone else offset
        self._skipped_from = moved
        return moved

    def reportLatestOffset(self) -> dict | None:
        # Spark asks right after latestOffset(); reuse its watermarks instead of a new consumer.
        return self._last_high if self._last_high is not None else self._current()[1]

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        out: list[InputPartition] = []
        # After skipped data loss (failOnDataLoss=false), the batch starts where reading resumed.
        start = {t: {**parts, **self._skipped_from.get(t, {})} for t, parts in start.items()}
        for topic in sorted(end):
            for p, stop in sorted(end[topic].items(), key=lambda kv: int(kv[0])):
                begin = start.get(topic, {}).get(p)
                if begin is None:
                    begin = 0  # new partition: its low watermark is checked while reading
                if stop > begin:
                    out.append(KafkaInputPartition(topic, int(p), int(begin), int(stop)))
        return out

    def commit(self, end: dict) -> None:
        # Progress is in Spark's checkpoint; nothing to commit to Kafka.
        return None

    # -- reading (executor side) --------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaInputPartition)
        yield from read_partition(self.options, partition, self.fail_on_data_loss)


def read_partition(options: dict[str, str], part: KafkaInputPartition, fail_on_data_loss: bool) -> Iterator[Any]:
    """Records [start, end) of one partition as Arrow batches of about ARROW_BATCH_ROWS rows.

    Per record, Python only fetches librdkafka's fields (one list comprehension each);
    the columns are built with Arrow and numpy, and the JSON is parsed with Arrow.
    """
    from confluent_kafka import Consumer, TopicPartition

    from riverhouse.platform.arrow_parse import ArrowJsonParser
    from riverhouse.platform.arrow_validate import SpoolWriter

    config = _client_config(options)
    reasons: list[str] = []
    consumer = Consumer(
        {
            **config,
            "error_cb": lambda err: reasons.append(err.str()),
            "group.id": f"riverhouse-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error" if fail_on_data_loss else "earliest",
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "queued.max.messages.kbytes": 256 * 1024,
            "queued.min.messages": 1_000_000,
        }
    )
    parse_fields = _parse_fields(options)
    fast = _fast_path(options, parse_fields)
    schema = _arrow_schema(parse_fields)
    parser = (
        ArrowJsonParser(parse_fields, int(options.get("parse.maxmessagebytes", "1000000"))) if parse_fields else None
    )
    spool = SpoolWriter(options["spool.dir"], fast.schema) if fast is not None else None
    try:
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        pending: list[Any] = []  # records of the next Arrow batch
        last_progress = time.monotonic()
        next_offset = part.start
        while next_offset < part.end:
            # Ask for no more than the planned range holds: consume() waits for the full
            # count (or the timeout), so asking for more stalls every small batch.
            wanted = max(1, min(CONSUME_BATCH, part.end - next_offset))
            messages = consumer.consume(num_messages=wanted, timeout=1.0)
            if not messages:
                if time.monotonic() - last_progress > STALL_TIMEOUT_S:
                    raise KafkaSourceError(
                        f"no progress reading {part.topic}[{part.partition}] at offset {next_offset} "
                        f"(planned up to {part.end}) for {STALL_TIMEOUT_S:.0f}s"
                        + (f": {_best_reason(reasons)}" if reasons else "")
                    )
                continue
            records, next_offset = _in_range(messages, part, next_offset)
            if records:
                pending.extend(records)
                last_progress = time.monotonic()
            if len(pending) >= ARROW_BATCH_ROWS:
                yield from _finish(_record_batch(pending, part, schema, parser), fast, spool)
                pending = []
        if pending:
            yield from _finish(_record_batch(pending, part, schema, parser), fast, spool)
        if spool is not None and (path := spool.close()) is not None:
            yield _marker(_arrow_schema(parse_fields, spool=True), part, path)
    finally:
        consumer.close()


def _fast_path(options: dict[str, str], parse_fields: list[tuple[str, str]] | None) -> Any:
    from riverhouse.platform.arrow_validate import FastPath, Rules

    if not parse_fields or not options.get("spool.dir") or not options.get("validate.rules"):
        return None
    return FastPath(Rules.decode(options["validate.rules"]))


def _finish(batch: Any, fast: Any, spool: Any) -> Iterator[Any]:
    """Without a fast path: the batch. With one: its finished rows to the spool, the rest to Spark."""
    import pyarrow as pa

    from riverhouse.platform.arrow_validate import SPOOL_COLUMN

    if fast is None:
        yield batch
        return
    finished, rest = fast.split(batch)
    if finished is not None:
        spool.write(finished)
    if rest.num_rows:
        yield rest.append_column(pa.field(SPOOL_COLUMN, pa.string()), pa.nulls(rest.num_rows, pa.string()))


def _marker(schema: Any, part: KafkaInputPartition, path: str) -> Any:
    """One row that names a spool file; parse_records passes its `_spool` through to the driver."""
    import pyarrow as pa

    values = {"topic": [part.topic], "partition": [part.partition], "offset": [part.start], "_spool": [path]}
    arrays = [pa.array(values.get(f.name, [None]), f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _in_range(messages: list[Any], part: KafkaInputPartition, next_offset: int) -> tuple[list[Any], int]:
    """The records of `messages` inside [start, end), and the next offset to read.

    Raises on a real error. Offsets up to `end` may hold only control records
    (transactions): the partition-EOF event moves `next_offset` past them.
    """
    from confluent_kafka import KafkaError

    if any([m.error() is not None for m in messages]):
        records = []
        for msg in messages:
            err = msg.error()
            if err is None:
                records.append(msg)
            elif err.code() == KafkaError._PARTITION_EOF:
                next_offset = max(next_offset, msg.offset() or next_offset)
            elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                raise KafkaSourceError(
                    f"offsets {part.start}..{part.end - 1} of {part.topic}[{part.partition}] are no "
                    "longer in Kafka (deleted by retention). Set the source option "
                    "failOnDataLoss=false to skip them."
                )
            else:
                raise KafkaSourceError(f"reading {part.topic}[{part.partition}]: {err.str()}")
        messages = records
    if not messages:
        return [], next_offset
    offsets = [m.offset() for m in messages]
    # One partition's offsets ascend, so the records in range are one slice.
    lo = bisect.bisect_left(offsets, part.start)
    hi = bisect.bisect_left(offsets, part.end)
    if hi > lo:
        next_offset = max(next_offset, offsets[hi - 1] + 1)
    if hi < len(offsets):
        next_offset = part.end
    return messages[lo:hi], next_offset


def _record_batch(messages: list[Any], part: KafkaInputPartition, schema: Any, parser: Any) -> Any:
    from itertools import chain

    import numpy as np
    import pyarrow as pa

    count = len(messages)
    values = [m.value() for m in messages]
    # librdkafka: (type, ms) with type 0 = none, 1 = create time, 2 = log append;
    # Spark's Kafka source says -1 / 0 / 1.
    stamps = [m.timestamp() for m in messages]
    stamps_array = np.fromiter(chain.from_iterable(stamps), np.int64, 2 * count).reshape(count, 2)
    kinds, millis = stamps_array[:, 0], stamps_array[:, 1]
    headers = [m.headers() for m in messages]
    header_type = schema.field("headers").type
    if any(h is not None for h in headers):
        header_array = pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in headers], header_type)
    else:
        header_array = pa.nulls(count, header_type)
    arrays = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([part.topic] * count, pa.string()),
        pa.array(np.full(count, part.partition, dtype=np.int32)),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array(millis * 1000, pa.int64(), mask=kinds == 0).cast(schema.field("timestamp").type),
        pa.array(np.where(kinds == 0, -1, kinds - 1).astype(np.int32)),
        header_array,
    ]
    if parser is not None:
        arrays.append(parser.parse(values))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        from riverhouse.platform.arrow_parse import PARSED_COLUMN
        from riverhouse.platform.arrow_validate import SPOOL_COLUMN
        from riverhouse.platform.parse import json_struct

        options = {str(k).lower(): str(v) for k, v in self.options.items()}
        fields = _parse_fields(options)
        # `_parsed` has the type from_json reads into, so parse_records can coalesce the two.
        if not fields:
            return KAFKA_SCHEMA_DDL
        ddl = f"{KAFKA_SCHEMA_DDL}, {PARSED_COLUMN} {json_struct(fields).simpleString()}"
        if _fast_path(options, fields) is not None:
            ddl += f", {SPOOL_COLUMN} string"
        return ddl

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)


def source_options(
    bootstrap: str,
    topics: list[str],
    librdkafka: dict[str, Any],
    starting: str,
    max_offsets_per_trigger: int | None,
    parse_fields: list[tuple[str, str]] | None = None,
    max_message_bytes: int | None = None,
    fail_on_data_loss: bool = True,
) -> dict[str, str]:
    """Options for `spark.readStream.format("riverhouse_kafka")` from spec values.

    `parse_fields` turns on the Arrow JSON parse in the source (when every type allows it).
    """
    from riverhouse.platform.arrow_parse import encode_fields, supported

    opts = {
        "bootstrap.servers": bootstrap,
        "subscribe": ",".join(topics),
        "startingOffsets": starting,
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }
    if max_offsets_per_trigger:
        opts["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    if parse_fields and supported(parse_fields):
        opts["parse.fields"] = encode_fields(parse_fields)
        if max_message_bytes:
            opts["parse.maxMessageBytes"] = str(max_message_bytes)
    for key, value in librdkafka.items():
        opts[f"kafka.{key}"] = json.dumps(value) if isinstance(value, bool) else str(value)
    return opts
