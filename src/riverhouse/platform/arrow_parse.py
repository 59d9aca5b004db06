"""The fast path of the JSON parse: Arrow's C++ JSON reader, in the Kafka source's executors.

Spark's `from_json` (Jackson, one reader per record) was the largest single cost of a
micro-batch. The source now parses each block of records with `pyarrow.json` while it
still holds them as Arrow, and hands Spark the typed fields in a `_parsed` column.

Only blocks Arrow reads exactly as Spark would take this path. A block falls back
(its `_parsed` rows are null, and `parse.parse_records` runs `from_json` on them) when
any record in it is null, larger than `max_message_bytes`, not valid UTF-8, not a
single JSON object on one line, or has a value Arrow would not read as the declared
type (a number in a string field, 1.5 in an int field, an int32 overflow...). So the
JVM parse stays the reference: every rejected record gets its reason there, and the
fast path only ever skips work for records both parsers agree on
(tests/spark/test_arrow_parse.py checks the two give identical rows).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

CORRUPT = "_corrupt"
PARSED_COLUMN = "_parsed"
# Records per Arrow parse: a bad record sends only its block to the JVM parse.
BLOCK_ROWS = 4096
# Declared type -> what Arrow reads. Timestamps and dates stay text, as in the JVM parse
# (which converts them). `float` is left out: Spark reads it straight into 32 bits, Arrow
# through a double, and the two roundings can differ, so such sources use the JVM parse.
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.string(),
    "date": pa.string(),
}


def supported(field_types: list[tuple[str, str]]) -> bool:
    return bool(field_types) and all(t in ARROW_TYPES for _, t in field_types)


def encode_fields(field_types: list[tuple[str, str]]) -> str:
    return json.dumps([[name, typ] for name, typ in field_types])


def decode_fields(text: str) -> list[tuple[str, str]]:
    fields = [(str(name), str(typ)) for name, typ in json.loads(text)]
    if not supported(fields):
        raise ValueError(f"unsupported field types for the Arrow JSON parse: {text}")
    return fields


def struct_type(fields: list[tuple[str, str]]) -> pa.StructType:
    return pa.struct([pa.field(n, ARROW_TYPES[t]) for n, t in fields] + [pa.field(CORRUPT, pa.string())])


class ArrowJsonParser:
    """Parses blocks of Kafka values into the `_parsed` struct column (null where it falls back)."""

    def __init__(self, fields: list[tuple[str, str]], max_message_bytes: int, block_rows: int = BLOCK_ROWS):
        self.type = struct_type(fields)
        self.schema = pa.schema([pa.field(n, ARROW_TYPES[t]) for n, t in fields])
        self.options = pj.ParseOptions(explicit_schema=self.schema, unexpected_field_behavior="ignore")
        self.max_message_bytes = max_message_bytes
        self.block_rows = block_rows
        self.fast_rows = 0
        self.fallback_rows = 0

    def parse(self, values: list[bytes | None]) -> pa.StructArray:
        pieces = []
        for start in range(0, len(values), self.block_rows):
            block = values[start : start + self.block_rows]
            parsed = self._block(block)
            if parsed is None:
                self.fallback_rows += len(block)
                pieces.append(pa.nulls(len(block), self.type))
            else:
                self.fast_rows += len(block)
                pieces.append(parsed)
        if not pieces:
            return pa.array([], self.type)
        return pa.concat_arrays(pieces)

    def _block(self, block: list[Any]) -> pa.StructArray | None:
        count = len(block)
        array = pa.array(block, pa.binary())
        if array.null_count:
            return None
        # One JSON object per record, on one line: anything else (a bare `null` even
        # crashes Arrow's reader) is left to the JVM parse.
        if not (pc.all(pc.starts_with(array, "{")).as_py() and pc.all(pc.ends_with(array, "}")).as_py()):
            return None
        if pc.max(pc.binary_length(array)).as_py() > self.max_message_bytes:
            return None
        try:
            array.cast(pa.string())  # UTF-8 check: Arrow's JSON reader does not make one
        except pa.ArrowInvalid:
            return None
        text = b"\n".join(block)
        if text.count(b"\n") != count - 1 or b"\r" in text:
            return None
        try:
            table = pj.read_json(
                pa.BufferReader(text),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(text) + 1),
                parse_options=self.options,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        if table.num_rows != count:  # e.g. two objects in one record
            return None
        table = table.select(self.schema.names).cast(self.schema)
        columns = [c.combine_chunks() for c in table.columns]
        columns.append(pa.nulls(count, pa.string()))
        return pa.StructArray.from_arrays(columns, fields=list(self.type))
