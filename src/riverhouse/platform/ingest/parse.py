"""Parse and validate Kafka records (Spark SQL), one status and reason per record.

Nothing here runs per-record Python: the JSON parse (`from_json`), UTF-8 checks, type
checks and reasons are Spark expressions, part of the streaming query's plan, so they
run on the executors at JVM speed. This is the one implementation of every rule.
"""

from __future__ import annotations

import datetime
import json
import operator
import re
from collections.abc import Callable
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from riverhouse.platform.fields import RESERVED_JSON_KEY, FieldSpec
from riverhouse.platform.ingest.record_rules import Check, Decoded, any_leaf, at_path, non_finite_checks
from riverhouse.platform.runtime.huge_methods import compiles_huge_methods
from riverhouse.platform.runtime.jars import JSON_EXTENSION
from riverhouse.platform.spec import SourceSpec
from riverhouse.platform.types import spark_read_type, variant_shape

# from_json's column for a value that is not a JSON object of these types (no path may start with it).
CORRUPT = RESERVED_JSON_KEY
# Epoch time written as text: what producers send in a timestamp field as a number (milliseconds
# unless the field's epoch_unit says otherwise).
EPOCH_DIGITS_RE = r"^-?[0-9]{1,18}$"
# The instants a number may name, in any unit: within 10^15 ms (the year 33658) of 1970.
MAX_ABS_EPOCH_MILLIS = 10**15
EPOCH_TO_TIMESTAMP = {
    "seconds": F.timestamp_seconds,
    "milliseconds": F.timestamp_millis,
    "microseconds": F.timestamp_micros,
}
PER_MILLISECOND = {"seconds": 0.001, "milliseconds": 1, "microseconds": 1000}
# A number within this of 0, read as epoch milliseconds, is between 1966-10-31 and 1973-03-03; read
# as epoch seconds it is any time up to the year 5138. Producers sending Unix seconds are common,
# milliseconds of those years are not: with no epoch_unit declared, such a number is quarantined
# (and given no event time) rather than read as January 1970.
EPOCH_SECONDS_LIKELY = 10**11


def json_struct(fields: list[FieldSpec]) -> StructType:
    """What `from_json` reads a value into: each field at its path, objects on the way as nested structs.

    Timestamps and dates are read as text and converted here (types.spark_read_type).
    """
    tree: dict[str, Any] = {}
    for f in fields:
        node = tree
        for key in f.segments[:-1]:
            node = node.setdefault(key, {})
        node[f.segments[-1]] = f.type

    def build(node: dict[str, Any]) -> list[StructField]:
        return [
            StructField(key, StructType(build(v)) if isinstance(v, dict) else spark_read_type(v))
            for key, v in node.items()
        ]

    return StructType([*build(tree), StructField(CORRUPT, StringType())])


def json_path(segments: tuple[str, ...]) -> str:
    """`$['user']['id']`: keys are validated (fields.PATH_SEGMENT_RE: no quotes or brackets)."""
    return "$" + "".join(f"['{key}']" for key in segments)


def _within(number: Column, limit: int) -> Column:
    """-limit < number < limit (not abs(), which overflows for the smallest long and fails the batch)."""
    return (number > F.lit(-limit)) & (number < F.lit(limit))


def _epoch_to_ts(col: Column, unit: str | None) -> Column:
    """A number (or its digits) of epoch `unit`s -> a timestamp; NULL when out of range, or, with no
    unit declared (milliseconds), when the number is likely seconds (`_seconds_likely`)."""
    number = col.try_cast("long")
    readable = _within(number, int(MAX_ABS_EPOCH_MILLIS * PER_MILLISECOND[unit or "milliseconds"]))
    if unit is None:
        readable = readable & ~_within(number, EPOCH_SECONDS_LIKELY)
    return F.when(readable, EPOCH_TO_TIMESTAMP[unit or "milliseconds"](number))


def _seconds_likely(f: FieldSpec, number: Column, value: Column) -> Check:
    """A field without an epoch_unit whose number reads as 1966-1973 in milliseconds: more likely seconds."""
    as_millis = F.date_format(F.timestamp_millis(number.try_cast("long")), "yyyy-MM-dd'T'HH:mm:ss'Z'")
    return (
        _within(number.try_cast("long"), EPOCH_SECONDS_LIKELY),
        F.concat(
            F.lit(f"field {f.label} is "),
            _snippet(value),
            F.lit(", which as epoch milliseconds is "),
            as_millis,
            F.lit(": if it is epoch seconds, set epoch_unit: seconds on the field (epoch_unit: milliseconds keeps it)"),
        ),
    )


# What Spark's timestamp and date parsers accept beyond ISO 8601, and read as something else: a
# time without a date (today's date: a replay would read another day), a year alone or text after
# the date (`20454`, Debezium's days since 1970, became the year 20454), and Java's short zone IDs
# (`BST` is Bangladesh, `CST` Chicago with daylight time applied). So a timestamp must start with
# its date and may not end in a zone abbreviation other than UTC/GMT/UT; a date is the date alone.
# Spark trims whitespace and control characters around the value first (`PAD`), and so do these.
PAD = r"[\x00-\x20\x7F]*"
_DATE = r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
DATE_RE = rf"^{PAD}{_DATE}{PAD}$"
STARTS_WITH_A_DATE_RE = rf"^{PAD}{_DATE}"
ZONE_ABBREVIATION_RE = rf"(^|[^A-Za-z/_])(?!(UTC|GMT|UT){PAD}$)[A-Z]{{2,5}}{PAD}$"


def _expected_form(f: FieldSpec) -> str:
    """What the reason says a timestamp or date should look like."""
    if f.type == "date":
        return "YYYY-MM-DD"
    unit = f.epoch_unit or "milliseconds (epoch_unit for another unit)"
    return f"an ISO 8601 date and time, its zone as Z, an offset or a region, or epoch {unit}"


def _typed(raw: Column, f: FieldSpec, functions: bool) -> Column:
    if f.type == "timestamp":
        # A capital letter (but Z) or padding at the end is rare: the zone test runs only then.
        last = F.substring(raw, -1, 1)
        abbreviated = (last.between("A", "Y") | (last <= " ") | (last == "\x7f")) & raw.rlike(ZONE_ABBREVIATION_RE)
        iso = F.when(raw.rlike(STARTS_WITH_A_DATE_RE) & ~abbreviated, F.try_to_timestamp(raw))
        rules = F.when(raw.rlike(EPOCH_DIGITS_RE), _epoch_to_ts(raw, f.epoch_unit)).otherwise(iso)
        if not functions:
            return rules
        # The plain form (`2026-01-02T03:04:05.678Z`, an offset for the Z) read in one pass, NULL for
        # any other text, which the rules then read: the same value as the rules' cast
        # (jvm/src/riverhouse/json/PlainTimestamp.java), without their regexes for most records.
        return F.coalesce(F.call_function(PLAIN_TIMESTAMP, raw), rules)
    if f.type == "date":
        return F.when(raw.rlike(DATE_RE), raw.try_cast("date"))
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
    values. Like `from_json`, it reads one JSON value and ignores whatever follows it, so
    `{"id":1}{"id":2}` (two records in one message) would lose the second without a word.
    Text after the record needs a `}` followed by more than JSON whitespace
    (`TEXT_AFTER_A_BRACE_RE`), which a flat record without braces in its strings does not have:
    only records with one are parsed sealed (`_sealed`), the others as they are. Each parse tries
    the record as it is first, and the NaN-neutralizing version only when that fails.
    """
    neutralized = F.regexp_replace(text, NON_FINITE_TOKEN_RE, "$10$3")

    def as_is_then_neutralized(parse: Callable[[Column], Column]) -> Column:
        return F.coalesce(parse(text), parse(neutralized))

    seal = F.xxhash64(text)
    sealed = as_is_then_neutralized(lambda record: _sealed(record, seal))
    return F.when(text.rlike(TEXT_AFTER_A_BRACE_RE), sealed).otherwise(as_is_then_neutralized(F.try_parse_json))


# Riverhouse's SQL functions (jvm/src/riverhouse/json, registered by its session extension): the
# one-pass strict check (StrictJson.java) and from_json over the record's bytes (FromJsonBytes.java).
JSON_SURE = "riverhouse_json_sure"
FROM_JSON_BYTES = "riverhouse_from_json"
PLAIN_TIMESTAMP = "riverhouse_plain_timestamp"  # a timestamp's plain ISO form (PlainTimestamp.java)
REPEATED_KEY = "riverhouse_repeated_key"  # the first top-level key given twice (RepeatedKey.java)
WHOLE_STAGE_MAX_FIELDS = 16  # the widest spec whose record rules run in whole-stage code (_decode_json)


def has_json_functions(spark: Any) -> bool:
    """Does the session have Riverhouse's extension (runtime/jars.JSON_EXTENSION, beside Delta's in
    `spark.sql.extensions` when `make jars` built its jar)? Without it (no javac at install, an
    engine started without it) the parse uses Spark's own functions: the same results, slower."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    return JSON_EXTENSION in extensions.split(",")


def _surely_strict(text: Column, functions: bool) -> Column:
    """Is the record strict JSON for sure? One Jackson pass over its bytes that refuses a key given
    twice at any depth and text after the value; it leaves to the variant (`_strict_json`) every
    record it doubts, among them any with an escape (`\\u`...), so what it accepts the variant
    accepts (tests/spark/test_strict_check.py). Without Riverhouse's functions (`functions`: what
    `has_json_functions` said) it is sure of none, and every record gets the variant: the same
    verdicts, ~3 us a record more. `text`: valid UTF-8."""
    if not functions:
        return F.lit(False)
    return F.call_function(JSON_SURE, text)


def _from_json(text: Column, schema: StructType, options: dict[str, str], functions: bool) -> Column:
    """Spark's `from_json`, as `riverhouse_from_json` where the session has Riverhouse's functions:
    the same parse (Spark's parser, options and schema) over the record's UTF-8 bytes rather than
    through a reader that allocates 8 KB per record (jvm/src/riverhouse/json/FromJsonBytes.java;
    bench/analysis.md). `text` must be valid UTF-8. The rows are the same
    (tests/spark/test_from_json_bytes.py)."""
    if not functions:
        return F.from_json(text, schema, options)
    return F.call_function(FROM_JSON_BYTES, text, F.lit(schema.json()), F.lit(json.dumps(options, sort_keys=True)))


# A `}` with something other than JSON whitespace after it: what any text after a JSON object has
# (measured: cheaper than trimming and comparing positions).
TEXT_AFTER_A_BRACE_RE = r"\}[ \t\n\r]*[^ \t\n\r]"


def _sealed(record: Column, seal: Column) -> Column:
    """The record's strict parse, NULL when text follows it: the record is parsed as the first
    element of an array whose second element is the record's own hash, so text after the
    record, or a record that closes the array itself, leaves a second element that is not it (a
    record cannot hold its own hash: that would be a fixed point of the hash)."""
    parsed = F.try_parse_json(F.concat(F.lit("["), record, F.lit("\n,"), seal.cast("string"), F.lit("]")))
    return F.when(F.try_variant_get(parsed, "$[1]", "bigint") == seal, F.try_variant_get(parsed, "$[0]", "variant"))


def _duplicate_key(text: Column, whole_stage: bool) -> Column:
    """The first key given twice at the top level of the record, else NULL.

    Its `filter` (a higher-order function, which has no generated code) also keeps the record
    rules' projection out of whole-stage code, where they make one method too big for HotSpot to
    compile unless its JVM was told to (runtime/huge_methods.py). `whole_stage` (the session has
    Riverhouse's functions and such JVMs) asks for `riverhouse_repeated_key`, the same answer as a
    `StaticInvoke` (jvm/src/riverhouse/json/RepeatedKey.java), and so the rules in whole-stage code:
    ~20% less CPU for the parse (bench/analysis.md, forty-third session).
    """
    if whole_stage:
        return F.call_function(REPEATED_KEY, text)
    keys = F.json_object_keys(text)
    return F.try_element_at(F.filter(keys, lambda k: F.size(F.filter(keys, lambda other: other == k)) > 1), F.lit(1))


def _is_container(variant: Column) -> Column:
    kind = F.schema_of_variant(variant)
    return kind.startswith("OBJECT") | kind.startswith("ARRAY")


def _json_in_string(strict: Column, f: FieldSpec) -> Column:
    """Is a JSON object or array where the field (or an element or value of it) should hold a string?

    The variant (the record's strict parse) tells a JSON object or array from a string that merely
    starts with '{' or '['.
    """
    value = strict
    shape = variant_shape(f.type)
    if shape is None:
        return _is_container(F.try_variant_get(value, json_path(f.segments), "variant"))
    return any_leaf(F.try_variant_get(value, json_path(f.segments), shape), f.ftype, _is_container)


# How from_json gives a JSON number with a fraction in a string field: as Java renders a double, so
# 10000000.5 became "1.00000005E7" and 12345678901234567.5 lost its last digits.
DOUBLE_TEXT_RE = r"^-?[0-9]+\.[0-9]+(E-?[0-9]+)?$"


def _strict_text(strict: Column, f: FieldSpec) -> Column:
    """The field's value as text, from the record's strict parse (a number exactly, as a decimal)."""
    return F.try_variant_get(strict, json_path(f.segments), "string")


def _not_valid(f: FieldSpec, value: Column, expected: str) -> Column:
    """The reason for a value that does not convert to the field's type."""
    return F.concat(F.lit(f"field {f.label} is not a valid {f.type}: "), _snippet(value), F.lit(f" ({expected})"))


def _rendered_double(raw: Column) -> Column:
    """Might a string field's value be a JSON number with a fraction, as from_json renders it?"""
    # Cheap tests first (no regex, which copies the value into a Java string, for ordinary strings).
    # The first character is '-' to '9' when the text sorts at or after "-" and before ":" (the
    # character after '9'): two byte comparisons, where `substring` copied the character into a
    # new string, per string field and record (~3% of a dedup run's JVM samples, bench/analysis.md).
    return (raw >= F.lit("-")) & (raw < F.lit(":")) & raw.contains(".") & raw.rlike(DOUBLE_TEXT_RE)


def _text_with_comma(text: Column, f: FieldSpec) -> Column:
    """Might the record give the field's value as a JSON string that holds a comma? Its key, then a
    string with a comma before its closing quote, anywhere in the record (a superset: a key of the
    same name elsewhere matches too). A string with an escaped quote has a backslash, and the
    one-pass check leaves such records to the variant anyway."""
    key = re.escape(f.segments[-1])  # fields.PATH_SEGMENT_RE: no quote or backslash in a key
    return text.rlike(rf'"{key}"[ \t\n\r]*:[ \t\n\r]*"[^"]*,')


def _exact_number_text(raw: Column, rendered: Column, strict: Column, f: FieldSpec) -> Column:
    """A string field's value, with a JSON number whose double rendering changed its value or wrote
    it with an exponent given exactly: the record's strict parse holds it as a decimal (up to 38
    digits), written out in plain notation. Others as read: `1.0` stays `1.0` (the variant would
    write `1`, and a key field must read as it did before). `rendered`: `_rendered_double(raw)`."""
    path = json_path(f.segments)
    held_exactly = F.schema_of_variant(F.try_variant_get(strict, path, "variant")).startswith("DECIMAL")
    exact = _strict_text(strict, f)
    # The variant's text of the rendering: equal to `exact` when the double kept the number's value.
    changed = raw.contains("E") | (F.try_variant_get(F.try_parse_json(raw), "$", "string") != exact)
    return F.when(rendered & held_exactly & changed, exact).otherwise(raw)


def _not_a_json_object(text: Column) -> Column:
    """The reason for text that is not a JSON object; one that starts with a byte order mark says so
    (invisible in the snippet; RFC 8259 forbids it in JSON sent over a network)."""
    bom = "not a JSON object: the value starts with a byte order mark (U+FEFF), which JSON sent over a network must not have"
    return F.when(text.startswith("\ufeff"), F.lit(bom)).otherwise(
        F.concat(F.lit("not a JSON object: "), _snippet(text))
    )


def _snippet(col: Column) -> Column:
    return F.substring(col, 1, 60)


def parse_records(batch: DataFrame, src: SourceSpec, writers: Any = None) -> DataFrame:
    """Kafka rows -> typed fields + _status/_reason/_event_time/_event_date (+ raw columns).

    `writers`: an Avro source's writer schemas (ingest/avro.WriterSchemas); JSON sources need none.
    """
    size = F.octet_length(F.col("value"))
    oversized = size > F.lit(src.max_message_bytes)
    if src.format == "avro":
        from riverhouse.platform.ingest.avro import decode_avro

        df, typed, format_checks, value_checks = decode_avro(batch, src, oversized, writers)
    else:
        df, typed, format_checks, value_checks = _decode_json(batch, src, oversized)
    missing = [(typed[n].isNull(), f"missing required field {src.field(n).label}") for n in src.required_fields]
    et = src.event_time
    epoch_field = src.field(et.field) if et.field is not None and src.field(et.field).type == "long" else None
    if et.field is None:
        event_time = F.col("timestamp")
    elif epoch_field is not None:
        event_time = _epoch_to_ts(typed[et.field], epoch_field.epoch_unit)
    else:
        event_time = typed[et.field]
    # A long event time that is there but reads as no time says why before "missing" does.
    event_time_checks: list[Check] = []
    if epoch_field is not None:
        number = typed[epoch_field.name]
        if epoch_field.epoch_unit is None:
            event_time_checks.append(_seconds_likely(epoch_field, number, number.cast("string")))
        event_time_checks.append(
            (
                number.isNotNull() & event_time.isNull(),
                f"event time field '{et.field}' is out of range for epoch {epoch_field.epoch_unit or 'milliseconds'}",
            )
        )
    if et.field is not None and et.fallback == "quarantine":
        event_time_checks.append((event_time.isNull(), f"missing event time field '{et.field}'"))
    elif et.field is not None:
        event_time = F.coalesce(event_time, F.col("timestamp"))

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
            *format_checks,
            *value_checks,
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
    # batch. `event_date_or` gives those rows the batch's date in foreachBatch.
    out = out.withColumn(
        "_event_date",
        F.to_date(
            F.when(F.col("_status") == "ok", F.col("_event_time")).otherwise(
                F.coalesce(F.col("_event_time"), F.col("_kafka_timestamp"))
            )
        ),
    )
    return out


def event_date_or(today: datetime.date) -> Column:
    """`_event_date`, or `today` (the batch's date) for the rows that had no time at all (rejected
    ones). A column, so the writer adds it in the select it makes anyway (in-process, each
    DataFrame step is a py4j round trip in which Spark analyses the plan)."""
    return F.coalesce(F.col("_event_date"), F.lit(today)).alias("_event_date")


def _decode_json(batch: DataFrame, src: SourceSpec, oversized: Column) -> Decoded:
    """The JSON parse: the frame with the parsed record, the typed fields, the checks of the record's
    form (before the required fields) and of its values (after the type conversions)."""
    json_schema = json_struct(src.fields)
    text = F.when(~oversized, F.col("value").cast("string"))
    # UTF-8 validity once per record (a column): the parse and the check each scanned the text.
    df = batch.withColumn("_text", text).withColumn("_utf8", F.is_valid_utf8(F.col("_text")))
    functions = has_json_functions(batch.sparkSession)  # Riverhouse's, or Spark's own (the same rows)
    # The rules in whole-stage code (`_duplicate_key`), for a spec whose rules' code Janino can compile
    # as one class: at 36 fields it outgrew 64 KB, and Spark's fallback to operators one by one then
    # took twice the CPU of the other shape; at 12 fields whole-stage code took 22% less, at 24 the
    # same (bench/analysis.md, forty-third session).
    whole_stage = functions and len(src.fields) <= WHOLE_STAGE_MAX_FIELDS and compiles_huge_methods(batch.sparkSession)
    jvm_parse = F.when(
        F.col("_utf8"),
        # Strict about quoting: single-quoted JSON is not JSON (Spark's default reads it, and its
        # object values then reached string fields unchecked: the strict parse below refuses it).
        _from_json(
            F.col("_text"),
            json_schema,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT, "allowSingleQuotes": "false"},
            functions,
        ),
    )
    df = df.withColumn("_p", jvm_parse)
    parsed = F.col("_p")
    raw = {f.name: at_path(parsed, f.segments) for f in src.fields}
    # The cheap tests of the rules that read a value from the record's strict parse: each rule
    # reads the variant only when its test holds, so the variant is made only for such records.
    rendered = {f.name: _rendered_double(raw[f.name]) for f in src.fields if f.type == "string"}
    looks_like_json = {
        f.name: any_leaf(raw[f.name], f.ftype, lambda x: x.startswith("{") | x.startswith("["))
        for f in src.fields
        if f.ftype.leaf.name == "string" and not f.allow_json_text
    }
    commas = [
        raw[f.name].isNotNull() & _text_with_comma(F.col("_text"), f) for f in src.fields if f.ftype.name == "decimal"
    ]
    # One Jackson pass per record says which records are strict JSON for sure (jvm/src/riverhouse/
    # json/StrictJson.java); the variant (`_strict_json`, ~3 us a record) is made for the others
    # and where a rule reads a value from it. Each is a column, once per record.
    df = df.withColumn("_surely_strict", parsed.isNotNull() & _surely_strict(F.col("_text"), functions))
    surely = F.col("_surely_strict")
    variant_needed = reduce(operator.or_, [~surely, *rendered.values(), *looks_like_json.values(), *commas])
    df = df.withColumn("_strict", F.when(parsed.isNotNull() & variant_needed, _strict_json(F.col("_text"))))
    strict = F.col("_strict")
    refused = ~surely & strict.isNull()
    typed = {
        f.name: _exact_number_text(raw[f.name], rendered[f.name], strict, f)
        if f.type == "string"
        else _typed(raw[f.name], f, functions)
        for f in src.fields
    }

    def json_text(segments: tuple[str, ...]) -> Column:
        return F.get_json_object(F.col("_text"), json_path(segments))

    # An object on a field's path that is something else ({"user": "u1"} for user.id): named first.
    objects = list(dict.fromkeys(f.segments[:depth] for f in src.fields for depth in range(1, len(f.segments))))
    not_an_object = [
        (
            json_text(prefix).isNotNull() & at_path(parsed, prefix).isNull(),
            F.concat(
                F.lit(f"field '{'.'.join(prefix)}' should be a JSON object (fields are read inside it), got "),
                _snippet(json_text(prefix)),
            ),
        )
        for prefix in sorted(objects, key=len)
    ]
    wrong_type = [
        (
            json_text(f.segments).isNotNull() & raw[f.name].isNull(),
            F.concat(F.lit(f"field {f.label} should be {f.type}, got "), _snippet(json_text(f.segments))),
        )
        for f in src.fields
    ]
    unconvertible = [
        (
            raw[f.name].isNotNull() & typed[f.name].isNull(),
            _not_valid(f, raw[f.name], f"expected {_expected_form(f)}"),
        )
        for f in src.fields
        if f.type in ("timestamp", "date")
    ]
    # A number in a timestamp field with no epoch_unit that would be 1966-1973 in milliseconds (its
    # typed value is NULL, so this goes before `unconvertible`).
    seconds_likely = [
        # Such a value reads as no timestamp: that test first spares every valid record the regex,
        # and the regex goes before try_cast (of text that is not a number: ~5 µs a record, measured).
        (typed[f.name].isNull() & raw[f.name].rlike(EPOCH_DIGITS_RE) & condition, reason)
        for f in src.fields
        if f.type == "timestamp" and f.epoch_unit is None
        for condition, reason in [_seconds_likely(f, raw[f.name], raw[f.name])]
    ]
    # `from_json` reads a decimal given as a JSON string with Spark's US-locale parser, which drops
    # every comma: "12,5" (a European 12.5) read as 125 and "1,2,3" as 123, without a word. A JSON
    # number never holds a comma, so a decimal whose value does was such a string: quarantined. The
    # record's strict parse gives the value's text (a cheap lookup: the record is parsed already).
    comma_decimals = [
        (
            raw[f.name].isNotNull() & _strict_text(strict, f).contains(","),
            _not_valid(f, _strict_text(strict, f), "a comma is neither a decimal point nor a digit separator here"),
        )
        for f in src.fields
        if f.ftype.name == "decimal"
    ]
    # Values the declared type admits in Spark but the spec does not mean: NaN/Infinity (not
    # JSON; Jackson reads them, and 1e999 overflows to Infinity) would turn a ClickHouse sum()
    # into NaN; an object or array in a string field would be stored as its JSON text.
    json_in_string = [
        (
            # Cheap test first (CASE stops at it for ordinary strings), then the record's strict parse.
            looks_like_json[f.name] & F.coalesce(_json_in_string(strict, f), F.lit(False)),
            f"field {f.label} should be {f.type}, got a JSON object or array"
            f"{' where a string belongs' if f.ftype.is_container else ''}; "
            "set allow_json_text: true on the field to keep its JSON text",
        )
        for f in src.fields
        if f.ftype.leaf.name == "string" and not f.allow_json_text
    ]
    format_checks: list[Check] = [
        (~F.col("_utf8"), "value is not valid UTF-8"),
        (parsed.isNull(), "value could not be parsed"),
        # One rule for a key given twice, at any depth: the record is quarantined (readers keep different
        # values: from_json the last, get_json_object the first), naming the key when it is a top-level one.
        (
            refused & _duplicate_key(F.col("_text"), whole_stage).isNotNull(),
            F.concat(F.lit("key '"), _snippet(_duplicate_key(F.col("_text"), whole_stage)), F.lit("' appears twice")),
        ),
        # Not JSON at all (single-quoted JSON included): before the per-field checks, which read leniently.
        (
            parsed[CORRUPT].isNotNull() & refused,
            _not_a_json_object(F.col("_text")),
        ),
        *[(parsed[CORRUPT].isNotNull() & c, r) for c, r in [*not_an_object, *wrong_type]],
        (parsed[CORRUPT].isNotNull(), _not_a_json_object(F.col("_text"))),
        (
            refused,
            "not strict JSON: a key appears twice in a nested object, text follows the object, "
            "or a string holds an unpaired surrogate (\\ud800)",
        ),
    ]
    return (
        df,
        typed,
        format_checks,
        [*seconds_likely, *unconvertible, *comma_decimals, *non_finite_checks(src, raw), *json_in_string],
    )
