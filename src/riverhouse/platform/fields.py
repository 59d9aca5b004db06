"""A source's fields: the column name, the type, and where the value sits in the JSON record.

A field is read from the record's top-level key of its name, or from a nested `path`:

    fields:
      event_id: string
      user_id: {path: user.id, type: string}     # {"user": {"id": "u1"}} -> column user_id
      user.name: string                          # shorthand: column user_name, path user.name
      service: {path: [resource, service.name], type: string}   # a key that contains a dot

Columns keep flat identifiers (silver, gold and ClickHouse see `user_id`); only the JSON
parse (ingest/parse.py) follows the path. Wherever a spec names a field (keys, dedup key,
event time, join keys and selections, sink.order_by) it may write the field's path instead
of its name: `key: [user.id]` is the field whose path is user.id.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, PlainSerializer, model_validator

from riverhouse.platform.spec_base import IDENTIFIER_RE, StrictModel, check_column_name
from riverhouse.platform.types import FLOATING, NUMERIC, FieldType, canonical, parse_type

# A JSON key on a path: letters, digits and `_ - : @ / $`, plus `.` inside a list-form path.
# No quotes, brackets or backslashes: the path is written into JSON-path expressions.
PATH_SEGMENT_RE = re.compile(r"[A-Za-z0-9_\-:@/$.]{1,128}")
MAX_PATH_DEPTH = 8
# from_json's column for a malformed record (ingest/parse.py): no top-level JSON key may take it.
RESERVED_JSON_KEY = "_corrupt"


def parse_path(value: Any) -> tuple[str, ...]:
    """`user.id` or `[resource, service.name]` -> the keys from the record's top level down."""
    if isinstance(value, str):
        segments = value.split(".")
        dotted = True
    elif isinstance(value, list | tuple) and value and all(isinstance(s, str) for s in value):
        segments, dotted = list(value), False
    else:
        raise ValueError(f"path {value!r}: write the keys joined by '.', e.g. user.id, or a list of keys")
    for segment in segments:
        if not PATH_SEGMENT_RE.fullmatch(segment) or (dotted and "." in segment):
            raise ValueError(
                f"path {value!r}: key {segment!r} is empty or has characters other than letters, digits "
                "and _ - : @ / $ (a key with a dot goes in the list form: path: [resource, service.name])"
            )
    if len(segments) > MAX_PATH_DEPTH:
        raise ValueError(f"path {value!r} is deeper than {MAX_PATH_DEPTH} keys")
    if segments[0] == RESERVED_JSON_KEY:
        raise ValueError(f"path {value!r}: the top-level key {RESERVED_JSON_KEY!r} is reserved by Riverhouse's parser")
    return tuple(segments)


def format_path(segments: tuple[str, ...]) -> str | list[str]:
    return ".".join(segments) if not any("." in s for s in segments) else list(segments)


def _canonical_type(value: Any) -> str:
    return canonical(value)


JsonPath = Annotated[tuple[str, ...], BeforeValidator(parse_path), PlainSerializer(format_path)]
TypeName = Annotated[str, BeforeValidator(_canonical_type)]
ColumnName = Annotated[str, BeforeValidator(check_column_name)]


def normalize_field(data: Any) -> Any:
    """A dotted name is the shorthand for a path: `user.id` -> name user_id, path user.id."""
    if not isinstance(data, dict):
        return data
    name = data.get("name")
    if isinstance(name, str) and "." in name:
        if data.get("path") is not None:
            raise ValueError(
                f"field {name!r}: a dotted name is itself the path; with an explicit path, name the column "
                "with an identifier"
            )
        column = name.replace(".", "_")
        if not IDENTIFIER_RE.fullmatch(column):
            raise ValueError(
                f"field {name!r}: the column name made from the path, {column!r}, is not an identifier: "
                f"write {{name: <identifier>, path: {name}, type: ...}}"
            )
        data = {**data, "name": column, "path": name}
    return data


class FieldSpec(StrictModel):
    name: ColumnName
    type: TypeName
    # Where the value sits in the record (None: the top-level key `name`).
    path: JsonPath | None = None
    required: bool = False
    # Expected range (inclusive), checked by the Great Expectations suite before ClickHouse.
    min: float | None = None
    max: float | None = None
    # Opt-ins for values that are not what the type says, quarantined by default:
    # NaN/Infinity (not JSON, but Python's json.dumps writes them) in a float/double field,
    # and a JSON object or array in a string field (kept as its JSON text when allowed).
    # Both apply to the elements and values of arrays and maps too.
    allow_non_finite: bool = False
    allow_json_text: bool = False
    # A number in a timestamp field (or in a long event-time field) is epoch time in this unit.
    # Unset: milliseconds, and a number within EPOCH_SECONDS_LIKELY of 0 (1966-1973 as milliseconds;
    # any time up to the year 5138 as seconds) is quarantined, not read as 1970 (ingest/parse.py).
    epoch_unit: Literal["seconds", "milliseconds", "microseconds"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _dotted_name(cls, data: Any) -> Any:
        return normalize_field(data)

    @model_validator(mode="after")
    def _range_fits_type(self) -> FieldSpec:
        leaf = self.ftype.leaf.name
        if self.allow_non_finite and leaf not in FLOATING:
            raise ValueError(
                f"field {self.name!r}: allow_non_finite applies to float and double fields "
                f"(and arrays/maps of them), not {self.type}"
            )
        if self.allow_json_text and leaf != "string":
            raise ValueError(
                f"field {self.name!r}: allow_json_text applies to string fields (and arrays/maps of strings), "
                f"not {self.type}"
            )
        if self.epoch_unit is not None and self.type not in ("timestamp", "long"):
            raise ValueError(
                f"field {self.name!r}: epoch_unit applies to timestamp fields and to a long event-time field, "
                f"not {self.type}"
            )
        if (self.min is not None or self.max is not None) and self.type not in NUMERIC:
            raise ValueError(f"field {self.name!r}: min/max apply to numeric fields, not {self.type}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"field {self.name!r}: min {self.min} is greater than max {self.max}")
        return self

    @property
    def ftype(self) -> FieldType:
        return parse_type(self.type)

    @property
    def is_scalar(self) -> bool:
        return not self.ftype.is_container

    @property
    def segments(self) -> tuple[str, ...]:
        """The JSON keys from the record's top level to the value."""
        return self.path or (self.name,)

    @property
    def path_text(self) -> str:
        return ".".join(self.segments)

    @property
    def label(self) -> str:
        """How messages name the field: `'user_id' (user.id)` when the path is not the name."""
        return f"'{self.name}'" if self.segments == (self.name,) else f"'{self.name}' ({self.path_text})"


def fields_from_mapping(value: Any) -> Any:
    """Accept `{order_id: string, amount: {type: double, required: true}}` or a list."""
    if isinstance(value, dict):
        out = []
        for name, typ in value.items():
            if isinstance(typ, dict):
                out.append({"name": name, **typ})
            else:
                out.append({"name": name, "type": typ})
        return out
    return value


def check_paths(fields: list[FieldSpec]) -> None:
    """Paths must not repeat, nest inside another field's value, or differ only in case at one level."""
    by_path: dict[tuple[str, ...], str] = {}
    for f in fields:
        if f.segments in by_path:
            raise ValueError(f"fields {by_path[f.segments]!r} and {f.name!r} read the same path {f.path_text!r}")
        by_path[f.segments] = f.name
    for segments, name in by_path.items():
        for depth in range(1, len(segments)):
            parent = by_path.get(segments[:depth])
            if parent is not None:
                raise ValueError(
                    f"field {name!r} reads {'.'.join(segments)!r}, inside the value of field {parent!r}, "
                    f"{'.'.join(segments[:depth])!r}: declare either the object (e.g. a map or JSON text) "
                    "or the fields inside it"
                )
    # Spark resolves struct fields case-insensitively: `User.id` and `user.id` would be one field.
    keys_by_parent: dict[tuple[str, ...], dict[str, str]] = {}
    for segments in by_path:
        for depth in range(len(segments)):
            parent, key = segments[:depth], segments[depth]
            seen = keys_by_parent.setdefault(parent, {})
            other = seen.setdefault(key.lower(), key)
            if other != key:
                where = ".".join(parent) or "the top level"
                raise ValueError(
                    f"JSON keys {other!r} and {key!r} at {where} differ only in case: Spark reads them as one"
                )


# ---------------------------------------------------------------------------- references by path
def path_aliases(raw_fields: Any) -> dict[str, str]:
    """Path text -> field name, from a spec's raw `fields` (before validation), for paths that are not the name."""
    aliases: dict[str, str] = {}
    items = fields_from_mapping(raw_fields)
    if not isinstance(items, list):
        return aliases
    for item in items:
        try:
            item = normalize_field(item)
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or item.get("path") is None:
                continue
            text = ".".join(parse_path(item["path"]))
        except ValueError:
            continue  # the field's own validation reports it
        if text != item["name"]:
            aliases.setdefault(text, item["name"])
    return aliases


def resolve_refs(refs: Any, names: set[str], aliases: dict[str, str], where: str = "") -> Any:
    """Field references as written (names or paths) -> names. A dotted reference that is no field's path is
    refused here, naming the paths there are; anything else is left for validation to report."""
    if isinstance(refs, str):
        if refs in names or refs in aliases or "." not in refs:
            return refs if refs in names else aliases.get(refs, refs)
        known = ", ".join(sorted(aliases)) or "none: declare the field with a path"
        raise ValueError(f"{where}{refs!r} is not a field, nor the path of one (paths: {known})")
    if isinstance(refs, list):
        return [resolve_refs(r, names, aliases, where) for r in refs]
    return refs


def field_names(raw_fields: Any) -> set[str]:
    items = fields_from_mapping(raw_fields)
    names: set[str] = set()
    for item in items if isinstance(items, list) else []:
        try:
            item = normalize_field(item)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            names.add(item["name"])
    return names


def resolve_source_refs(data: Any) -> Any:
    """A raw source with its keys, dedup key and event-time field written as paths -> written as names."""
    if not isinstance(data, dict):
        return data
    aliases = path_aliases(data.get("fields"))
    names = field_names(data.get("fields"))
    data = dict(data)
    if "key" in data:
        data["key"] = resolve_refs(data["key"], names, aliases, "key: ")
    if isinstance(data.get("dedup"), dict) and "key" in data["dedup"]:
        key = resolve_refs(data["dedup"]["key"], names, aliases, "dedup.key: ")
        data["dedup"] = {**data["dedup"], "key": key}
    if isinstance(data.get("event_time"), dict) and "field" in data["event_time"]:
        field = resolve_refs(data["event_time"]["field"], names, aliases, "event_time.field: ")
        data["event_time"] = {**data["event_time"], "field": field}
    return data


def resolve_pipeline_refs(data: Any) -> Any:
    """Join keys, join selections and the sinks' order_by and key written as field paths -> field names."""
    if not isinstance(data, dict) or not isinstance(data.get("sources"), dict):
        return data
    sources = {n: s.get("fields") for n, s in data["sources"].items() if isinstance(s, dict)}
    aliases = {n: path_aliases(f) for n, f in sources.items()}
    names = {n: field_names(f) for n, f in sources.items()}
    data = dict(data)
    join = data.get("join")
    if isinstance(join, dict):
        join = {("on" if k is True else k): v for k, v in join.items()}  # YAML 1.1 reads `on:` as true
        left, right = join.get("left"), join.get("right")
        on = join.get("on")
        if isinstance(on, list):
            on = {"left": on, "right": on}
        if isinstance(on, dict):
            on = dict(on)
            for side, source in (("left", left), ("right", right)):
                if isinstance(source, str) and source in aliases and side in on:
                    on[side] = resolve_refs(on[side], names[source], aliases[source], f"join.on.{side}: ")
            join["on"] = on
        if isinstance(join.get("select"), dict):
            select = {}
            for out, ref in join["select"].items():
                source, dot, column = ref.partition(".") if isinstance(ref, str) else ("", "", "")
                if dot and isinstance(source, str) and source in aliases:
                    ref = f"{source}.{resolve_refs(column, names[source], aliases[source], f'join.select.{out}: ')}"
                select[out] = ref
            join["select"] = select
        data["join"] = join
    if join is not None or data.get("query") is not None:
        return data  # a join's sinks name output columns, not fields
    sinks = data.get("sinks")
    listed = [s for s in sinks if isinstance(s, dict)] if isinstance(sinks, list) else []
    # Every sink publishes one table: the source any of them states, or the only one.
    stated = next((s["source"] for s in [data.get("sink"), *listed] if isinstance(s, dict) and s.get("source")), None)
    source = stated or (next(iter(sources)) if len(sources) == 1 else None)
    if not isinstance(source, str) or source not in aliases:
        return data
    if isinstance(data.get("sink"), dict):
        data["sink"] = _resolve_sink(data["sink"], "sink", names[source], aliases[source])
    elif isinstance(sinks, list):
        data["sinks"] = [
            _resolve_sink(sink, f"sinks[{i}]", names[source], aliases[source]) if isinstance(sink, dict) else sink
            for i, sink in enumerate(sinks)
        ]
    return data


def _resolve_sink(sink: dict[str, Any], where: str, names: set[str], aliases: Any) -> dict[str, Any]:
    """A sink's `order_by` (ClickHouse) or `key` (Kafka) written as field paths -> field names."""
    sink = dict(sink)
    for setting in ("order_by", "key"):
        if setting in sink:
            sink[setting] = resolve_refs(sink[setting], names, aliases, f"{where}.{setting}: ")
    return sink


def check_epoch_units(fields: list[FieldSpec], event_time: str | None, record_format: str) -> None:
    """`epoch_unit` where a source can use it: a JSON timestamp, or the long that is the event time."""
    for f in fields:
        if f.epoch_unit is not None and f.type == "long" and f.name != event_time:
            raise ValueError(
                f"field {f.name!r}: epoch_unit on a long field applies to the event_time field only "
                "(any other long is stored as the number it is); declare it a timestamp to read it as a time"
            )
        if f.epoch_unit is not None and f.type == "timestamp" and record_format == "avro":
            raise ValueError(
                f"field {f.name!r}: epoch_unit applies to JSON records; an Avro timestamp has its unit "
                "in its logical type (timestamp-millis, timestamp-micros)"
            )
