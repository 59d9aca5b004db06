"""A GlassFlow field's type (and its sink column's type) as a spec type.

GlassFlow types a field loosely (`int`, `float`, `array`, `map`) and takes the width or the
element type from the ClickHouse column it maps to (docs: Data Formats, "Field type
mappings"). The same here: `float` into `Float32` is `float`, `array` into
`Array(Int64)` is `array<long>`, `map` into `Map(String, String)` is `map<string,string>`;
an array or object into a `String` column is kept as its JSON text, as GlassFlow writes it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

SCALAR_TYPES = {
    "string": "string",
    "bytes": "string",
    "datetime": "timestamp",
    "bool": "boolean",
    "boolean": "boolean",
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "uint8": "int",
    "uint16": "int",
    "int": "long",
    "integer": "long",
    "int64": "long",
    "uint": "long",
    "uint32": "long",
    "uint64": "long",
    "float": "double",
    "number": "double",
    "float64": "double",
    "float32": "float",
}
CONTAINER_TYPES = ("array", "map", "object")
NUMERIC_COLUMNS = {"Int8": "int", "Int16": "int", "Int32": "int", "UInt8": "int", "UInt16": "int"}
NUMERIC_COLUMNS |= {"Int64": "long", "UInt32": "long", "UInt64": "long", "Float32": "float", "Float64": "double"}
STRING_COLUMNS = ("String", "FixedString", "UUID", "Enum8", "Enum16", "IPv4", "IPv6")
WRAPPER_RE = re.compile(r"^(?:LowCardinality|Nullable)\((.*)\)$")


def base_column_type(column_type: str) -> str:
    """`LowCardinality(Nullable(String))` -> `String`."""
    text = column_type.strip()
    while (match := WRAPPER_RE.match(text)) is not None:
        text = match.group(1).strip()
    return text


def column_args(column_type: str) -> tuple[str, list[str]]:
    """`Map(String, Array(Int64))` -> ('Map', ['String', 'Array(Int64)'])."""
    name, _, rest = column_type.partition("(")
    if not rest.endswith(")"):
        return name.strip(), []
    args, depth, current = [], 0, ""
    for char in rest[:-1]:
        if char == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        depth += char == "("
        depth -= char == ")"
        current += char
    return name.strip(), [*args, current.strip()] if current.strip() else args


def element_type(column_type: str) -> str | None:
    """The spec type of an array element or map value stored in this ClickHouse type (None: no mapping)."""
    base = base_column_type(column_type)
    name, args = column_args(base)
    if name == "Array" and len(args) == 1:
        inner = element_type(args[0])
        return f"array<{inner}>" if inner else None
    if name == "Map" and len(args) == 2:
        inner = element_type(args[1])
        return f"map<string,{inner}>" if inner else None
    if name in STRING_COLUMNS or name.startswith(("DateTime", "Date")):
        return "string"  # times inside containers stay text (types.py)
    if name in NUMERIC_COLUMNS:
        return NUMERIC_COLUMNS[name]
    if name == "Bool":
        return "boolean"
    return None


class Mapped(NamedTuple):
    """A GlassFlow field as a spec field: its type, whether JSON text is kept, a note (may be empty) on
    what the mapping changes, and the epoch unit of a number read as a time."""

    type: str
    json_text: bool
    note: str
    epoch_unit: str | None = None


# GlassFlow reads an integer going into a DateTime column as Unix seconds (its ParseDateTimeFromInt64:
# time.Unix(v, 0)); a float as fractional seconds, which a Riverhouse timestamp does not take.
INTEGER_TYPES = frozenset(t for t, spec in SCALAR_TYPES.items() if spec in ("int", "long"))


def spec_type(gf_type: str, column_type: str | None, avro: bool = False) -> Mapped | None:
    """The spec field for a GlassFlow type loaded into `column_type`; None: no mapping.

    `avro`: the source's records are Avro, whose times carry their unit in the schema.
    """
    base = base_column_type(column_type or "")
    if gf_type in CONTAINER_TYPES:
        if base in STRING_COLUMNS or (not column_type and gf_type in ("map", "object")):
            # GlassFlow writes an array or object into a String column as its JSON text; an unmapped
            # map is read as a map of strings (GlassFlow converts map values to strings).
            if not column_type:
                return Mapped("map<string,string>", True, "")
            return Mapped(
                "string", True, f"kept as JSON text (the {column_type} column receives the {gf_type} as JSON)"
            )
        if not column_type:
            return None
        name, _ = column_args(base)
        if (gf_type == "array" and name != "Array") or (gf_type in ("map", "object") and name not in ("Map", "Array")):
            return None
        typ = element_type(base)
        if typ is None:
            return None
        note = "times inside arrays and maps are kept as text" if "Date" in base else ""
        # GlassFlow converts map values to strings; JSON text inside string maps is kept the same way.
        return Mapped(typ, typ.endswith("string>") and gf_type in ("map", "object"), note)
    if gf_type not in SCALAR_TYPES:
        return None
    typ = SCALAR_TYPES[gf_type]
    note = ""
    if typ in ("int", "long", "float", "double") and base in NUMERIC_COLUMNS:
        typ = NUMERIC_COLUMNS[base]  # GlassFlow's `int`/`float` take their width from the column
    if gf_type in ("string", "bytes") and base.startswith("DateTime"):
        typ = "timestamp"  # GlassFlow parses ISO 8601 text into DateTime columns; so does `timestamp`
    elif gf_type in ("string", "bytes") and base in ("Date", "Date32"):
        typ = "date"
    elif gf_type in INTEGER_TYPES and base.startswith("DateTime") and not avro:
        # Filters and transforms still see the number GlassFlow's expressions saw (expr.FieldRef).
        return Mapped("timestamp", False, "holds Unix seconds: a timestamp with epoch_unit: seconds", "seconds")
    elif gf_type not in ("string", "bytes", "datetime") and base.startswith("DateTime"):
        seconds = (
            "Unix seconds" if gf_type in INTEGER_TYPES else "fractional Unix seconds, which a timestamp does not take"
        )
        note = f"holds {seconds}: Riverhouse loads it as a number, not a DateTime"
    if gf_type == "uint64":
        note = "is uint64; values above 2^63-1 go to quarantine (Riverhouse long is signed)"
    return Mapped(typ, False, note)
