"""How a Kafka sink writes rows: record values and keys as bytes, from an Arrow chunk.

`encoder_for(sink, ...)` is the one place a format is chosen. JSON is built column by column
with Arrow's compute kernels (a row's text is the columns' fragments joined), which is what keeps
the driver from being the bottleneck: a Python `json.dumps` per row costs about ten times more.
Avro, with the schema registry, is another `RowEncoder` (sink/topic_avro.py).

JSON values, one object per record, columns in the output's order:
- strings as JSON strings; integers and floats as numbers; booleans; null as `null`;
- `NaN`, `Infinity`, `-Infinity` as those strings (JSON has no such numbers);
- timestamps as ISO 8601 UTC with microseconds (`2026-01-01T10:00:00.123456Z`), dates as `YYYY-MM-DD`,
  decimals as strings (exact);
- arrays as arrays, maps as objects.
Keys: one key column -> its value as text (a string as is, a timestamp in ISO 8601); several ->
a JSON object of them; a null single key -> no key.
"""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

CONTROL_CHARACTERS = r"[\x00-\x1f]"


class RowEncoder(Protocol):
    """Turns a chunk of rows into record values and keys (`None` where a record has no key)."""

    content_type: str

    def prepare(self, rows: pa.Table) -> None:
        """Whatever must happen before these rows are produced, outside the transaction (a schema's registration)."""

    def values(self, rows: pa.Table) -> list[bytes]: ...

    def keys(self, rows: pa.Table) -> list[bytes | None]: ...


class JsonRows:
    content_type = "application/json"

    def __init__(self, columns: list[str], key: list[str]):
        self.columns = columns
        self.key = key

    def prepare(self, rows: pa.Table) -> None:
        pass

    def values(self, rows: pa.Table) -> list[bytes]:
        return _as_bytes(json_objects(rows, self.columns))

    def keys(self, rows: pa.Table) -> list[bytes | None]:
        if not self.key:
            return [None] * rows.num_rows
        if len(self.key) == 1:
            return _as_bytes(key_text(rows.column(self.key[0])))
        return _as_bytes(json_objects(rows, self.key))


def json_objects(rows: pa.Table, columns: list[str]) -> pa.Array:
    """One JSON object per row (a string array) holding `columns`."""
    if rows.num_rows == 0:
        return pa.array([], pa.string())
    parts: list[Any] = []
    for index, name in enumerate(columns):
        parts.append(("{" if index == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":")
        parts.append(json_fragments(rows.column(name)))
    parts.append("}")
    return pc.binary_join_element_wise(*parts, "")


def json_fragments(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Each value of `column` as JSON text (`null` for nulls)."""
    array = _one_array(column)
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        array = array.cast(pa.string())
        if pc.any(pc.match_substring_regex(array, CONTROL_CHARACTERS)).as_py():
            return _python_fragments(array)  # \n, \t, ... need JSON's escapes: rare, done by json
        escaped = pc.replace_substring(pc.replace_substring(array, "\\", "\\\\"), '"', '\\"')
        text = pc.binary_join_element_wise('"', escaped, '"', "")
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        text = array.cast(pa.string())
    elif pa.types.is_floating(kind):
        text = array.cast(pa.string())
        if pc.any(pc.or_(pc.is_nan(array), pc.is_inf(array))).as_py():
            text = pc.if_else(pc.is_nan(array), '"NaN"', text)
            text = pc.if_else(pc.equal(array, math.inf), '"Infinity"', text)
            text = pc.if_else(pc.equal(array, -math.inf), '"-Infinity"', text)
    elif pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_decimal(kind):
        text = pc.binary_join_element_wise('"', _scalar_text(array), '"', "")
    else:
        return _python_fragments(array)
    return pc.fill_null(text, "null")


def key_text(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A single key column's values as text (strings as they are); null stays null (no key)."""
    array = _one_array(column)
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return array.cast(pa.string())
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_decimal(kind):
        return _scalar_text(array)
    return pc.if_else(pc.is_null(array), pa.scalar(None, pa.string()), json_fragments(array))


def _scalar_text(array: pa.Array) -> pa.Array:
    """Timestamps as ISO 8601 UTC (`...T10:00:00.123456Z`), dates and decimals as Arrow writes them."""
    if pa.types.is_timestamp(array.type):
        # A naive cast prints the UTC wall time ("2026-01-01 10:00:00.123456") fast; with a time
        # zone Arrow formats each value through the zone database (~30x slower).
        micros = array.cast(pa.timestamp("us", tz=array.type.tz), safe=False).cast(pa.int64())
        naive = micros.cast(pa.timestamp("us"))
        text = pc.utf8_replace_slice(naive.cast(pa.string()), 10, 11, "T")
        return pc.binary_join_element_wise(text, "Z", "")
    return array.cast(pa.string())


def _python_fragments(array: pa.Array) -> pa.Array:
    """JSON text of values Arrow has no kernel for (arrays, maps, strings with control characters)."""
    out = [
        None if v is None else json.dumps(_plain(v), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        for v in _pylist(array)
    ]
    return pc.fill_null(pa.array(out, pa.string()), "null")


def _pylist(array: pa.Array) -> list[Any]:
    """Python values, maps as dicts (Arrow gives a map as a list of (key, value) pairs)."""
    return [maps_as_dicts(v, array.type) for v in array.to_pylist()]


def maps_as_dicts(value: Any, kind: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {str(k): maps_as_dicts(v, kind.item_type) for k, v in value}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [maps_as_dicts(v, kind.value_type) for v in value]
    if pa.types.is_struct(kind):
        return {f.name: maps_as_dicts(value.get(f.name), f.type) for f in kind}
    return value


def _plain(value: Any) -> Any:
    """A Python value as JSON can hold it, by the rules of this module's docstring."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


def _one_array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _as_bytes(text: pa.Array) -> list[Any]:
    return text.cast(pa.binary()).to_pylist()
