"""Where a pipeline's rows go: the spec's sinks besides the ClickHouse table (spec.py's SinkSpec).

A pipeline states one sink (`sink:`) or several (`sinks:`, a list). Each sink has a `kind`:
`clickhouse` (the default, so every spec written before sinks had kinds stays valid) or `kafka`,
a topic the rows are produced to exactly once (sink/topic.py). Every sink of a pipeline
publishes the same Delta table (the sink source's silver, or gold), so they agree on `source`.

The cross-spec rule lives here too: one topic has one writer (`topic_clashes`), since two
pipelines producing one topic would interleave their transactions and ledgers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, model_validator

from riverhouse.platform.spec_avro import SchemaRegistrySpec
from riverhouse.platform.spec_base import StrictModel, check_identifier, check_topic

# Union tags of the sink kinds. pydantic puts the tag in an error's location; parse_spec leaves it
# out, so a problem is reported at `sink.table`, not `sink.sink:clickhouse.table`.
CLICKHOUSE_TAG = "sink:clickhouse"
KAFKA_TAG = "sink:kafka"
SINK_TAGS = frozenset({CLICKHOUSE_TAG, KAFKA_TAG})
SINK_KINDS = ("clickhouse", "kafka")
# The ledger topic of a Kafka sink, unless the sink names one: `riverhouse-ledger.<topic>`.
LEDGER_PREFIX = "riverhouse-ledger."
MAX_TOPIC_LENGTH = 249
MAX_TRANSACTION_ROWS = 1_000_000
# Riverhouse's own ClickHouse tables (ledger, backfill staging) start with this prefix, so
# no sink table may: a backfill drops and re-creates its staging table.
RESERVED_TABLE_PREFIX = "riverhouse_"

Topic = Annotated[str, BeforeValidator(check_topic)]
Identifier = Annotated[str, BeforeValidator(check_identifier)]


def check_sink_table(value: str) -> str:
    check_identifier(value, "sink table")
    if value.lower().startswith(RESERVED_TABLE_PREFIX):
        raise ValueError(
            f"sink table {value!r} starts with {RESERVED_TABLE_PREFIX!r}, which is reserved for Riverhouse's own "
            "ClickHouse tables (ledger, backfill staging): choose another name"
        )
    return value


SinkTable = Annotated[str, BeforeValidator(check_sink_table)]


class NoClickHouseSink(LookupError):
    """A ClickHouse step asked of a pipeline whose sinks are Kafka topics only."""


def sink_tag(value: Any) -> str | None:
    """Which sink model reads `value`: by its `kind` (absent = clickhouse); None for an unknown kind."""
    kind = value.get("kind", "clickhouse") if isinstance(value, dict) else getattr(value, "kind", None)
    return {"clickhouse": CLICKHOUSE_TAG, "kafka": KAFKA_TAG}.get(kind) if isinstance(kind, str) else None


class SinkSpec(StrictModel):
    """The ClickHouse table the rows are loaded into, exactly once (the default kind of sink)."""

    kind: Literal["clickhouse"] = "clickhouse"
    source: Identifier | None = None
    table: SinkTable
    database: Identifier | None = None
    order_by: list[Identifier] = Field(min_length=1)
    batch_size: int = Field(default=100_000, gt=0, le=10_000_000)


class KafkaSinkSpec(StrictModel):
    """A Kafka topic the pipeline's rows are produced to, exactly once (Kafka transactions + a ledger topic).

    It uses the pipeline's Kafka connection (`kafka.bootstrap_servers`, `kafka.security`,
    `kafka.config`): the cluster the sources are read from.
    """

    kind: Literal["kafka"]
    source: Identifier | None = None
    topic: Topic
    # Output columns whose values make the record key (and so the partition). None: the source
    # key for a pipeline without a join; no key (records spread over partitions) for a join.
    key: list[Identifier] | None = None
    # json: one JSON object per record. avro: Confluent's wire format (a magic byte, the schema id,
    # the Avro body), the schema derived from the table's columns and registered in `schema_registry`
    # under `<topic>-value` (or its `subject`). Keys are written as text in both (sink/topic_format.py).
    format: Literal["json", "avro"] = "json"
    schema_registry: SchemaRegistrySpec | None = None
    # Only used when Riverhouse creates the topic; an existing topic keeps its partitions.
    partitions: int | None = Field(default=None, gt=0, le=10_000)
    # A Delta version larger than this is produced in several transactions (the ledger says how far).
    transaction_rows: int = Field(default=100_000, gt=0, le=MAX_TRANSACTION_ROWS)
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "lz4"
    ledger_topic: Topic | None = None

    @model_validator(mode="after")
    def _registry_for_avro(self) -> KafkaSinkSpec:
        if self.format == "avro" and self.schema_registry is None:
            raise ValueError("format avro needs schema_registry: {url: ...}, where the values' schema is registered")
        if self.format != "avro" and self.schema_registry is not None:
            raise ValueError("schema_registry is for format avro: JSON records carry no schema id")
        return self

    @model_validator(mode="after")
    def _topics(self) -> KafkaSinkSpec:
        if len(self.ledger) > MAX_TOPIC_LENGTH:
            raise ValueError(
                f"the ledger topic's name {self.ledger!r} would be longer than {MAX_TOPIC_LENGTH} characters: "
                "name one with ledger_topic"
            )
        if self.ledger == self.topic:
            raise ValueError(
                f"ledger_topic {self.ledger!r} is the sink's own topic: the ledger needs a topic of its own"
            )
        return self

    @property
    def ledger(self) -> str:
        """The compacted topic that records which Delta versions are in `topic`."""
        return self.ledger_topic or f"{LEDGER_PREFIX}{self.topic}"


# One sink of any kind, chosen by its `kind`: clickhouse (the default) or kafka.
AnySink = Annotated[
    Annotated[SinkSpec, Tag(CLICKHOUSE_TAG)] | Annotated[KafkaSinkSpec, Tag(KAFKA_TAG)],
    Discriminator(
        sink_tag,
        custom_error_type="sink_kind",
        custom_error_message=f"a sink's kind is one of {', '.join(SINK_KINDS)} (default clickhouse)",
    ),
]


def transactional_id(pipeline: str, sink: KafkaSinkSpec) -> str:
    """The producer's transactional.id: stable per pipeline and topic, so a restart fences its predecessor."""
    return f"riverhouse.{pipeline}.{sink.topic}"


def sink_place(index: int, listed: bool) -> str:
    """Where sink number `index` sits in the spec, for messages: `sink` or `sinks[i]`."""
    return f"sinks[{index}]" if listed else "sink"


class PipelineSinks:
    """PipelineSpec's sinks: `sink:` (one) or `sinks:` (a list), read through these properties and checked here."""

    if TYPE_CHECKING:  # PipelineSpec's fields (a plain mixin declares none of its own)
        declared_sink: SinkSpec | KafkaSinkSpec | None
        declared_sinks: list[SinkSpec | KafkaSinkSpec] | None
        name: str
        sources: dict[str, Any]

    @property
    def sinks(self) -> list[SinkSpec | KafkaSinkSpec]:
        """Every sink, in the spec's order (`sink:` is a list of one)."""
        if self.declared_sinks is not None:
            return list(self.declared_sinks)
        return [self.declared_sink] if self.declared_sink is not None else []

    @property
    def clickhouse_sink(self) -> SinkSpec | None:
        """The ClickHouse table the pipeline loads, if it has one."""
        return next((s for s in self.sinks if isinstance(s, SinkSpec)), None)

    @property
    def sink(self) -> SinkSpec:
        """The ClickHouse sink: what the loader, the backfill's partition swap and their checks work on."""
        found = self.clickhouse_sink
        if found is None:
            topics = ", ".join(s.topic for s in self.topic_sinks)
            raise NoClickHouseSink(f"pipeline {self.name!r} has no ClickHouse sink (it writes Kafka topic {topics})")
        return found

    @property
    def topic_sinks(self) -> list[KafkaSinkSpec]:
        return [s for s in self.sinks if isinstance(s, KafkaSinkSpec)]

    @property
    def output_name(self) -> str:
        """The name of the pipeline's output: its ClickHouse table, else the pipeline's name.

        Gold is `gold/<pipeline>/<output_name>`: adding a ClickHouse table to a join pipeline that
        had none starts a new gold table (docs/pipeline-spec.md#sinks).
        """
        found = self.clickhouse_sink
        return found.table if found is not None else self.name

    def _place(self, index: int) -> str:
        return sink_place(index, self.declared_sinks is not None)

    def _check_sinks_declared(self) -> dict[str, str]:
        """One of sink:/sinks:, at most one ClickHouse table, one source for all; returns place -> source stated."""
        if (self.declared_sink is None) == (self.declared_sinks is None):
            raise ValueError(
                "give the pipeline's sink: (one) or sinks: (a list), not both"
                if self.declared_sink is not None
                else "the pipeline has no sink: give sink: (a ClickHouse table, or kind: kafka and a topic) or sinks:"
            )
        if sum(isinstance(s, SinkSpec) for s in self.sinks) > 1:
            raise ValueError("sinks: at most one ClickHouse table per pipeline")
        stated = {self._place(i): s.source for i, s in enumerate(self.sinks) if s.source is not None}
        if len(set(stated.values())) > 1:
            raise ValueError(
                "every sink of a pipeline publishes the same table, but their sources differ: "
                + ", ".join(f"{where}.source {name!r}" for where, name in stated.items())
            )
        return stated

    def _check_sink_columns(self, columns: list[str], what: str, scalar: Callable[[str, str], None]) -> None:
        """`order_by` and `key` columns are among `columns` (described by `what`); topics are the sinks' own.

        `scalar(column, what)` raises when a column is an array or map.
        """
        seen: dict[str, str] = {}
        by_topic = {src.topic: name for name, src in self.sources.items()}
        for index, sink in enumerate(self.sinks):
            where = self._place(index)
            named = ("order_by", sink.order_by) if isinstance(sink, SinkSpec) else ("key", sink.key or [])
            for column in named[1]:
                if column not in columns:
                    raise ValueError(f"{where}.{named[0]} column {column!r} is not {what}")
                scalar(column, f"{where}.{named[0]} column")
            if not isinstance(sink, KafkaSinkSpec):
                continue
            for place, topic in ((f"{where}.topic", sink.topic), (f"{where}.ledger_topic", sink.ledger)):
                if topic in by_topic:
                    raise ValueError(
                        f"{place} {topic!r} is the topic of source {by_topic[topic]!r}: a pipeline that wrote to its "
                        "own input would read its output again, forever"
                    )
                if topic in seen:
                    raise ValueError(f"{place} {topic!r} is already written by {seen[topic]}: give each its own topic")
                seen[topic] = where


def topic_clashes(topics: dict[str, str], spec: PipelineSinks, source: str) -> list[tuple[str, str, str]]:
    """Problems of `spec` (from file `source`) writing a topic another accepted spec writes.

    `topics` maps each topic already written (sink or ledger) to the file that writes it; topics are
    compared by name, whatever cluster each spec names (an operator's RIVERHOUSE_KAFKA_BOOTSTRAP
    sends every spec to one cluster).
    """
    problems = []
    for index, sink in enumerate(spec.sinks):
        if not isinstance(sink, KafkaSinkSpec):
            continue
        where = spec._place(index)
        for place, topic in ((f"{where}.topic", sink.topic), (f"{where}.ledger_topic", sink.ledger)):
            if topic in topics:
                problems.append(
                    (
                        place,
                        f"Kafka topic {topic!r} is already written by {topics[topic]}",
                        "each topic has one writing pipeline: two producers would interleave their transactions "
                        "and their ledgers, and consumers would get rows twice",
                    )
                )
                break  # the sink's own topic clashing says it; its default ledger would clash too
    return problems


def topics_written(spec: PipelineSinks) -> list[str]:
    """The topics `spec` produces to: each Kafka sink's topic and ledger."""
    return [t for s in spec.sinks if isinstance(s, KafkaSinkSpec) for t in (s.topic, s.ledger)]
