"""Pipeline specs: YAML files validated with pydantic.

A spec names its Kafka sources (topic, JSON schema, event time, key), how each
source is deduplicated, and the ClickHouse table the clean rows land in. Every
identifier that reaches SQL is validated here, so later layers can quote it
without re-checking.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from riverhouse.platform.envrefs import scope_problems
from riverhouse.platform.fields import (
    ColumnName,
    FieldSpec,
    check_epoch_units,
    check_paths,
    fields_from_mapping,
    resolve_pipeline_refs,
    resolve_source_refs,
)
from riverhouse.platform.spec_avro import (
    SchemaRegistrySpec,
    avro_source,
    check_fields_in_schema,
    registry_reader_schemas,
)
from riverhouse.platform.spec_base import (
    IDENTIFIER_RE,
    SYSTEM_COLUMN_PREFIX,
    TOPIC_RE,
    NotUtf8Error,
    SpecError,
    StrictModel,
    check_column_name,
    check_identifier,
    check_topic,
    read_utf8,
)
from riverhouse.platform.spec_kafka import SASL_PROTOCOLS, TLS_PROTOCOLS, KafkaSecurity, KafkaSpec
from riverhouse.platform.spec_sinks import (
    RESERVED_TABLE_PREFIX,
    SINK_TAGS,
    AnySink,
    KafkaSinkSpec,
    NoClickHouseSink,
    PipelineSinks,
    SinkSpec,
    topic_clashes,
    topics_written,
)
from riverhouse.platform.spec_window import MAX_WINDOW, Window, format_window, parse_window
from riverhouse.platform.spec_yaml import MAX_BYTES, YamlProblem, load_yaml
from riverhouse.platform.types import NUMERIC

# Re-exported: the spec's public names, wherever they are defined (the `kafka:` section is
# spec_kafka.py, the sinks spec_sinks.py).
__all__ = [
    "IDENTIFIER_RE",
    "MAX_WINDOW",
    "RESERVED_TABLE_PREFIX",
    "SASL_PROTOCOLS",
    "SYSTEM_COLUMN_PREFIX",
    "TLS_PROTOCOLS",
    "TOPIC_RE",
    "FieldSpec",
    "KafkaSecurity",
    "KafkaSinkSpec",
    "KafkaSpec",
    "NoClickHouseSink",
    "SinkSpec",
    "check_column_name",
    "check_identifier",
    "format_window",
    "parse_window",
]

OWNER_RE = re.compile(r"(team:[A-Za-z0-9_.-]+|[^@\s]+@[^@\s]+\.[^@\s]+)")

NUMERIC_TYPES = NUMERIC


Identifier = Annotated[str, BeforeValidator(check_identifier)]


class EventTimeSpec(StrictModel):
    field: Identifier | None = None
    # When the field is missing or unparseable the Kafka record timestamp is used,
    # so a late or sloppy producer never loses a record.
    fallback: Literal["kafka_timestamp", "quarantine"] = "kafka_timestamp"


class DedupSpec(StrictModel):
    key: list[Identifier] | None = None
    window: Window
    keep: Literal["first"] = "first"


class SourceSpec(StrictModel):
    topic: str
    format: Literal["json", "avro"] = "json"
    fields: Annotated[list[FieldSpec], BeforeValidator(fields_from_mapping)] = Field(min_length=1)
    # Avro records (spec_avro.py): where the writers' schemas are, and the reader schema (JSON text).
    schema_registry: SchemaRegistrySpec | None = None
    avro_schema: str | None = Field(default=None, repr=False)
    key: list[Identifier] = Field(min_length=1)
    event_time: EventTimeSpec = EventTimeSpec()
    dedup: DedupSpec | None = None
    max_message_bytes: int = Field(default=1_000_000, gt=0, le=2**31 - 1)

    @field_validator("topic")
    @classmethod
    def _topic_is_legal(cls, value: str) -> str:
        return check_topic(value)

    @model_validator(mode="before")
    @classmethod
    def _references_by_path(cls, data: Any) -> Any:
        return resolve_source_refs(avro_source(data))

    @model_validator(mode="after")
    def _references_exist(self) -> SourceSpec:
        names = [f.name for f in self.fields]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"field(s) declared twice: {', '.join(dupes)}")
        # Spark resolves column names case-insensitively: `Amount` and `amount` would be one column.
        folded = [n.lower() for n in names]
        clashes = sorted({n for n in names if folded.count(n.lower()) > 1})
        if clashes:
            raise ValueError(f"field names that differ only in case: {', '.join(clashes)}")
        check_paths(self.fields)
        if self.format == "avro":
            check_fields_in_schema(self.fields, str(self.avro_schema))
        elif self.schema_registry is not None or self.avro_schema is not None:
            raise ValueError("schema_registry and avro_schema apply to format: avro")
        known = set(names)
        dedup_key = self.dedup.key if self.dedup and self.dedup.key else []
        for keys, what in ((self.key, "key field"), (dedup_key, "dedup key field")):
            for k in keys:
                if k not in known:
                    raise ValueError(f"{what} {k!r} is not in fields ({', '.join(names)})")
                self.check_scalar(k, what)
        if self.event_time.field is not None:
            if self.event_time.field not in known:
                raise ValueError(f"event_time field {self.event_time.field!r} is not in fields")
            typ = self.field(self.event_time.field).type
            if typ not in ("timestamp", "long"):
                raise ValueError(
                    f"event_time field {self.event_time.field!r} has type {typ}: "
                    "use timestamp (ISO 8601) or long (epoch milliseconds, or the field's epoch_unit)"
                )
        check_epoch_units(self.fields, self.event_time.field, self.format)
        return self

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def check_scalar(self, name: str, what: str) -> None:
        f = self.field(name)
        if not f.is_scalar:
            raise ValueError(
                f"{what} {name!r} is {f.type}: keys and ordering columns are scalars (string, number, boolean, "
                "time); use a field inside it (a path) instead"
            )

    @property
    def dedup_key(self) -> list[str]:
        return list(self.dedup.key or self.key) if self.dedup else list(self.key)

    @property
    def required_fields(self) -> list[str]:
        """Fields a record must carry: declared required, plus every key field."""
        keys = set(self.key) | set(self.dedup_key)
        return [f.name for f in self.fields if f.required or f.name in keys]


def _join_on(value: Any) -> Any:
    """`on: [user_id]` is shorthand for the same key names on both sides."""
    if isinstance(value, list):
        return {"left": value, "right": value}
    return value


class JoinOnSpec(StrictModel):
    left: list[Identifier] = Field(min_length=1)
    right: list[Identifier] = Field(min_length=1)

    @model_validator(mode="after")
    def _same_length(self) -> JoinOnSpec:
        if len(self.left) != len(self.right):
            raise ValueError("join.on.left and join.on.right must list the same number of keys")
        return self


class TemporalJoinSpec(StrictModel):
    type: Literal["inner", "left"] = "inner"
    left: Identifier
    right: Identifier
    on: Annotated[JoinOnSpec, BeforeValidator(_join_on)]
    window: Window
    # output column -> "source.field"
    select: dict[ColumnName, str] = Field(min_length=1)
    require: list[Identifier] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _yaml_on_key(cls, data: Any) -> Any:
        # YAML 1.1 reads a bare `on:` key as the boolean true.
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data


class StateSpec(StrictModel):
    ttl: Window = timedelta(hours=1)
    sources: dict[Identifier, Window] = Field(default_factory=dict)


class SensorSpec(StrictModel):
    enabled: bool = True
    # Request a run when this many records wait in Kafka...
    min_lag: int = Field(default=10_000, gt=0)
    # ...or when any record has waited this long.
    max_delay: Window = timedelta(minutes=5)
    interval: Window = timedelta(seconds=30)


class OrchestrationSpec(StrictModel):
    # Time-window partitions of silver, gold and ClickHouse: the unit of a backfill.
    partitions: Literal["daily", "hourly"] = "daily"
    partitions_start: date = date(2026, 1, 1)
    sensor: SensorSpec = SensorSpec()
    schedule: str | None = None  # cron, e.g. "*/15 * * * *"
    # How often a micro-batch starts in continuous mode (`run --continuous`) and in a resident query.
    trigger_interval: Window = timedelta(seconds=1)
    resident_query: bool = False  # stream runs on an engine attach to a query kept there (ingest/resident.py)

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None and len(value.split()) != 5:
            raise ValueError(f"schedule {value!r} is not a 5-field cron expression (e.g. '*/15 * * * *')")
        return value


class QualitySpec(StrictModel):
    # Share of a run's records that may be quarantined before the ClickHouse load is stopped.
    max_rejected_rate: float = Field(default=0.05, ge=0, le=1)


class PipelineSpec(PipelineSinks, StrictModel):
    # Dumps write `sink:`/`sinks:`, as the spec does.
    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    name: Identifier
    description: str = ""
    owners: list[str] = Field(default_factory=list)
    kafka: KafkaSpec = KafkaSpec()
    # The YAML file the spec was loaded from (`load_spec`), for code references; not a field.
    _file: str | None = PrivateAttr(default=None)
    sources: dict[Identifier, SourceSpec] = Field(min_length=1)
    # A join pipeline has either a temporal `join:` or a SQL `query:`; its output
    # (the gold table, named like the sink table) is what ClickHouse receives.
    join: TemporalJoinSpec | None = None
    query: str | None = None
    state: StateSpec = StateSpec()
    dimensions: list[Identifier] = Field(default_factory=list)
    require: list[Identifier] = Field(default_factory=list)
    # `sink:` (one) or `sinks:` (several); read them through `sinks`, `sink` (the ClickHouse one)
    # and `topic_sinks`.
    declared_sink: AnySink | None = Field(default=None, alias="sink")
    declared_sinks: list[AnySink] | None = Field(default=None, alias="sinks", min_length=1)
    orchestration: OrchestrationSpec = OrchestrationSpec()
    quality: QualitySpec = QualitySpec()

    @model_validator(mode="before")
    @classmethod
    def _references_by_path(cls, data: Any) -> Any:
        return resolve_pipeline_refs(registry_reader_schemas(data))

    @field_validator("owners")
    @classmethod
    def _owners_are_dagster_owners(cls, value: list[str]) -> list[str]:
        for owner in value:
            if not isinstance(owner, str) or not OWNER_RE.fullmatch(owner):
                raise ValueError(f"owner {owner!r} must be an email address or team:<name>")
        return value

    @model_validator(mode="after")
    def _secrets_are_this_pipelines(self) -> PipelineSpec:
        problems = [
            f"{where}: {p}" for where, value in self._secret_references() for p in scope_problems(value, self.name)
        ]
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _secret_references(self) -> list[tuple[str, str]]:
        users = [(f"sources.{n}", s.schema_registry) for n, s in self.sources.items()]
        users += [(f"the sink of topic {s.topic}", s.schema_registry) for s in self.topic_sinks]
        registries = [(f"{at}.{w}", v) for at, registry in users if registry for w, v in registry.references()]
        return [*self.kafka.references(), *registries]

    @model_validator(mode="after")
    def _sink_refers_to_a_source(self) -> PipelineSpec:
        topics = [s.topic for s in self.sources.values()]
        if len(set(topics)) != len(topics):
            raise ValueError("two sources read the same topic; declare each topic once")
        stated = self._check_sinks_declared()
        if self.join is not None or self.query is not None:
            return self._check_join(stated)
        if self.dimensions or self.require:
            raise ValueError("dimensions and require apply to join pipelines (give join: or query:)")
        if not stated:
            if len(self.sources) != 1:
                where = "source (on a sink)" if self.declared_sinks is not None else "sink.source"
                raise ValueError(
                    f"{where} is required when the pipeline has more than one source "
                    f"(sources: {', '.join(self.sources)})"
                )
        else:
            where, name = next(iter(stated.items()))
            if name not in self.sources:
                raise ValueError(f"{where}.source {name!r} is not one of the sources ({', '.join(self.sources)})")
        source = self.sources[self.sink_source_name]
        names = [f.name for f in source.fields]
        self._check_sink_columns(names, f"a field of source {self.sink_source_name!r}", source.check_scalar)
        return self

    def _check_join(self, stated: dict[str, str]) -> PipelineSpec:
        if self.join is not None and self.query is not None:
            raise ValueError("give either join: (a temporal join) or query: (SQL), not both")
        if self.orchestration.resident_query:
            raise ValueError("orchestration.resident_query is for single-source pipelines, not joins")
        if stated:
            where = next(iter(stated))
            raise ValueError(f"{where}.source is not used by join pipelines: the sink receives the join output")
        if self.join is not None:
            for side in (self.join.left, self.join.right):
                if side not in self.sources:
                    raise ValueError(f"join: source {side!r} is not one of the sources ({', '.join(self.sources)})")
            if self.join.left == self.join.right:
                raise ValueError("join: left and right must be different sources")
            for side, keys in ((self.join.left, self.join.on.left), (self.join.right, self.join.on.right)):
                known = [f.name for f in self.sources[side].fields]
                for key in keys:
                    if key not in known:
                        raise ValueError(f"join.on: key {key!r} is not a field of {side!r}")
                    self.sources[side].check_scalar(key, f"join.on: key of {side!r}")
            for out, ref in self.join.select.items():
                source, dot, column = ref.partition(".")
                if not dot or source not in (self.join.left, self.join.right):
                    raise ValueError(
                        f"join.select.{out}: write <source>.<field> with source {self.join.left!r} or {self.join.right!r}, got {ref!r}"
                    )
                if column not in [f.name for f in self.sources[source].fields]:
                    raise ValueError(f"join.select.{out}: {source!r} has no field {column!r}")
        for name in self.dimensions:
            if name not in self.sources:
                raise ValueError(f"dimensions: {name!r} is not one of the sources")
        for name in self.state.sources:
            if name not in self.sources:
                raise ValueError(f"state.sources: {name!r} is not one of the sources")
        from riverhouse.platform.sql import QueryError

        try:
            plan = self.plan
        except QueryError as exc:
            raise ValueError(str(exc)) from None
        names = list(plan.output_names)
        # Output types are known once Spark has analyzed the query: not checked for scalars here.
        self._check_sink_columns(names, f"an output column ({', '.join(names)})", lambda *_: None)
        return self

    @property
    def is_join(self) -> bool:
        return self.join is not None or self.query is not None

    @property
    def plan(self) -> Any:
        """The compiled JoinPlan of a join pipeline (riverhouse.platform.sql)."""
        from riverhouse.platform.sql import compile_query, temporal_join_query

        fields = {name: [f.name for f in src.fields] for name, src in self.sources.items()}
        if self.join is not None:
            query = temporal_join_query(
                self.join.left, self.join.right, self.join.type, self.join.on.left, self.join.on.right, self.join.select
            )
            windows = {name: self.join.window for name in self.sources}
            return compile_query(query, fields, windows, set(), list(self.join.require))
        assert self.query is not None
        windows = {name: self.state.sources.get(name, self.state.ttl) for name in self.sources}
        return compile_query(self.query, fields, windows, set(self.dimensions), list(self.require))

    def __eq__(self, other: object) -> bool:
        # Where a spec was loaded from is not part of what it says: two equal texts are equal specs.
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = StrictModel.__hash__

    @property
    def source_file(self) -> str | None:
        """The absolute path of the YAML file the spec was loaded from, if it was loaded from one."""
        return self._file

    @property
    def sink_source_name(self) -> str:
        """The source whose silver table feeds the sink (join pipelines: the driving source)."""
        if self.is_join:
            return self.plan.driving_source
        stated = next((s.source for s in self.sinks if s.source is not None), None)
        return stated or next(iter(self.sources))

    @property
    def sink_source(self) -> SourceSpec:
        return self.sources[self.sink_source_name]


def _hint_for(error: dict[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "remove it, or check its spelling against docs/pipeline-spec.md"
    if kind == "missing":
        return "this field is required"
    if kind == "literal_error":
        return "allowed: " + str(error.get("ctx", {}).get("expected", ""))
    if "window" in str(error.get("msg", "")):
        return "a duration between 1s and 7d, e.g. 1h"
    if "identifier" in str(error.get("msg", "")):
        return "rename it to match [A-Za-z_][A-Za-z0-9_]*"
    return ""


def _format_loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif str(item).startswith("function-") or item in SINK_TAGS:
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


# A whole-spec check names the setting at the start of its message ("query: ..."): shown as the place.
MESSAGE_PLACE_RE = re.compile(r"(query|require|dimensions|kafka\.[a-z0-9_.]+): ")


def parse_spec(data: Any, source: str = "<spec>") -> PipelineSpec:
    """The spec from its data; every problem, and any failure while checking, is a SpecError naming `source`."""
    if not isinstance(data, dict):
        raise SpecError(source, [("", "the spec must be a YAML mapping", "start with `name: my_pipeline`")])
    try:
        return PipelineSpec.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = _format_loc(err["loc"])
            # A check may report several problems, one per line, each naming its place ("query: ...").
            for line in str(err["msg"]).removeprefix("Value error, ").split("\n"):
                named = MESSAGE_PLACE_RE.match(line)
                if named and named.group(1).startswith(where):
                    problems.append((named.group(1), line[named.end() :], _hint_for(err)))
                else:
                    problems.append((where, line, _hint_for(err)))
        raise SpecError(source, problems) from None
    except RecursionError:
        raise SpecError(source, [("", "the spec is nested too deeply to check", "flatten it")]) from None
    except Exception as exc:  # one file's failure is that file's error, never the whole code location's
        raise SpecError(
            source,
            [("", f"the spec could not be checked ({type(exc).__name__}: {str(exc)[:200]})", "report this as a bug")],
        ) from None


def load_spec(path: str | Path) -> PipelineSpec:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise SpecError(str(path), [("", f"the file is larger than a spec's maximum of {MAX_BYTES:,} bytes", "")])
        text = read_utf8(path)
    except OSError as exc:
        raise SpecError(str(path), [("", f"cannot read file: {exc.strerror}", "check the path")]) from None
    except NotUtf8Error as exc:
        raise SpecError(str(path), [("", str(exc), "")]) from None
    try:
        data = load_yaml(text)
    except YamlProblem as exc:
        raise SpecError(str(path), [(exc.where, exc.message, exc.hint)]) from None
    sources = data.get("sources") if isinstance(data, dict) else None
    for source in sources.values() if isinstance(sources, dict) else ():
        # An Avro schema file is the spec's neighbour: relative to the spec's folder, not the cwd.
        if isinstance(source, dict) and isinstance(file := source.get("avro_schema_file"), str):
            source["avro_schema_file"] = str(path.parent / file)
    spec = parse_spec(data, str(path))
    spec._file = str(path.resolve())
    return spec


def sink_identity(spec: PipelineSpec, default_database: str = "default") -> tuple[str, str]:
    """(database, table) of the ClickHouse table the spec loads, the database resolved: a sink
    without one loads the DSN's database (`dsn_database`), so `database: default` and none are one table."""
    return (spec.sink.database or default_database, spec.sink.table)


def check_together(
    loaded: list[tuple[str, PipelineSpec]], default_database: str = "default"
) -> tuple[list[PipelineSpec], list[SpecError]]:
    """Specs that may be loaded side by side, in order; a later one that clashes with an earlier one is refused.

    Two pipelines with one name would share tables and Dagster assets, and two whose names differ
    only in case would share secrets (RIVERHOUSE_SECRET_<PIPELINE>__*, envrefs.py); two pipelines
    loading one ClickHouse table would double its rows (their deduplication tokens differ), and two
    producing one Kafka topic would interleave their transactions (spec_sinks.topic_clashes).
    `default_database` is the DSN's database, where a sink without `database:` lands.
    """
    names: dict[str, str] = {}
    sinks: dict[tuple[str, str], str] = {}
    topics: dict[str, str] = {}
    accepted: list[PipelineSpec] = []
    errors: list[SpecError] = []
    for source, spec in loaded:
        problems = []
        if spec.name.upper() in names:
            problems.append(
                (
                    "name",
                    f"pipeline name {spec.name!r} is already used by {names[spec.name.upper()]} (names are compared "
                    "ignoring case: they name the pipeline's secrets)",
                    "give each pipeline its own name",
                )
            )
        sink = sink_identity(spec, default_database) if spec.clickhouse_sink is not None else None
        if sink is not None and sink in sinks:
            problems.append(
                (
                    "sink.table",
                    f"ClickHouse table {sink[0]}.{sink[1]!s} is already loaded by {sinks[sink]}"
                    + ("" if spec.sink.database else f" (a sink without database: loads the DSN's, {sink[0]})"),
                    "each pipeline loads its own table; two loaders of one table would double its rows",
                )
            )
        problems.extend(topic_clashes(topics, spec, source))
        if problems:
            errors.append(SpecError(source, problems))
            continue
        names[spec.name.upper()] = source
        if sink is not None:
            sinks[sink] = source
        topics.update(dict.fromkeys(topics_written(spec), source))
        accepted.append(spec)
    return accepted, errors


def load_spec_folder(
    folder: str | Path, default_database: str = "default"
) -> tuple[list[PipelineSpec], list[SpecError]]:
    """Every spec of the folder that loads, and one error per file that does not (or clashes)."""
    loaded: list[tuple[str, PipelineSpec]] = []
    errors: list[SpecError] = []
    for path in sorted(Path(folder).glob("*.y*ml")):
        try:
            loaded.append((str(path), load_spec(path)))
        except SpecError as exc:
            errors.append(exc)
    accepted, clashes = check_together(loaded, default_database)
    return accepted, errors + clashes


def load_specs(folder: str | Path) -> list[PipelineSpec]:
    """Every spec of the folder; the first problem raises."""
    specs, errors = load_spec_folder(folder)
    if errors:
        raise errors[0]
    return specs
