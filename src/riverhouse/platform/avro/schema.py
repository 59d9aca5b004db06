"""Avro schemas: the fields a record schema gives a source, and whether a writer's schema reads as the reader's.

The reader schema is the one a source's records are read into (the registry's latest version of
the subject when the run's spec was loaded, or the spec's own `avro.schema`); every record is
decoded with the schema its writer used (its id in the record's header) and resolved into the
reader's by Avro's rules (Spark's `from_avro` with `avroSchema`). `resolution_problem` states
those rules, so that a record written with an incompatible version is quarantined with the
reason instead of decoding into nulls.
"""

from __future__ import annotations

import json
from typing import Any

from riverhouse.platform.types import MAX_DECIMAL_PRECISION

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
# Avro type (or logical type) -> spec type (types.py); a decimal keeps its precision and scale.
_SCALAR_TYPES = {
    "boolean": "boolean",
    "int": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "enum": "string",
}
_LOGICAL_TYPES = {
    "timestamp-millis": "timestamp",
    "timestamp-micros": "timestamp",
    "local-timestamp-millis": "timestamp",
    "local-timestamp-micros": "timestamp",
    "date": "date",
    "uuid": "string",
}
# Writer type -> reader types it is promoted to (Avro specification, "Schema Resolution").
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}


class AvroSchemaError(ValueError):
    """A schema Riverhouse cannot read records with; the message names the field."""


def parse(text: str | dict[str, Any]) -> dict[str, Any]:
    """A record schema from its JSON text (or dict), checked by fastavro (names, defaults, logical types)."""
    import fastavro

    schema = json.loads(text) if isinstance(text, str) else text
    try:
        fastavro.parse_schema(schema)
    except Exception as exc:  # fastavro's SchemaParseException and friends
        raise AvroSchemaError(f"not a valid Avro schema: {exc}") from None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise AvroSchemaError("the schema of a source's records must be an Avro record")
    return schema


def fields_of(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec fields of a record schema: one per leaf, nested records as dotted paths."""
    names: dict[str, Any] = {}
    out: list[dict[str, Any]] = []

    def walk(record: dict[str, Any], prefix: tuple[str, ...]) -> None:
        _register(record, names)
        for field in record["fields"]:
            path = (*prefix, field["name"])
            label = ".".join(path)
            typ, _ = _unwrap_null(_deref(field["type"], names))
            if isinstance(typ, dict) and typ.get("type") == "record":
                walk(typ, path)
                continue
            out.append(
                {"name": "_".join(path), "type": _spec_type(typ, names, label), "path": label if prefix else None}
            )

    walk(schema, ())
    return [{k: v for k, v in f.items() if v is not None} for f in out]


def _spec_type(typ: Any, names: dict[str, Any], label: str, depth: int = 0) -> str:
    typ = _deref(typ, names)
    if isinstance(typ, str):
        if typ in _SCALAR_TYPES:
            return _SCALAR_TYPES[typ]
        raise AvroSchemaError(f"field '{label}' has Avro type {typ}, which a spec field cannot hold")
    if isinstance(typ, list):
        raise AvroSchemaError(f"field '{label}' is a union of several types: only [\"null\", T] is supported")
    kind, logical = typ.get("type"), typ.get("logicalType")
    if logical == "decimal" and depth == 0:
        precision, scale = int(typ.get("precision", 0)), int(typ.get("scale", 0))
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise AvroSchemaError(
                f"field '{label}' is a decimal of precision {precision}: Spark and ClickHouse hold at most "
                f"{MAX_DECIMAL_PRECISION} digits"
            )
        return f"decimal({precision},{scale})"
    if logical in _LOGICAL_TYPES and depth == 0:
        return _LOGICAL_TYPES[logical]
    if kind == "enum":
        return "string"
    if kind in ("array", "map"):
        inner, _ = _unwrap_null(_deref(typ["items" if kind == "array" else "values"], names))
        element = _spec_type(inner, names, label, depth + 1)
        if element in ("timestamp", "date"):
            raise AvroSchemaError(f"field '{label}': times inside an array or map are not supported")
        return f"array<{element}>" if kind == "array" else f"map<string,{element}>"
    if kind in _SCALAR_TYPES:
        return _SCALAR_TYPES[kind]
    raise AvroSchemaError(f"field '{label}' has Avro type {kind}, which a spec field cannot hold")


def resolution_problem(writer: dict[str, Any], reader: dict[str, Any]) -> str | None:
    """Why records written with `writer` cannot be read as `reader` (Avro's resolution rules), or None."""
    wnames: dict[str, Any] = {}
    rnames: dict[str, Any] = {}
    return _resolve(writer, reader, wnames, rnames, "")


def _resolve(w: Any, r: Any, wn: dict[str, Any], rn: dict[str, Any], at: str) -> str | None:
    w, r = _deref(w, wn), _deref(r, rn)
    where = f"field '{at}'" if at else "the record"
    if isinstance(w, list):  # every branch the writer may have used must read
        for branch in w:
            if problem := _resolve(branch, r, wn, rn, at):
                return problem
        return None
    if isinstance(r, list):
        if any(_resolve(w, branch, dict(wn), dict(rn), at) is None for branch in r):
            return None
        return f"{where}: the writer's {_kind(w)} matches no type of the reader's union"
    wk, rk = _kind(w), _kind(r)
    if wk != rk:
        if rk in _PROMOTIONS.get(wk, set()):
            return None
        return f"{where} is {wk} in the writer's schema and {rk} in the reader's"
    if wk == "record":
        _register(w, wn)
        _register(r, rn)
        written = {f["name"]: f for f in w["fields"]}
        for alias_field in w["fields"]:
            for alias in alias_field.get("aliases", []):
                written.setdefault(alias, alias_field)
        for field in r["fields"]:
            path = f"{at}.{field['name']}" if at else field["name"]
            source = written.get(field["name"]) or next(
                (written[a] for a in field.get("aliases", []) if a in written), None
            )
            if source is None:
                if "default" not in field:
                    return f"field '{path}' is in the reader's schema without a default, and not in the writer's"
                continue
            if problem := _resolve(source["type"], field["type"], wn, rn, path):
                return problem
        return None
    if wk == "enum":
        missing = [s for s in w.get("symbols", []) if s not in r.get("symbols", [])]
        if missing and "default" not in r:
            return f"{where}: the writer's enum has symbols the reader's lacks ({', '.join(missing[:5])})"
        return None
    if wk == "array":
        return _resolve(w["items"], r["items"], wn, rn, at)
    if wk == "map":
        return _resolve(w["values"], r["values"], wn, rn, at)
    if wk == "fixed" and w.get("size") != r.get("size"):
        return f"{where}: fixed of {w.get('size')} bytes in the writer's schema, {r.get('size')} in the reader's"
    return None


def _kind(typ: Any) -> str:
    return typ if isinstance(typ, str) else str(typ.get("type"))


def _unwrap_null(typ: Any) -> tuple[Any, bool]:
    """["null", T] (either order) -> (T, True); anything else -> (it, False)."""
    if isinstance(typ, list):
        others = [t for t in typ if t != "null"]
        if len(others) == 1 and len(typ) == 2:
            return others[0], True
    return typ, False


def _register(named: dict[str, Any], names: dict[str, Any]) -> None:
    if isinstance(named, dict) and named.get("type") in ("record", "enum", "fixed") and "name" in named:
        names[named["name"]] = named
        if named.get("namespace"):
            names[f"{named['namespace']}.{named['name']}"] = named


def _deref(typ: Any, names: dict[str, Any]) -> Any:
    """A named type's definition for a reference to it; a {"type": "int"} wrapper -> "int"."""
    if isinstance(typ, str) and typ not in PRIMITIVES:
        if typ in names:
            return names[typ]
        short = typ.rsplit(".", 1)[-1]
        return names.get(short, typ)
    if isinstance(typ, dict):
        _register(typ, names)
        if typ.get("type") in PRIMITIVES and "logicalType" not in typ:
            return typ["type"]
    return typ
