"""What every record format's parse shares: the checks' shape, field access, the rule for non-finite numbers.

`parse.py` (JSON, and the common part every record goes through) and `avro.py` (Avro) both use them.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from riverhouse.platform.spec import SourceSpec
from riverhouse.platform.types import FLOATING, FieldType

# A check: when the condition holds, the record is rejected with the reason.
Check = tuple[Column, Column | str]
# What a format's decoder gives the common part: the frame, each field's typed value, the checks
# of the record's form (before the required fields) and of its values (after them).
Decoded = tuple[DataFrame, dict[str, Column], list[Check], list[Check]]


def at_path(parsed: Column, segments: tuple[str, ...]) -> Column:
    col = parsed
    for key in segments:
        col = col.getField(key)
    return col


def any_leaf(col: Column, typ: FieldType, test: Callable[[Column], Column]) -> Column:
    """Does `test` hold for any scalar inside this value (the value itself for a scalar)?"""
    if typ.element is None:
        return test(col)
    element = typ.element
    values = col if typ.name == "array" else F.map_values(col)
    return F.exists(values, lambda x: any_leaf(x, element, test))


def non_finite_checks(src: SourceSpec, raw: dict[str, Column]) -> list[Check]:
    """NaN/Infinity in a float or double field (or inside an array or map of them), unless allowed."""
    return [
        (
            any_leaf(raw[f.name], f.ftype, lambda x: F.isnan(x) | (F.abs(x) == F.lit(float("inf")))),
            f"field {f.label} {'holds a number that is not finite' if f.ftype.is_container else 'is not a finite number'}"
            " (NaN or Infinity); set allow_non_finite: true on the field to accept such values",
        )
        for f in src.fields
        if f.ftype.leaf.name in FLOATING and not f.allow_non_finite
    ]
