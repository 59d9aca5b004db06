"""Local mode's fast path: valid records are validated with Arrow in the source and skip the JVM.

`parse.parse_records` (Spark SQL) is the reference for what a record becomes: its typed
fields, event time, partition date, and for a bad record the reason it is quarantined.
Running it costs each record a trip through the JVM (Arrow -> Spark rows -> the
validation projection -> Arrow back to the driver), which was about half of the CPU
Riverhouse spent per event on two cores.

In local mode the source's Python workers already hold every record as Arrow, parsed by
`arrow_parse.ArrowJsonParser`. `FastPath.split` finishes the records whose outcome is
certain without Spark: every check of `parse_records` passes, and every conversion is
one whose result is known to equal Spark's:

- timestamps as epoch milliseconds in a string (years 1-9999), or ISO 8601
  `yyyy-MM-dd[T ]HH:mm:ss` with up to 6 decimals, with a zone (`Z` or `+hh:mm`) or
  without one (UTC wall time, as Spark reads it in the UTC session the fast path
  requires); any other form (week dates, Spark's many others) goes to the JVM, which
  also names what is wrong with it;
- dates as `yyyy-MM-dd`;
- the event time present (or the Kafka timestamp standing in for it, as the spec says);
- double values finite, unless the field allows NaN/Infinity (Arrow's reader accepts the
  non-JSON literals `NaN` and `Infinity`, which `parse_records` quarantines by default).
  A JSON object or array in a string field never gets here: Arrow's reader refuses the
  block, so Spark's parse judges it.

Everything else (a rejected record, a form not listed, a block Arrow could not parse)
goes to Spark exactly as before, so every quarantine reason still comes from
`parse_records`. The source writes the finished rows to an Arrow file in the stream's
spool folder and hands Spark one marker row naming it; the driver reads the file
(`take_spooled`). tests/spark/test_arrow_validate.py checks both paths give identical
rows for good records and every kind of bad one.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.arrow_parse import ARROW_TYPES, PARSED_COLUMN

SPOOL_COLUMN = "_spool"
TS = pa.timestamp("us", tz="UTC")
# Epoch milliseconds in a string, for both parses (Java and RE2 read it alike).
EPOCH_MILLIS_RE = r"^-?[0-9]{1,15}$"
# Milliseconds of years 1..9999, which both Arrow and Spark hold exactly.
MIN_MILLIS, MAX_MILLIS = -62135596800000, 253402300799999
ISO_LOCAL = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
ISO_ZONED_RE = ISO_LOCAL + r"(Z|[+-](0[0-9]|1[0-7]):[0-5][0-9]|[+-]18:00)$"
# Zone-less: the session time zone's wall time, and the fast path only runs with UTC.
ISO_LOCAL_RE = ISO_LOCAL + "$"
ISO_DATE_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
FINAL_TYPES: dict[str, pa.DataType] = {**ARROW_TYPES, "timestamp": TS, "date": pa.date32()}


@dataclass(frozen=True)
class Rules:
    """What `parse_records` checks, for one source (carried to the workers as a source option)."""

    fields: list[tuple[str, str]]
    required: list[str]
    event_time_field: str | None
    event_time_quarantine: bool
    non_finite_ok: list[str] = field(default_factory=list)  # float/double fields that accept NaN/Infinity

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str) -> Rules:
        raw = json.loads(text)
        return cls(
            [(str(n), str(t)) for n, t in raw["fields"]],
            [str(n) for n in raw["required"]],
            raw["event_time_field"],
            bool(raw["event_time_quarantine"]),
            [str(n) for n in raw.get("non_finite_ok", [])],
        )


def rules_for(src: Any) -> Rules | None:
    """The source's rules, or None when a field type has no exact Arrow equivalent (e.g. float)."""
    fields = [(f.name, f.type) for f in src.fields]
    if not all(t in FINAL_TYPES for _, t in fields):
        return None
    return Rules(
        fields,
        list(src.required_fields),
        src.event_time.field,
        src.event_time.fallback == "quarantine",
        [f.name for f in src.fields if f.allow_non_finite],
    )


def output_schema(fields: list[tuple[str, str]]) -> pa.Schema:
    """The columns `parse_records` gives, in its order, with Arrow types."""
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.schema(
        [
            ("_topic", pa.string()),
            ("_partition", pa.int32()),
            ("_offset", pa.int64()),
            ("_kafka_timestamp", TS),
            ("_key", pa.binary()),
            ("_value", pa.binary()),
            ("_headers", headers),
            ("_reason", pa.string()),
            ("_event_time", TS),
        ]
        + [(name, FINAL_TYPES[typ]) for name, typ in fields]
        + [("_status", pa.string()), ("_event_date", pa.date32())]
    )


def _mask(array: pa.Array) -> pa.Array:
    return pc.fill_null(array, False)


def _cast_or_none(values: pa.Array, target: pa.DataType) -> pa.Array | None:
    try:
        return values.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _millis_to_ts(millis: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Epoch milliseconds (int64) -> (timestamp, in range of years 1..9999)."""
    in_range = pc.and_(pc.greater_equal(millis, MIN_MILLIS), pc.less_equal(millis, MAX_MILLIS))
    safe = pc.if_else(_mask(in_range), millis, pa.scalar(None, pa.int64()))
    return pc.multiply(safe, 1000).cast(pa.int64()).cast(TS), in_range


def _timestamp(raw: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(typed, ok): ok where the value is null or in a form converted exactly as Spark does."""
    millis_form = _mask(pc.match_substring_regex(raw, EPOCH_MILLIS_RE))
    millis_ts, in_range = _millis_to_ts(pc.if_else(millis_form, raw, pa.scalar(None, raw.type)).cast(pa.int64()))
    iso_ts, iso_form = _iso(raw, ISO_ZONED_RE, TS)
    # A zone-less value is UTC wall time here (the fast path needs a UTC session, as Spark
    # then reads it); Arrow reads it into a naive timestamp whose UTC reading is the same.
    others = pc.if_else(pc.or_(millis_form, iso_form), pa.scalar(None, raw.type), raw)
    local_ts, local_form = _iso(others, ISO_LOCAL_RE, pa.timestamp("us"))
    typed = pc.if_else(millis_form, millis_ts, pc.if_else(iso_form, iso_ts, local_ts.cast(TS)))
    ok = pc.or_(pc.is_null(raw), pc.or_(pc.and_(millis_form, _mask(in_range)), pc.or_(iso_form, local_form)))
    return typed, ok


def _iso(raw: pa.Array, form_re: str, target: pa.DataType) -> tuple[pa.Array, pa.Array]:
    """(the values in `form_re`'s form as `target`, where that is): all-or-nothing per batch."""
    if raw.null_count == len(raw):  # e.g. every value had another form
        return pa.nulls(len(raw), target), pa.array([False] * len(raw))
    form = _mask(pc.match_substring_regex(raw, form_re))
    typed = _cast_or_none(pc.if_else(form, raw, pa.scalar(None, raw.type)), target)
    if typed is None:  # one value Arrow rejects (a 13th month...): the JVM names it
        return pa.nulls(len(raw), target), pa.array([False] * len(raw))
    return typed, form


def _date(raw: pa.Array) -> tuple[pa.Array, pa.Array]:
    form = _mask(pc.match_substring_regex(raw, ISO_DATE_RE))
    typed = _cast_or_none(pc.if_else(form, raw, pa.scalar(None, raw.type)), pa.date32())
    if typed is None:
        return pa.nulls(len(raw), pa.date32()), pc.is_null(raw)
    return typed, pc.or_(pc.is_null(raw), form)


class FastPath:
    """Splits the source's Arrow batches into finished rows and rows for Spark's parse."""

    def __init__(self, rules: Rules):
        self.rules = rules
        self.types = dict(rules.fields)
        self.schema = output_schema(rules.fields)
        self.fast_rows = 0
        self.jvm_rows = 0

    def split(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch | None, pa.RecordBatch]:
        """(finished rows or None, the rest of `batch` for Spark, with its `_parsed` kept)."""
        parsed = batch.column(PARSED_COLUMN)
        ok = pc.is_valid(parsed)
        typed: dict[str, pa.Array] = {}
        for index, (name, typ) in enumerate(self.rules.fields):
            raw = pc.struct_field(parsed, [index])
            if typ == "timestamp":
                raw, field_ok = _timestamp(raw)
                ok = pc.and_(ok, field_ok)
            elif typ == "date":
                raw, field_ok = _date(raw)
                ok = pc.and_(ok, field_ok)
            elif typ in ("float", "double") and name not in self.rules.non_finite_ok:
                # NaN/Infinity go to Spark, which quarantines them with the reason.
                ok = pc.and_(ok, pc.or_(pc.is_null(raw), _mask(pc.is_finite(raw))))
            typed[name] = raw
        for name in self.rules.required:
            ok = pc.and_(ok, pc.is_valid(typed[name]))
        event_time, event_ok = self._event_time(typed, batch.column("timestamp"))
        ok = _mask(pc.and_(ok, event_ok))
        fast_count = pc.sum(ok).as_py() or 0
        self.fast_rows += fast_count
        self.jvm_rows += batch.num_rows - fast_count
        rest = batch if fast_count == 0 else batch.filter(pc.invert(ok))
        if fast_count == 0:
            return None, rest
        count = batch.num_rows
        columns = [
            batch.column("topic"),
            batch.column("partition"),
            batch.column("offset"),
            batch.column("timestamp"),
            batch.column("key"),
            batch.column("value"),
            batch.column("headers"),
            pa.nulls(count, pa.string()),
            event_time,
            *[typed[name] for name, _ in self.rules.fields],
            pa.array(["ok"] * count, pa.string()),
            event_time.cast(pa.date32()),
        ]
        finished = pa.RecordBatch.from_arrays(columns, schema=self.schema).filter(ok)
        return finished, rest

    def _event_time(self, typed: dict[str, pa.Array], kafka_ts: pa.Array) -> tuple[pa.Array, pa.Array]:
        """(event time, ok) as `parse_records` decides it."""
        name = self.rules.event_time_field
        if name is None:
            return kafka_ts, pc.is_valid(kafka_ts)
        value = typed[name]
        ok: pa.Array = pa.array([True] * len(value))
        if self.types[name] == "long":
            # Out of range is rejected by the JVM; anything outside years 1..9999 goes there to be judged.
            millis = value
            value, in_range = _millis_to_ts(millis)
            ok = pc.or_(pc.is_null(millis), _mask(in_range))
        if self.rules.event_time_quarantine:
            return value, pc.and_(ok, pc.is_valid(value))
        value = pc.coalesce(value, kafka_ts)
        return value, pc.and_(ok, pc.is_valid(value))


def spool_folder(checkpoint: Path) -> Path:
    return checkpoint / "spool"


def clear_spool(folder: Path) -> None:
    """Files of a batch that never finished (a crash, a retried task): Spark re-reads those records."""
    if folder.exists():
        for path in folder.iterdir():
            path.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)


class SpoolWriter:
    """One Arrow stream file per input partition; closed before its marker row is handed to Spark."""

    def __init__(self, folder: str, schema: pa.Schema):
        self.path = os.path.join(folder, f"{uuid.uuid4().hex}.arrows")
        self.schema = schema
        self.writer: Any = None

    def write(self, batch: pa.RecordBatch) -> None:
        if self.writer is None:
            self.writer = pa.ipc.new_stream(self.path + ".tmp", self.schema)
        self.writer.write_batch(batch)

    def close(self) -> str | None:
        """The finished file's path, or None when nothing was written."""
        if self.writer is None:
            return None
        self.writer.close()
        os.replace(self.path + ".tmp", self.path)
        return self.path


@dataclass
class Spooled:
    paths: list[str]
    rows: int = 0


def take_spooled(rows: pa.Table) -> tuple[pa.Table, Spooled]:
    """The batch's rows with the spooled ones read back in place of their marker rows."""
    if SPOOL_COLUMN not in rows.column_names:
        return rows, Spooled([])
    markers = pc.is_valid(rows.column(SPOOL_COLUMN))
    spooled = Spooled(rows.column(SPOOL_COLUMN).filter(markers).to_pylist())
    rows = rows.filter(pc.invert(markers)).drop_columns([SPOOL_COLUMN])
    tables = [rows]
    for path in spooled.paths:
        # Zero-copy: the table's buffers are the mapped file (unlinked after the batch).
        finished = pa.ipc.open_stream(pa.memory_map(path)).read_all()
        spooled.rows += finished.num_rows
        tables.append(finished.select(rows.column_names).cast(rows.schema))
    return (pa.concat_tables(tables) if len(tables) > 1 else rows), spooled
