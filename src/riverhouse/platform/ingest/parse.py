"""Parse and validate Kafka records (Spark SQL), one status and reason per record.

Nothing here runs per-record Python: the JSON parse (`from_json`), UTF-8 checks, type
checks and reasons are Spark expressions, part of the streaming query's plan, so they
run on the executors at JVM speed. This is the one implementation of every rule.
"""

from __future__ import annotations

import datetime
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from riverhouse.platform.spec import SourceSpec

CORRUPT = "_corrupt"  # from_json's column for a value that is not a JSON object of these types
# Epoch milliseconds written as text: what producers send in a timestamp field as a number.
EPOCH_MILLIS_RE = r"^-?[0-9]{1,15}$"

# Timestamps and dates are read as text and converted here: Spark would read a JSON
# number in a timestamp field as epoch *seconds*, while producers send milliseconds.
JSON_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
    "timestamp": StringType(),
    "date": StringType(),
}

MAX_ABS_EPOCH_MILLIS = 10**15


def json_struct(field_types: list[tuple[str, str]]) -> StructType:
    """What `from_json` reads a value into."""
    return StructType(
        [StructField(name, JSON_TYPES[typ]) for name, typ in field_types] + [StructField(CORRUPT, StringType())]
    )


def _epoch_millis_to_ts(col: Column) -> Column:
    millis = col.try_cast("long")
    return F.when(F.abs(millis) < F.lit(MAX_ABS_EPOCH_MILLIS), F.timestamp_millis(millis))


def _typed(raw: Column, typ: str) -> Column:
    if typ == "timestamp":
        return F.when(raw.rlike(EPOCH_MILLIS_RE), _epoch_millis_to_ts(raw)).otherwise(F.try_to_timestamp(raw))
    if typ == "date":
        return raw.try_cast("date")
    return raw


def _first_reason(candidates: list[tuple[Column, Column | str]]) -> Column:
    """CASE WHEN c1 THEN r1 WHEN c2 THEN r2 ... END: the first failed check names the record."""
    expr: Any = F
    for condition, reason in candidates:
        value = reason if isinstance(reason, Column) else F.lit(reason)
        expr = expr.when(condition, value)
    return expr


# NaN / Infinity as bare tokens (Jackson, and so `from_json`, reads them; strict JSON does not),
# turned into 0 before the strict parse so that they do not read as a broken record: the
# non-finite checks below decide about them.
NON_FINITE_TOKEN_RE = r"([:\[,]\s*)[-+]?(NaN|Infinity)(\s*[,}\]])"


def _strict_json(text: Column) -> Column:
    """The record as Spark's strict JSON parser reads it (a variant), NULL when it refuses it.

    `parse_json` refuses a key given twice in one object, at any depth (Spark's default,
    spark.sql.variant.allowDuplicateKeys=false), where `from_json` silently keeps one of the
    values. The plain parse comes first: the NaN-neutralizing one runs only when it fails.
    """
    return F.coalesce(F.try_parse_json(text), F.try_parse_json(F.regexp_replace(text, NON_FINITE_TOKEN_RE, "$10$3")))


def _json_token_is_container(strict: Column, name: str) -> Column:
    """Is the record's top-level `name` (in its strict parse) a JSON object or array (not a string)?"""
    kind = F.schema_of_variant(F.try_variant_get(strict, f"$.{name}", "variant"))
    return kind.startswith("OBJECT") | kind.startswith("ARRAY")


def _duplicate_key(text: Column) -> Column:
    """The first key given twice at the top level of the record, else NULL."""
    keys = F.json_object_keys(text)
    return F.try_element_at(F.filter(keys, lambda k: F.size(F.filter(keys, lambda other: other == k)) > 1), F.lit(1))


def _snippet(col: Column) -> Column:
    return F.substring(col, 1, 60)


def parse_records(batch: DataFrame, src: SourceSpec) -> DataFrame:
    """Kafka rows -> typed fields + _status/_reason/_event_time/_event_date (+ raw columns)."""
    json_schema = json_struct([(f.name, f.type) for f in src.fields])
    size = F.octet_length(F.col("value"))
    oversized = size > F.lit(src.max_message_bytes)
    text = F.when(~oversized, F.col("value").cast("string"))
    df = batch.withColumn("_text", text)
    jvm_parse = F.when(
        F.is_valid_utf8(F.col("_text")),
        # Strict about quoting: single-quoted JSON is not JSON (Spark's default reads it, and its
        # object values then reached string fields unchecked: the strict parse below refuses it).
        F.from_json(
            F.col("_text"),
            json_schema,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT, "allowSingleQuotes": "false"},
        ),
    )
    # The strict parse once per record (a column, not repeated in every check that reads it).
    df = df.withColumn("_p", jvm_parse).withColumn(
        "_strict", F.when(F.col("_p").isNotNull(), _strict_json(F.col("_text")))
    )
    parsed, strict = F.col("_p"), F.col("_strict")
    typed = {f.name: _typed(parsed[f.name], f.type) for f in src.fields}

    wrong_type = [
        (
            F.get_json_object(F.col("_text"), f"$.{f.name}").isNotNull() & parsed[f.name].isNull(),
            F.concat(
                F.lit(f"field '{f.name}' should be {f.type}, got "),
                _snippet(F.get_json_object(F.col("_text"), f"$.{f.name}")),
            ),
        )
        for f in src.fields
    ]
    unconvertible = [
        (
            parsed[f.name].isNotNull() & typed[f.name].isNull(),
            F.concat(F.lit(f"field '{f.name}' is not a valid {f.type}: "), _snippet(parsed[f.name])),
        )
        for f in src.fields
        if f.type in ("timestamp", "date")
    ]
    missing = [(typed[name].isNull(), f"missing required field '{name}'") for name in src.required_fields]
    # Values the declared type admits in Spark but the spec does not mean: NaN/Infinity (not
    # JSON; Jackson reads them, and 1e999 overflows to Infinity) would turn a ClickHouse sum()
    # into NaN; an object or array in a string field would be stored as its JSON text.
    non_finite = [
        (
            F.isnan(parsed[f.name]) | (F.abs(parsed[f.name]) == F.lit(float("inf"))),
            f"field '{f.name}' is not a finite number (NaN or Infinity); "
            "set allow_non_finite: true on the field to accept such values",
        )
        for f in src.fields
        if f.type in ("float", "double") and not f.allow_non_finite
    ]
    json_in_string = [
        (
            # Cheap test first (CASE stops at it for ordinary strings); the variant parse then
            # tells a JSON object/array from a string that merely starts with '{' or '['.
            (parsed[f.name].startswith("{") | parsed[f.name].startswith("["))
            & F.coalesce(_json_token_is_container(strict, f.name), F.lit(False)),
            f"field '{f.name}' should be string, got a JSON object or array; "
            "set allow_json_text: true on the field to keep its JSON text",
        )
        for f in src.fields
        if f.type == "string" and not f.allow_json_text
    ]

    et = src.event_time
    if et.field is None:
        event_time = F.col("timestamp")
    elif src.field(et.field).type == "long":
        event_time = _epoch_millis_to_ts(typed[et.field])
    else:
        event_time = typed[et.field]
    event_time_checks: list[tuple[Column, Column | str]] = []
    if et.field is not None and et.fallback == "quarantine":
        event_time_checks.append((event_time.isNull(), f"missing event time field '{et.field}'"))
    elif et.field is not None:
        event_time = F.coalesce(event_time, F.col("timestamp"))
    if et.field is not None and src.field(et.field).type == "long":
        event_time_checks.append(
            (
                typed[et.field].isNotNull() & _epoch_millis_to_ts(typed[et.field]).isNull(),
                f"event time field '{et.field}' is out of range for epoch milliseconds",
            )
        )

    reason = _first_reason(
        [
            (F.col("value").isNull(), "empty message (null value)"),
            (
                oversized,
                F.concat(
                    F.lit("message of "),
                    size.cast("string"),
                    F.lit(f" bytes is larger than max_message_bytes={src.max_message_bytes}"),
                ),
            ),
            (~F.is_valid_utf8(F.col("_text")), "value is not valid UTF-8"),
            (parsed.isNull(), "value could not be parsed"),
            # One rule for a key given twice, at any depth: the record is quarantined (readers keep different
            # values: from_json the last, get_json_object the first), naming the key when it is a top-level one.
            (
                strict.isNull() & _duplicate_key(F.col("_text")).isNotNull(),
                F.concat(F.lit("key '"), _snippet(_duplicate_key(F.col("_text"))), F.lit("' appears twice")),
            ),
            # Not JSON at all (single-quoted JSON included): before the per-field checks, which read leniently.
            (
                parsed[CORRUPT].isNotNull() & strict.isNull(),
                F.concat(F.lit("not a JSON object: "), _snippet(F.col("_text"))),
            ),
            *[(parsed[CORRUPT].isNotNull() & c, r) for c, r in wrong_type],
            (parsed[CORRUPT].isNotNull(), F.concat(F.lit("not a JSON object: "), _snippet(F.col("_text")))),
            (strict.isNull(), "not strict JSON: a key appears twice in a nested object, or text follows the object"),
            *unconvertible,
            *non_finite,
            *json_in_string,
            *missing,
            *event_time_checks,
            (event_time.isNull(), "no event time: the field is missing and the Kafka record has no timestamp"),
        ]
    )
    out = df.select(
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
        F.col("timestamp").alias("_kafka_timestamp"),
        F.col("key").alias("_key"),
        F.col("value").alias("_value"),
        F.col("headers").alias("_headers"),
        reason.alias("_reason"),
        event_time.alias("_event_time"),
        *[typed[f.name].alias(f.name) for f in src.fields],
    )
    out = out.withColumn("_status", F.when(F.col("_reason").isNull(), "ok").otherwise("rejected"))
    # Rejected rows keep a partition date too (Kafka time) so bronze stays prunable. A
    # record with neither time gets none here: `current_timestamp()` would be a new
    # literal in every micro-batch, so Spark would compile the whole parse again each
    # batch. `fill_missing_dates` gives those rows the batch's date in foreachBatch.
    out = out.withColumn(
        "_event_date",
        F.to_date(
            F.when(F.col("_status") == "ok", F.col("_event_time")).otherwise(
                F.coalesce(F.col("_event_time"), F.col("_kafka_timestamp"))
            )
        ),
    )
    return out


def fill_missing_dates(rows: DataFrame, today: datetime.date) -> DataFrame:
    """`_event_date` of the rows that had no time at all (rejected ones) -> `today` (the batch's date)."""
    return rows.withColumn("_event_date", F.coalesce(F.col("_event_date"), F.lit(today)))
