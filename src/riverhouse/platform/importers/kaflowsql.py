"""`riverhouse import kaflowsql`: a KaflowSQL pipeline (YAML with a SQL query) as a Riverhouse SQL pipeline.

The format is KaflowSQL's `pipeline.Pipeline` (pkg/pipeline/model.go) as its
README's "Complete Configuration Reference" documents it. KaflowSQL names Kafka
topics in FROM/JOIN and declares no input fields (they come from JSON or the
Schema Registry at run time), so sources and their fields are derived from the
query: every column it uses. Types come from `output.schema` (Avro) where a
column is projected as is, else `string`, and the report says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import sqlglot
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlglot import exp

from riverhouse.platform.importers.kaflowsql_query import InputField, infer_types, refuse_unsupported, rewrite_nested
from riverhouse.platform.importers.report import ImporterError, ImportResult, identifier, spec_window
from riverhouse.platform.spec_base import NotUtf8Error, read_utf8

AVRO_TYPES = {"string": "string", "int": "int", "long": "long", "float": "float", "double": "double"}
AVRO_TYPES |= {"boolean": "boolean"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Output(Strict):
    topic: str
    format: str
    key: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class Emission(Strict):
    type: Literal["smart", "immediate"] = "smart"
    require: list[str] = Field(default_factory=list)


class Events(Strict):
    default_ttl: str | None = None
    overrides: dict[str, str] = Field(default_factory=dict)


class State(Strict):
    events: Events = Events()
    dimensions: list[str] = Field(default_factory=list)


class KaflowPipeline(Strict):
    name: str
    window: str | None = None
    query: str
    output: Output
    emission: Emission | None = None
    state: State | None = None


def read_pipeline(path: Path) -> KaflowPipeline:
    try:
        data = yaml.safe_load(read_utf8(path))
    except OSError as exc:
        raise ImporterError(str(path), [("", f"cannot read file: {exc.strerror}", "check the path")]) from None
    except NotUtf8Error as exc:
        raise ImporterError(str(path), [("", str(exc), "")]) from None
    except yaml.YAMLError as exc:
        raise ImporterError(str(path), [("", f"invalid YAML: {exc}", "")]) from None
    if not isinstance(data, dict):
        raise ImporterError(str(path), [("", "a KaflowSQL pipeline is a YAML mapping", "start with `name:`")])
    if "query" not in data and ("kafka" in data or "state" in data) and "output" not in data:
        raise ImporterError(
            str(path),
            [
                (
                    "",
                    "this is KaflowSQL's global config.yaml (brokers, state storage), not a pipeline",
                    "import the pipeline files (pipelines/*.yaml); brokers go to kafka.bootstrap_servers",
                )
            ],
        )
    try:
        return KaflowPipeline.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            hint = "not a setting of KaflowSQL's pipeline format; check its spelling" if "extra" in err["type"] else ""
            problems.append((where, str(err["msg"]), hint))
        raise ImporterError(str(path), problems) from None


def import_kaflowsql(path: str | Path, engine_config: str | Path | None = None) -> ImportResult:
    """`engine_config`: KaflowSQL's global config.yaml (brokers, schema registry, Avro input)."""
    from riverhouse.platform.importers.kaflowsql_config import apply_engine_config, read_engine_config

    path = Path(path)
    pipeline = read_pipeline(path)
    result = ImportResult({}, "KaflowSQL pipeline", str(path))
    result.spec = build_spec(pipeline, result)
    if engine_config is not None:
        apply_engine_config(result.spec, read_engine_config(Path(engine_config)), result)
    output_registry(result.spec["sink"], result)
    result.validate()
    return result


def output_registry(sink: dict[str, Any], result: ImportResult) -> None:
    """An Avro output needs the registry config.yaml names; without one, the sink writes JSON (said)."""
    if sink.get("format") != "avro" or "schema_registry" in sink:
        return
    del sink["format"]
    result.drop(
        "output.format",
        "avro: KaflowSQL writes Avro when its config.yaml sets kafka.useAvro and kafka.schemaRegistry "
        "(give it with --config); without them the sink writes JSON objects",
    )


# KaflowSQL quotes the topic after FROM/JOIN before parsing, so `FROM app.events` names the topic
# "app.events" (pkg/pipeline/query.go, quoteTableNamesPG): the same rule here.
TOPIC_AFTER_RE = re.compile(r"(?i)\b(FROM|JOIN)\s+([A-Za-z0-9_.]+)")


def parse_query(query: str, source: str) -> exp.Select:
    # KaflowSQL parses with PostgreSQL's grammar and runs DuckDB: read it as DuckDB.
    try:
        statements = sqlglot.parse(TOPIC_AFTER_RE.sub(r'\1 "\2"', query), read="duckdb")
    except sqlglot.errors.ParseError as exc:
        raise ImporterError(source, [("query", f"cannot parse SQL: {str(exc).splitlines()[0]}", "")]) from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise ImporterError(source, [("query", "expected one SELECT statement", "")])
    return statements[0]


def avro_types(schema: dict[str, Any] | None, result: ImportResult) -> dict[str, str]:
    types: dict[str, str] = {}
    for i, f in enumerate((schema or {}).get("fields") or []):
        typ = f.get("type") if isinstance(f, dict) else None
        if isinstance(typ, list):  # ["null", "string"]: an optional field
            non_null = [t for t in typ if t != "null"]
            typ = non_null[0] if len(non_null) == 1 else None
        if isinstance(typ, str) and typ in AVRO_TYPES:
            types[f["name"]] = AVRO_TYPES[typ]
        elif isinstance(f, dict) and "name" in f:
            result.note(f"output.schema.fields[{i}]: Avro type {f.get('type')!r} of {f['name']!r} not used (string)")
    return types


def build_spec(p: KaflowPipeline, result: ImportResult) -> dict[str, Any]:
    select = parse_query(p.query, result.path)
    refuse_unsupported(select, result.path)
    tables = [t for t in select.find_all(exp.Table)]
    if not tables:
        raise ImporterError(result.path, [("query", "no FROM source", "")])
    alias_to_table = {t.alias_or_name: t.name for t in tables}
    names: dict[str, str] = {}
    for table in dict.fromkeys(t.name for t in tables):
        names[table] = identifier(table, "topic", result)
    driving_alias = (select.args.get("from_") or select.args.get("from")).this.alias_or_name
    nested = rewrite_nested(select, alias_to_table, driving_alias, result.path)

    # Columns per source; unqualified ones belong to the FROM source when they cannot be told apart.
    columns: dict[str, list[str]] = {t: [] for t in names}
    resolve: dict[int, tuple[str, str]] = {}  # Column node -> (table, column), for type inference
    for col in select.find_all(exp.Column):
        alias = col.table or driving_alias
        if not col.table and len(names) > 1:
            result.note(f"query: unqualified column {col.name!r} taken as {alias_to_table[driving_alias]!r}'s")
            col.set("table", exp.to_identifier(driving_alias))
        table = alias_to_table.get(alias)
        if table is None:
            raise ImporterError(result.path, [("query", f"unknown table or alias {alias!r} in {col.sql()}", "")])
        if col.name not in columns[table]:
            columns[table].append(col.name)
        resolve[id(col)] = (table, col.name)
    paths = {(alias_to_table[alias], column): path for (alias, column), path in nested.items()}
    inferred = infer_types(select, resolve)
    for table in tables:
        table.set("this", exp.to_identifier(names[table.name]))

    # Keys: the driving source's output.key if it projects one of its columns, else its first join key;
    # a joined source's key is what it is joined on (a dimension keeps the latest row per key).
    join_keys: dict[str, list[str]] = {t: [] for t in names}
    for join in select.args.get("joins") or []:
        on = join.args.get("on")
        for eq in on.find_all(exp.EQ) if on is not None else []:
            for side in (eq.this, eq.expression):
                if isinstance(side, exp.Column) and side.table in alias_to_table:
                    keys = join_keys[alias_to_table[side.table]]
                    if side.name not in keys:
                        keys.append(side.name)
    projected: dict[str, tuple[str, str]] = {}  # output column -> (table, column) when projected as is
    outputs: list[str] = []
    for item in select.expressions:
        body = item.this if isinstance(item, exp.Alias) else item
        outputs.append(item.alias_or_name)
        if isinstance(body, exp.Column):
            projected[item.alias_or_name] = (alias_to_table[body.table or driving_alias], body.name)
    # Types: output.schema (Avro) for columns projected as is, else inferred from use, else string.
    fields = {t: {c: inferred.get((t, c), InputField()) for c in cols} for t, cols in columns.items()}
    types = avro_types(p.output.schema_, result)
    for out, (table, column) in projected.items():
        if out in types:
            fields[table][column] = InputField(types[out], None, f"output.schema's {out}")
    for (table, column), path in paths.items():
        fields[table][column].path = path
    said = [f"{names[t]}.{c} {f.type} ({f.why})" for t, cols in fields.items() for c, f in cols.items() if f.why]
    if said:
        result.note("KaflowSQL declares no input types; typed from the query and output.schema: " + "; ".join(said))
    untyped = [f"{names[t]}.{c}" for t, cols in fields.items() for c, f in cols.items() if not f.why]
    if untyped:
        result.note("typed string, nothing in the query says otherwise (check them): " + ", ".join(sorted(untyped)))

    def scalar(table: str, candidates: list[str]) -> str | None:
        return next((c for c in candidates if not fields[table][c].type.startswith(("array<", "map<"))), None)

    driving = alias_to_table[driving_alias]
    out_key = p.output.key
    driving_key = None
    if out_key and out_key in projected and projected[out_key][0] == driving:
        driving_key = scalar(driving, [projected[out_key][1]])
    driving_key = driving_key or scalar(driving, [*join_keys[driving], *columns[driving]])
    if driving_key is None:
        raise ImporterError(result.path, [("query", f"no column of {driving!r} can be its key", "")])
    result.note(f"sources.{names[driving]}.key [{driving_key}]: records without it go to quarantine")
    sources: dict[str, Any] = {}
    for table, cols in fields.items():
        key = driving_key if table == driving else scalar(table, [*join_keys[table], *cols])
        declared = {
            c: f.type if f.path is None else {"type": f.type, "path": ".".join(f.path)} for c, f in cols.items()
        }
        sources[names[table]] = {"topic": table, "fields": declared, "key": [key]}

    spec: dict[str, Any] = {
        "name": identifier(p.name, "name", result),
        "description": f"Imported from KaflowSQL pipeline {p.name}",
        "kafka": {"bootstrap_servers": "local"},
        "sources": sources,
        "query": select.sql(dialect="spark", pretty=True) + "\n",
    }
    result.note(
        "kafka: KaflowSQL keeps brokers in its global config.yaml (kafka.brokers): set kafka.bootstrap_servers "
        "or RIVERHOUSE_KAFKA_BOOTSTRAP, and a secure broker's settings in kafka.security (not kafka.config)"
    )
    spec["state"], spec["dimensions"] = state_block(p, names, result)
    spec["require"] = emission_block(p, outputs, result)
    spec["sink"] = output_block(p, outputs, result)
    return spec


def state_block(p: KaflowPipeline, names: dict[str, str], result: ImportResult) -> tuple[dict[str, Any], list[str]]:
    state = p.state or State()
    ttl_raw, where = state.events.default_ttl, "state.events.default_ttl"
    if p.window:
        if ttl_raw is None:
            ttl_raw, where = p.window, "window"
        elif p.window != ttl_raw:
            result.drop("window", f"{p.window}: KaflowSQL's engine reads state.events.default_ttl ({ttl_raw}) instead")
    block: dict[str, Any] = {}
    if ttl_raw is not None:
        ttl = spec_window(ttl_raw, where, result)
        if ttl is not None:
            block["ttl"] = ttl
    else:
        result.note("state.ttl: none given; Riverhouse's default window, 1h, applies")
    overrides: dict[str, str] = {}
    for topic, raw in state.events.overrides.items():
        path = f"state.events.overrides.{topic}"
        if topic not in names:
            result.drop(path, f"{topic!r} is not a topic of the query")
        elif topic in state.dimensions:
            result.drop(path, f"{topic!r} is a dimension (never expires); the TTL does not apply")
        elif (window := spec_window(raw, path, result)) is not None:
            overrides[names[topic]] = window
    if overrides:
        block["sources"] = overrides
    dimensions = []
    for i, topic in enumerate(state.dimensions):
        if topic in names:
            dimensions.append(names[topic])
        else:
            result.drop(f"state.dimensions[{i}]", f"{topic!r} is not a topic of the query")
    return block, dimensions


def emission_block(p: KaflowPipeline, outputs: list[str], result: ImportResult) -> list[str]:
    if p.emission is None:
        return []
    if p.emission.type == "immediate":
        result.drop(
            "emission.type",
            "immediate: Riverhouse emits each driving event once, when its window closes; "
            "there are no early partial rows",
        )
    require = []
    for i, name in enumerate(p.emission.require):
        if name in outputs:
            require.append(name)
        else:
            result.drop(f"emission.require[{i}]", f"{name!r} is not an output column of the query")
    if require:
        result.note(
            "emission.require -> require: a row still missing a required column when its window closes goes to "
            "quarantine with the reason (KaflowSQL never emits it)"
        )
    return require


def output_block(p: KaflowPipeline, outputs: list[str], result: ImportResult) -> dict[str, Any]:
    """`output:` -> a Kafka sink: the same topic, key and (JSON) format, produced exactly once."""
    sink: dict[str, Any] = {"kind": "kafka", "topic": p.output.topic}
    result.note(
        f"output.topic {p.output.topic}: produced exactly once (Kafka transactions); consumers set "
        "isolation.level=read_committed (librdkafka's default; Java's is read_uncommitted). To also load a "
        "ClickHouse table, list both under sinks: (docs/pipeline-spec.md#sinks)"
    )
    if p.output.key:
        if p.output.key in outputs:
            sink["key"] = [p.output.key]
        else:
            result.drop("output.key", f"{p.output.key!r} is not an output column: records are written without a key")
    else:
        result.note("output.key: none, as in KaflowSQL: records have no key (spread over the topic's partitions)")
    if p.output.format.lower() == "avro":
        sink["format"] = "avro"  # its registry comes from config.yaml (apply_engine_config, output_registry)
    elif p.output.format.lower() != "json":
        result.drop("output.format", f"{p.output.format}: the Kafka sink writes json or avro; this one writes JSON")
    if p.output.schema_:
        result.note("output.schema: its Avro field types typed the columns projected as is")
    return sink
