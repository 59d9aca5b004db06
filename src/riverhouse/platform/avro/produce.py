"""The generator's records as Avro in the Confluent wire format, through a schema registry.

`riverhouse generate --format avro` and the tests produce with it: each kind's schema is
registered under `<topic>-value` (the id comes back, idempotently), every valid record is
encoded with fastavro after the five-byte header (a zero byte, the id big-endian), and the
generator's malformed records become the Avro ways a record goes wrong: a wrong first byte, a
schema id the registry does not have, a body cut short.
"""

from __future__ import annotations

import io
import json
import struct
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from riverhouse.platform.avro.registry import CONTENT_TYPE

TIMESTAMP = {"type": "long", "logicalType": "timestamp-millis"}
SCHEMAS: dict[str, dict[str, Any]] = {
    "orders": {
        "type": "record",
        "name": "Order",
        "namespace": "riverhouse.demo",
        "fields": [
            {"name": "order_id", "type": "string"},
            {"name": "user_id", "type": "string"},
            {"name": "amount", "type": "int"},
            {"name": "price", "type": "double"},
            {"name": "created_at", "type": TIMESTAMP},
        ],
    },
    "user_events": {
        "type": "record",
        "name": "UserEvent",
        "namespace": "riverhouse.demo",
        "fields": [
            {"name": "event_id", "type": "string"},
            {"name": "user_id", "type": "string"},
            {"name": "name", "type": "string"},
            {"name": "email", "type": "string"},
            {"name": "created_at", "type": TIMESTAMP},
        ],
    },
    "user_tiers": {
        "type": "record",
        "name": "UserTier",
        "namespace": "riverhouse.demo",
        "fields": [
            {"name": "user_id", "type": "string"},
            {"name": "tier", "type": "string"},
            {"name": "updated_at", "type": TIMESTAMP},
        ],
    },
}
UNKNOWN_ID = 2**31 - 1  # a schema id no registry hands out this early


def register(api: str, subject: str, schema: dict[str, Any]) -> int:
    """Register `schema` under `subject` (or find it there); its schema id."""
    request = urllib.request.Request(
        f"{api.rstrip('/')}/subjects/{subject}/versions",
        method="POST",
        data=json.dumps({"schema": json.dumps(schema)}).encode(),
        headers={"Content-Type": CONTENT_TYPE},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read())["id"])


def encode(schema: dict[str, Any], record: dict[str, Any], schema_id: int) -> bytes:
    """One record in the wire format (`schema` as fastavro.parse_schema gives it, or raw)."""
    import fastavro

    buffer = io.BytesIO()
    buffer.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


def as_avro(
    records: Iterator[tuple[bytes | None, bytes | None]], schema: dict[str, Any], schema_id: int
) -> Iterator[tuple[bytes | None, bytes | None]]:
    """The generator's JSON records, re-encoded; its malformed ones as malformed Avro (in turn)."""
    import fastavro

    parsed = fastavro.parse_schema(schema)
    times = {f["name"] for f in schema["fields"] if isinstance(f["type"], dict) and f["type"].get("logicalType")}
    bad = 0
    for key, value in records:
        record = _valid(value, schema, times)
        if record is None:
            yield key, _malformed(bad, schema, schema_id)
            bad += 1
            continue
        yield key, encode(parsed, record, schema_id)


def _valid(value: bytes | None, schema: dict[str, Any], times: set[str]) -> dict[str, Any] | None:
    try:
        record = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    names = [f["name"] for f in schema["fields"]]
    if not isinstance(record, dict) or any(not isinstance(record.get(n), _python_type(schema, n)) for n in names):
        return None
    return {n: (_millis(record[n]) if n in times else record[n]) for n in names}


def _python_type(schema: dict[str, Any], name: str) -> type | tuple[type, ...]:
    typ = next(f["type"] for f in schema["fields"] if f["name"] == name)
    if isinstance(typ, dict):
        return str  # the generator writes times as ISO text
    return {"string": str, "int": int, "long": int, "double": (int, float), "float": (int, float)}[typ]


def _millis(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _malformed(index: int, schema: dict[str, Any], schema_id: int) -> bytes:
    kind = index % 3
    if kind == 0:
        return b"\x01" + struct.pack(">I", schema_id) + b"not avro"  # not the wire format
    if kind == 1:
        return struct.pack(">bI", 0, UNKNOWN_ID) + b"\x02a"  # an id the registry does not have
    return struct.pack(">bI", 0, schema_id) + b"\x02"  # the body cut short
