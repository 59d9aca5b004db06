"""An imported source that another tool reads as Avro through a schema registry, as a Riverhouse Avro source.

The tools declare the source's fields (GlassFlow) or Riverhouse derives them from the query
(KaflowSQL); the spec gets those as its reader schema (`avro_schema`, every field optional),
so it validates without reaching the registry and reads exactly the declared columns. Removing
`avro_schema` makes it read the registry's latest version instead.
"""

from __future__ import annotations

from typing import Any

from riverhouse.platform.importers.report import ImportResult, secret_ref

_AVRO_OF = {
    "string": "string",
    "int": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "timestamp": {"type": "long", "logicalType": "timestamp-millis"},
    "date": {"type": "int", "logicalType": "date"},
}


def avro_settings(
    pipeline: str, url: str, fields: dict[str, Any], where: str, result: ImportResult, credentials: bool = False
) -> dict[str, Any]:
    """`format`, `schema_registry` and `avro_schema` for a source block whose `fields` are `fields`."""
    registry: dict[str, Any] = {"url": url}
    if credentials:
        registry["auth"] = {
            "username": secret_ref(pipeline, "REGISTRY_USERNAME"),
            "password": secret_ref(pipeline, "REGISTRY_PASSWORD"),
        }
    result.note(
        f"{where}: Avro through the schema registry at {url}; the reader schema (avro_schema) is written from the "
        "declared fields, every one optional: remove it to read the registry's latest version"
    )
    return {"format": "avro", "schema_registry": registry, "avro_schema": reader_schema(fields)}


def reader_schema(fields: dict[str, Any]) -> dict[str, Any]:
    """A record schema with each declared field (by its path: nested records) as ["null", type]."""
    root: dict[str, Any] = {}
    for name, declared in fields.items():
        typ = declared if isinstance(declared, str) else declared["type"]
        path = name if isinstance(declared, str) else declared.get("path", name)
        node = root
        segments = path.split(".")
        for segment in segments[:-1]:
            node = node.setdefault(segment, {})
        node[segments[-1]] = _avro_type(typ)

    def record(name: str, node: dict[str, Any]) -> dict[str, Any]:
        out = []
        for key, value in node.items():
            typ = record(f"{name}_{key}", value) if isinstance(value, dict) and "type" not in value else value
            out.append({"name": key, "type": ["null", typ], "default": None})
        return {"type": "record", "name": name, "fields": out}

    return record("Imported", root)


def _avro_type(typ: str) -> Any:
    if typ.startswith("decimal("):
        precision, scale = (int(n) for n in typ[8:-1].split(","))
        return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
    if typ.startswith("array<"):
        return {"type": "array", "items": _avro_type(typ[6:-1])}
    if typ.startswith("map<string,"):
        return {"type": "map", "values": _avro_type(typ[11:-1])}
    return _AVRO_OF[typ]
