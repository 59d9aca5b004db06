"""GlassFlow configs, v2 and v3, read into one neutral form for the mapping in glassflow.py.

Each setting keeps the path the user wrote (`source.topics[0].deduplication` in
v2, `transforms[0]` in v3), so what cannot be mapped is reported where it is.
Keys GlassFlow's decoder would ignore are read past and reported (`unknown_settings`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from riverhouse.platform.importers import glassflow_models as gf
from riverhouse.platform.importers.report import ImporterError, ImportResult
from riverhouse.platform.spec_base import NotUtf8Error, read_utf8

UNKNOWN_KEY = (
    "not a setting of GlassFlow's documented format: GlassFlow's decoder ignores unknown keys, and so does "
    "the import (check its spelling if you meant a setting)"
)


@dataclass
class Source:
    sid: str
    path: str
    topic: str
    offset: str
    fields: dict[str, tuple[str, str]]  # name -> (GlassFlow type, path)
    connection: gf.KafkaConnection | None
    registry: tuple[gf.SchemaRegistry, str] | None = None  # an Avro source's registry, and where it is said
    dedup: tuple[str, str, str] | None = None  # (key, window, path)
    filters: list[tuple[str, str, bool]] = field(default_factory=list)  # (expression, path, keeps matching rows)
    stateless: dict[str, tuple[gf.StatelessOutput, str]] = field(default_factory=dict)  # output name -> (spec, path)


@dataclass
class JoinSide:
    sid: str
    key: str
    window: str
    path: str
    key_type: str | None = None  # older v2 exports' join_key_type


@dataclass
class Join:
    left: JoinSide
    right: JoinSide
    outputs: dict[str, tuple[str, str]] | None  # output name -> (source id, field)


@dataclass
class Column:
    ref: str  # field (or join output) name
    column: str
    column_type: str
    sid: str | None
    path: str


@dataclass
class Pipeline:
    version: str
    pipeline_id: str
    name: str | None
    sources: list[Source]
    join: Join | None
    columns: list[Column]
    sink: Any  # gf.SinkV3 | gf.SinkV2
    sink_connection: gf.SinkConnection | None
    sink_source: str | None = None  # v2 sink.source_id: the source a join-less sink loads
    join_disabled: bool = False  # a join described but `enabled: false`


# ---------------------------------------------------------------------------- reading
def read_config(path: Path) -> dict[str, Any]:
    try:
        text = read_utf8(path)
    except OSError as exc:
        raise ImporterError(str(path), [("", f"cannot read file: {exc.strerror}", "check the path")]) from None
    except NotUtf8Error as exc:
        raise ImporterError(str(path), [("", str(exc), "")]) from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ImporterError(str(path), [("", f"not valid JSON/YAML: {exc}", "export the config again")]) from None
    if not isinstance(data, dict):
        raise ImporterError(str(path), [("", "a GlassFlow pipeline config is a JSON object", "")])
    return data


def validate_config(model: type[BaseModel], data: dict[str, Any], source: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"]).replace(".[", "[")
            hint = (
                "not a setting of GlassFlow's documented format; check its spelling" if "extra" in err["type"] else ""
            )
            problems.append((where, str(err["msg"]).removeprefix("Value error, "), hint))
        raise ImporterError(source, problems) from None


def detect_version(data: dict[str, Any], source: str) -> str:
    """v2 or v3: from `version` ("v3", or a release number such as "2.0.0" in older exports), else the layout."""
    raw = data.get("version")
    shape = "v3" if "sources" in data else "v2" if "source" in data else ""
    match = re.fullmatch(r"v?([0-9]+)(?:\.[0-9]+)*", str(raw).strip().lower()) if raw else None
    version = f"v{match.group(1)}" if match else ("" if raw else shape)
    if version not in ("v2", "v3"):
        raise ImporterError(
            source,
            [("version", f"unsupported GlassFlow config version {raw!r}", "v2 and v3 are read (also as 2.x.y, 3.x.y)")],
        )
    if shape and shape != version:
        # The layout decides: a "2.0.0" export with `sources` is read as what it is.
        return shape
    return version


def unknown_settings(node: Any, path: str = "") -> list[str]:
    """Every key of the config that the models do not know, with its path (`join.sources[0].foo`)."""
    out: list[str] = []
    if isinstance(node, BaseModel):
        out += [f"{path}.{key}" if path else key for key in node.model_extra or {}]
        for name, info in type(node).model_fields.items():
            key = info.alias or name
            out += unknown_settings(getattr(node, name), f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out += unknown_settings(item, f"{path}[{i}]")
    return out


def from_v3(cfg: gf.PipelineV3, result: ImportResult) -> Pipeline:
    sources: list[Source] = []
    for i, s in enumerate(cfg.sources):
        path = f"sources[{i}]"
        if s.type.lower() != "kafka":
            result.drop(path, f"a {s.type} source (OTLP): Riverhouse reads Kafka topics only")
            continue
        if s.topic is None or s.connection_params is None:
            raise ImporterError(result.path, [(path, "a Kafka source needs topic and connection_params", "")])
        _source_extras(s.format, s.schema_registry, s.schema_version, s.schema_, path, result)
        fields: dict[str, tuple[str, str]] = {}
        if s.schema_ is not None and s.schema_.fields:  # the Enterprise reference's form
            fields |= {f.name: (f.type.lower(), f"{path}.schema.fields[{j}]") for j, f in enumerate(s.schema_.fields)}
        fields |= {f.name: (f.type.lower(), f"{path}.schema_fields[{j}]") for j, f in enumerate(s.schema_fields or [])}
        avro = (
            (s.schema_registry, f"{path}.schema_registry")
            if (s.format or "").lower() == "avro" and s.schema_registry
            else None
        )
        sources.append(
            Source(s.source_id, path, s.topic, s.consumer_group_initial_offset, fields, s.connection_params, avro)
        )
    by_id = {s.sid: s for s in sources}
    for i, t in enumerate(cfg.transforms or []):
        path = f"transforms[{i}]"
        src = by_id.get(t.source_id)
        if src is None:
            result.drop(path, f"applies to {t.source_id!r}, which is not an imported Kafka source")
        elif isinstance(t, gf.DedupTransform):
            src.dedup = (t.config.key, t.config.time_window, path)
        elif isinstance(t, gf.FilterTransform):
            src.filters.append((t.config.expression, path, True))
        else:
            for j, out in enumerate(t.config.transforms):
                src.stateless[out.output_name] = (out, f"{path}.config.transforms[{j}]")
    join = None
    if cfg.join is not None and cfg.join.enabled:
        if cfg.join.left_source is None or cfg.join.right_source is None:
            raise ImporterError(result.path, [("join", "an enabled join needs left_source and right_source", "")])
        sides = [
            JoinSide(side.source_id, side.key, side.time_window, f"join.{name}")
            for name, side in (("left_source", cfg.join.left_source), ("right_source", cfg.join.right_source))
        ]
        outputs = None
        if cfg.join.output_fields:
            outputs = {o.output_name or o.name: (o.source_id, o.name) for o in cfg.join.output_fields}
        join = Join(sides[0], sides[1], outputs)
    columns = [
        Column(m.name, m.column_name, m.column_type, None, f"sink.mapping[{i}]") for i, m in enumerate(cfg.sink.mapping)
    ]
    if cfg.metadata and cfg.metadata.tags:
        result.drop("metadata.tags", "Riverhouse specs have no tags (Dagster owners are people or teams)")
    if cfg.resources:
        result.drop("resources", "Kubernetes sizing of GlassFlow's components: Riverhouse scales with Spark executors")
    return Pipeline("v3", cfg.pipeline_id, cfg.name, sources, join, columns, cfg.sink, cfg.sink.connection_params)


def from_v2(cfg: gf.PipelineV2, result: ImportResult) -> Pipeline:
    schema_fields = cfg.schema_.fields if cfg.schema_ else []
    if cfg.source.provider:
        result.drop("source.provider", "a label for GlassFlow's UI; it changes nothing Riverhouse does")
    sources: list[Source] = []
    for i, t in enumerate(cfg.source.topics):
        path = f"source.topics[{i}]"
        sid = t.id or t.name
        _source_extras(None, t.schema_registry, t.schema_version, None, path, result)
        if t.replicas is not None:
            result.drop(f"{path}.replicas", "Riverhouse reads every partition in Spark; parallelism follows partitions")
        fields: dict[str, tuple[str, str]] = {}
        if t.schema_ is not None:
            fields |= {f.name: (f.type.lower(), f"{path}.schema.fields[{j}]") for j, f in enumerate(t.schema_.fields)}
        fields |= {f.name: (f.type.lower(), f"{path}.schema_fields[{j}]") for j, f in enumerate(t.schema_fields or [])}
        fields |= {
            f.name: (f.type.lower(), f"schema.fields[{j}]") for j, f in enumerate(schema_fields) if f.source_id == sid
        }
        src = Source(sid, path, t.name, t.consumer_group_initial_offset, fields, cfg.source.connection_params)
        if t.deduplication and t.deduplication.enabled:
            key = t.deduplication.key or t.deduplication.id_field
            if not key or not t.deduplication.time_window:
                raise ImporterError(
                    result.path, [(f"{path}.deduplication", "enabled without id_field and time_window", "")]
                )
            src.dedup = (key, t.deduplication.time_window, f"{path}.deduplication")
            if key not in src.fields and t.deduplication.id_field_type:  # declared by its type only
                src.fields[key] = (t.deduplication.id_field_type.lower(), f"{path}.deduplication.id_field_type")
        sources.append(src)
    first = sources[0]
    if cfg.filter and cfg.filter.enabled and cfg.filter.expression:
        # Before GlassFlow 3.0 a filter named the events to DROP (docs: transformations/filter).
        first.filters.append((cfg.filter.expression, "filter", False))
    st = cfg.stateless_transformation
    if st and st.enabled and st.config and st.config.transform:
        target = next((s for s in sources if s.sid == st.source_id), first)
        for j, out in enumerate(st.config.transform):
            target.stateless[out.output_name] = (out, f"stateless_transformation.config.transform[{j}]")
    join = None
    if cfg.join is not None and cfg.join.enabled:
        by_side = {s.orientation: s for s in cfg.join.sources or []}
        if set(by_side) != {"left", "right"} or len(cfg.join.sources or []) != 2:
            raise ImporterError(result.path, [("join.sources", "needs one left and one right source", "")])
        idx = {s.orientation: i for i, s in enumerate(cfg.join.sources or [])}
        sides = []
        for o in ("left", "right"):
            s, where = by_side[o], f"join.sources[{idx[o]}]"
            key = s.join_key or s.key
            if not key:
                raise ImporterError(result.path, [(where, "no join_key", "name the field the streams join on")])
            if not s.join_key:
                result.note(f"{where}.key: read as the join key (GlassFlow's v2 reader names it join_key)")
            sides.append(JoinSide(s.source_id, key, s.time_window, where, s.join_key_type))
            declared = next((src for src in sources if src.sid == s.source_id), None)
            if declared is not None and s.join_key_type:
                if key not in declared.fields:  # declared by its type only
                    declared.fields[key] = (s.join_key_type.lower(), f"{where}.join_key_type")
                elif declared.fields[key][0] != s.join_key_type.lower():
                    result.note(
                        f"{where}.join_key_type: {s.join_key_type}, but {declared.fields[key][1]} declares "
                        f"{key!r} as {declared.fields[key][0]}: the declaration is used"
                    )
        outputs = None
        if cfg.join.fields:
            outputs = {r.output_name or r.source_name: (r.source_id, r.source_name) for r in cfg.join.fields}
        join = Join(sides[0], sides[1], outputs)
    sink = cfg.sink
    if sink.table_mapping:
        columns = [
            Column(m.field_name, m.column_name, m.column_type, m.source_id, f"sink.table_mapping[{i}]")
            for i, m in enumerate(sink.table_mapping)
        ]
    elif sink.mapping:
        columns = [
            Column(m.name, m.column_name, m.column_type, None, f"sink.mapping[{i}]") for i, m in enumerate(sink.mapping)
        ]
    else:
        columns = [
            Column(f.name, f.column_name, f.column_type, f.source_id, f"schema.fields[{i}]")
            for i, f in enumerate(schema_fields)
            if f.column_name and f.column_type
        ]
    if sink.provider:
        result.drop("sink.provider", "a label for GlassFlow's UI; it changes nothing Riverhouse does")
    if cfg.metadata and cfg.metadata.tags:
        result.drop("metadata.tags", "Riverhouse specs have no tags (Dagster owners are people or teams)")
    if cfg.pipeline_resources:
        result.drop("pipeline_resources", "Kubernetes sizing of GlassFlow's components: Riverhouse scales with Spark")
    connection = sink.connection_params
    if connection is None and sink.host:
        connection = gf.SinkConnection(
            host=sink.host,
            port=sink.port,
            http_port=sink.http_port,
            database=sink.database,
            secure=sink.secure,
            skip_certificate_verification=sink.skip_certificate_verification,
        )
    disabled = cfg.join is not None and not cfg.join.enabled and bool(cfg.join.sources)
    return Pipeline("v2", cfg.pipeline_id, cfg.name, sources, join, columns, sink, connection, sink.source_id, disabled)


def _source_extras(
    fmt: str | None, registry: Any, version: str | None, schema: Any, path: str, result: ImportResult
) -> None:
    avro = fmt is not None and fmt.lower() == "avro" and registry is not None
    if fmt and fmt.lower() not in ("json", "avro"):
        result.drop(f"{path}.format", f"{fmt}: Riverhouse sources read JSON and Avro messages")
    elif fmt and fmt.lower() == "avro" and registry is None:
        result.drop(f"{path}.format", "avro without schema_registry: Riverhouse reads Avro through a registry")
    if registry is not None and not avro:
        result.drop(
            f"{path}.schema_registry", "a JSON source: Riverhouse reads it with the fields declared in the spec"
        )
    if version:
        result.drop(f"{path}.schema_version", "the spec reads every version of the subject (each record names its own)")
    if schema is not None and (schema.file or schema.message_type):
        result.drop(
            f"{path}.schema.file", "an Avro/Protobuf schema file: the spec's reader schema is written from the fields"
        )
    if schema is not None and schema.parsed_fields:
        result.note(f"{path}.schema.parsed_fields: read-only in GlassFlow's API (ignored on create), and here")
