"""Field types: the one map from a spec type to what it is in Spark, Delta (Arrow), ClickHouse and the checks.

A spec type is a scalar (`string`, `int`, `long`, `float`, `double`, `boolean`, `timestamp`,
`date`, the exact `decimal(P,S)`) or a container of them: `array<T>` (a JSON array) and
`map<string,T>` (a JSON object with any keys), where T is a scalar other than
`timestamp`/`date`/`decimal`, or again a
container (`array<map<string,string>>`). Times inside containers stay text: Spark would
read a number there as epoch seconds, while the top-level rule reads epoch milliseconds.

Every layer asks this module, so a type means the same thing from `from_json` (ingest) to the
Delta table (state) to the ClickHouse column (sink) and the data-quality checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyarrow as pa

SCALARS = ("string", "int", "long", "float", "double", "boolean", "timestamp", "date")
NUMERIC = ("int", "long", "float", "double")
FLOATING = ("float", "double")
# Scalars a container may hold (see the module docstring for times).
ELEMENT_SCALARS = ("string", "int", "long", "float", "double", "boolean")
MAX_DEPTH = 4  # array<map<string,array<...>>>: deeper is a document, keep it as JSON text

CLICKHOUSE_SCALARS = {
    "string": "String",
    "int": "Int32",
    "long": "Int64",
    "float": "Float32",
    "double": "Float64",
    "boolean": "Bool",
    "timestamp": "DateTime64(6, 'UTC')",
    "date": "Date32",
}
ARROW_SCALARS: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}
# The Spark type (pyspark.sql.types class name) of a Delta column holding each scalar: what the
# quality suite expects a silver column to be (GX on Spark compares type classes by name).
SPARK_TYPE_NAMES: dict[str, str] = {
    "string": "StringType",
    "int": "IntegerType",
    "long": "LongType",
    "float": "FloatType",
    "double": "DoubleType",
    "boolean": "BooleanType",
    "timestamp": "TimestampType",
    "date": "DateType",
}
TYPE_HELP = (
    "string, int, long, float, double, boolean, timestamp, date, decimal(P,S), array<T> or map<string,T> "
    "(T: string, int, long, float, double, boolean, or an array/map of them)"
)
_TOKEN_RE = re.compile(r"\s*([A-Za-z]+|[0-9]+|<|>|,|\(|\))")
MAX_DECIMAL_PRECISION = 38  # Spark's DecimalType and ClickHouse's Decimal128


class SpecTypeError(ValueError):
    """A type text that is not a spec type (a ValueError, so pydantic reports it on the field)."""


@dataclass(frozen=True)
class FieldType:
    """A parsed spec type. `element` is set for containers (`array`, `map`)."""

    name: str
    element: FieldType | None = None
    # decimal(P,S): an exact number of P digits, S of them after the point (Spark, Arrow, ClickHouse alike).
    precision: int = 0
    scale: int = 0

    @property
    def is_container(self) -> bool:
        return self.element is not None

    @property
    def leaf(self) -> FieldType:
        """The innermost scalar (`array<map<string,long>>` -> long)."""
        return self.element.leaf if self.element is not None else self

    def __str__(self) -> str:
        if self.name == "array":
            return f"array<{self.element}>"
        if self.name == "map":
            return f"map<string,{self.element}>"
        if self.name == "decimal":
            return f"decimal({self.precision},{self.scale})"
        return self.name


@lru_cache(maxsize=1024)
def parse_type(text: str) -> FieldType:
    """'array<long>' -> FieldType('array', FieldType('long')); raises SpecTypeError naming the problem."""
    if not isinstance(text, str):
        raise SpecTypeError(f"type {text!r} is not a type name: use {TYPE_HELP}")
    tokens = [m.group(1).lower() for m in _TOKEN_RE.finditer(text)]
    if "".join(tokens) != re.sub(r"\s+", "", text).lower():
        raise SpecTypeError(f"type {text!r} is not a type: use {TYPE_HELP}")
    pos = 0

    def expect(token: str, example: str = "array<string> or map<string,long>") -> None:
        nonlocal pos
        if pos >= len(tokens) or tokens[pos] != token:
            raise SpecTypeError(f"type {text!r}: expected {token!r}; write e.g. {example}")
        pos += 1

    def number() -> int:
        nonlocal pos
        if pos >= len(tokens) or not tokens[pos].isdigit() or len(tokens[pos]) > 3:
            raise SpecTypeError(f"type {text!r}: write decimal(P,S) with whole numbers, e.g. decimal(10,2)")
        pos += 1
        return int(tokens[pos - 1])

    def parse(depth: int, inside: bool) -> FieldType:
        nonlocal pos
        if pos >= len(tokens):
            raise SpecTypeError(f"type {text!r} is incomplete: use {TYPE_HELP}")
        name = tokens[pos]
        pos += 1
        if name == "array":
            expect("<")
            element = parse(depth + 1, True)
            expect(">")
            typ = FieldType("array", element)
        elif name == "map":
            expect("<")
            expect("string")
            expect(",")
            element = parse(depth + 1, True)
            expect(">")
            typ = FieldType("map", element)
        elif name == "decimal":
            if inside:
                raise SpecTypeError(f"type {text!r}: arrays and maps hold {', '.join(ELEMENT_SCALARS)}, not decimals")
            expect("(", "decimal(10,2)")
            precision = number()
            expect(",", "decimal(10,2)")
            scale = number()
            expect(")", "decimal(10,2)")
            if not 1 <= precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
                raise SpecTypeError(
                    f"type {text!r}: decimal(P,S) needs 1 <= P <= {MAX_DECIMAL_PRECISION} and 0 <= S <= P"
                )
            typ = FieldType("decimal", precision=precision, scale=scale)
        elif name in SCALARS:
            if inside and name not in ELEMENT_SCALARS:
                raise SpecTypeError(
                    f"type {text!r}: arrays and maps hold {', '.join(ELEMENT_SCALARS)} (or arrays/maps), "
                    f"not {name}; keep times inside containers as string"
                )
            typ = FieldType(name)
        else:
            raise SpecTypeError(f"type {text!r}: unknown type {name!r}; use {TYPE_HELP}")
        if depth > MAX_DEPTH:
            raise SpecTypeError(
                f"type {text!r} nests more than {MAX_DEPTH} levels; keep the value as JSON text "
                "(type string with allow_json_text: true)"
            )
        return typ

    typ = parse(1, False)
    if pos != len(tokens):
        raise SpecTypeError(f"type {text!r} has text after the type: use {TYPE_HELP}")
    return typ


def canonical(text: Any) -> str:
    """The spec's own spelling of a type ('Array< Long >' -> 'array<long>')."""
    if not isinstance(text, str) or len(text) > 200:
        raise SpecTypeError(f"type {str(text)[:60]!r} is not a type name: use {TYPE_HELP}")
    return str(parse_type(text))


# ---------------------------------------------------------------------------- Spark (ingest)
def spark_read_type(typ: str) -> Any:
    """The Spark type `from_json` reads a value of this spec type into.

    Timestamps and dates are read as text and converted afterwards (ingest/parse.py): Spark
    would read a JSON number in a timestamp field as epoch seconds, producers send milliseconds.
    """
    from pyspark.sql import types as T

    def convert(t: FieldType) -> Any:
        if t.name == "array":
            return T.ArrayType(convert(t.element), containsNull=True)  # type: ignore[arg-type]
        if t.name == "map":
            return T.MapType(T.StringType(), convert(t.element), valueContainsNull=True)  # type: ignore[arg-type]
        return {
            "string": T.StringType(),
            "int": T.IntegerType(),
            "long": T.LongType(),
            "float": T.FloatType(),
            "double": T.DoubleType(),
            "boolean": T.BooleanType(),
            "timestamp": T.StringType(),
            "date": T.StringType(),
        }.get(t.name) or T.DecimalType(t.precision, t.scale)

    return convert(parse_type(typ))


def variant_shape(typ: str) -> str | None:
    """The Spark type name that reads this container from a VARIANT with its string leaves kept as
    VARIANT (so a JSON object or array where a string belongs can be told apart); None without string leaves."""
    t = parse_type(typ)
    if not t.is_container or t.leaf.name != "string":
        return None

    def shape(x: FieldType) -> str:
        if x.name == "array":
            return f"array<{shape(x.element)}>"  # type: ignore[arg-type]
        if x.name == "map":
            return f"map<string,{shape(x.element)}>"  # type: ignore[arg-type]
        return "variant"

    return shape(t)


# ---------------------------------------------------------------------------- Delta (state)
def arrow_type(typ: str) -> pa.DataType:
    """The Arrow type of a Delta column holding this spec type."""

    def convert(t: FieldType) -> pa.DataType:
        if t.name == "array":
            return pa.list_(convert(t.element))  # type: ignore[arg-type]
        if t.name == "map":
            return pa.map_(pa.string(), convert(t.element))  # type: ignore[arg-type]
        if t.name == "decimal":
            return pa.decimal128(t.precision, t.scale)
        return ARROW_SCALARS[t.name]

    return convert(parse_type(typ))


# ---------------------------------------------------------------------------- ClickHouse (sink)
def clickhouse_type(typ: str) -> str:
    """The ClickHouse type of a spec type, without the column's own Nullable (see `clickhouse_column`).

    Elements and map values may be JSON null, so scalar ones are Nullable; ClickHouse allows no
    Nullable around an Array or Map.
    """

    def inner(t: FieldType) -> str:
        text = convert(t)
        return text if t.is_container else f"Nullable({text})"

    def convert(t: FieldType) -> str:
        if t.name == "array":
            return f"Array({inner(t.element)})"  # type: ignore[arg-type]
        if t.name == "map":
            return f"Map(String, {inner(t.element)})"  # type: ignore[arg-type]
        if t.name == "decimal":
            return f"Decimal({t.precision}, {t.scale})"
        return CLICKHOUSE_SCALARS[t.name]

    return convert(parse_type(typ))


def clickhouse_column(column_type: str, not_null: bool) -> str:
    """A column's type: Nullable unless `not_null`; Array and Map never (a missing one loads as empty)."""
    if not_null or column_type.startswith(("Array(", "Map(")):
        return column_type
    return f"Nullable({column_type})"


class NoClickHouseType(ValueError):
    pass


def clickhouse_type_of_arrow(arrow: pa.DataType) -> str:
    """The ClickHouse type of an Arrow type (a join's output columns, typed by Spark), without the
    column's own Nullable; raises NoClickHouseType for types ClickHouse columns cannot take from Riverhouse."""
    if pa.types.is_string(arrow) or pa.types.is_large_string(arrow) or pa.types.is_string_view(arrow):
        return "String"
    if pa.types.is_boolean(arrow):
        return "Bool"
    if pa.types.is_integer(arrow):
        return ("UInt" if pa.types.is_unsigned_integer(arrow) else "Int") + str(arrow.bit_width)
    if pa.types.is_float32(arrow):
        return "Float32"
    if pa.types.is_floating(arrow):
        return "Float64"
    if pa.types.is_timestamp(arrow):
        return "DateTime64(6, 'UTC')"
    if pa.types.is_date(arrow):
        return "Date32"
    if pa.types.is_decimal(arrow):
        return f"Decimal({arrow.precision}, {arrow.scale})"
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return f"Array({_nullable_element(arrow.value_type)})"
    if pa.types.is_map(arrow):
        return f"Map({clickhouse_type_of_arrow(arrow.key_type)}, {_nullable_element(arrow.item_type)})"
    raise NoClickHouseType(f"type {arrow} has no ClickHouse column type")


def _nullable_element(arrow: pa.DataType) -> str:
    text = clickhouse_type_of_arrow(arrow)
    return text if text.startswith(("Array(", "Map(")) else f"Nullable({text})"


# ---------------------------------------------------------------------------- quality checks
def spark_type_names(typ: str) -> list[str]:
    """The Spark type class a Delta column of this type is read as (containers: ArrayType, MapType)."""
    t = parse_type(typ)
    if t.is_container:
        return ["ArrayType"] if t.name == "array" else ["MapType"]
    return ["DecimalType"] if t.name == "decimal" else [SPARK_TYPE_NAMES[t.name]]
