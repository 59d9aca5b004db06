"""Decode Avro records (Spark's `from_avro`, on the executors), one reason per record that does not read.

A source with a schema registry reads the Confluent wire format: byte 0 is zero, bytes 1-4 the
schema id (big-endian), the rest the Avro body. Each id the registry knows is decoded with its
own (writer) schema and resolved into the reader schema (`avro_schema`, the spec's columns) by
Avro's rules, in one CASE over the ids: a record whose id is unknown, whose schema cannot be read
as the reader's (`avro.schema.resolution_problem`), whose header is wrong or whose body does not
decode is rejected with that reason (quarantine), like bad JSON.

The writer schemas are fetched by the batch body before each batch (`WriterSchemas.fetch`), so a
version registered mid-stream is read from the next batch on. When the registry cannot be reached
(or its proxy answers 502/503/504) the cached ones keep working, and a record with an id not in
the cache fails the batch (Spark's `raise_error`): nothing is committed, and the next run reads
it once the registry answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from riverhouse.platform.avro.schema import resolution_problem
from riverhouse.platform.ingest.record_rules import Check, Decoded, any_leaf, at_path, non_finite_checks
from riverhouse.platform.spec import SourceSpec


@dataclass
class WriterSchemas:
    """The writer schemas a batch is decoded with, and whether they are all the registry has."""

    schemas: dict[int, str] = field(default_factory=dict)
    complete: bool = True  # False: the registry did not answer, these are the cached ones
    where: str = ""  # "subject S at URL", for messages

    @classmethod
    def fetch(cls, src: SourceSpec, registry: Any, must_answer: bool = False) -> WriterSchemas:
        """Every version of the source's subject (`registry`: avro.registry.Registry, which caches);
        the cached ones when the registry cannot be reached, unless it `must_answer` (a backfill)."""
        from riverhouse.platform.avro.registry import RegistryUnreachable

        subject = subject_of(src)
        where = f"subject {subject!r} at {registry.url}"
        try:
            return cls(registry.refresh(subject), True, where)
        except RegistryUnreachable:
            if must_answer:
                raise
            return cls(dict(registry.cache), False, where)


def subject_of(src: SourceSpec) -> str:
    assert src.schema_registry is not None
    return src.schema_registry.subject_for(src.topic)


def decode_avro(batch: DataFrame, src: SourceSpec, oversized: Column, writers: WriterSchemas | None) -> Decoded:
    reader = str(src.avro_schema)
    options = F.create_map(F.lit("mode"), F.lit("PERMISSIVE"), F.lit("avroSchema"), F.lit(reader))
    value = F.when(~oversized, F.col("value"))
    checks: list[Check] = []
    if src.schema_registry is None:  # plain Avro bodies, all written with the reader schema
        decoded: Column = F.call_function("from_avro", value, F.lit(reader), options)
    else:
        if writers is None:
            raise ValueError("an Avro source with a schema registry is decoded with its writer schemas")
        header_ok = (F.octet_length(value) >= 5) & (F.substring(value, 1, 1) == F.unhex(F.lit("00")))
        schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
        body = F.substring(value, 6, 2**31 - 1)
        readable = {
            sid: w
            for sid, w in writers.schemas.items()
            if resolution_problem(json.loads(w), json.loads(reader)) is None
        }
        decoded = F.lit(None)
        branches: Any = F
        for sid, writer in sorted(readable.items()):
            branches = branches.when(
                schema_id == F.lit(sid), F.call_function("from_avro", body, F.lit(writer), options)
            )
        if readable:
            decoded = branches
        checks.append(
            (
                ~header_ok,
                F.concat(
                    F.lit("not in the Confluent wire format (a zero byte, then the schema id): starts with 0x"),
                    F.hex(F.substring(value, 1, 5)),
                ),
            )
        )
        for sid, writer in sorted(writers.schemas.items()):
            if sid not in readable:
                problem = resolution_problem(json.loads(writer), json.loads(reader))
                checks.append(
                    (schema_id == F.lit(sid), f"schema id {sid} cannot be read as the reader schema: {problem}")
                )
        ids = (
            F.array(*[F.lit(i) for i in sorted(writers.schemas)]) if writers.schemas else F.array().cast("array<long>")
        )
        unknown = ~F.array_contains(ids, schema_id)
        if writers.complete:
            checks.append(
                (
                    unknown,
                    F.concat(
                        F.lit("unknown schema id "),
                        schema_id.cast("string"),
                        F.lit(f" (not a version of {writers.where})"),
                    ),
                )
            )
        else:
            failure = F.raise_error(
                F.concat(
                    F.lit("schema id "),
                    schema_id.cast("string"),
                    F.lit(
                        f" is not among the cached schemas of {writers.where}, and the registry cannot be reached: "
                        "start it and run again (nothing of this batch was written)"
                    ),
                )
            )
            checks.append((unknown & failure.isNull(), "unreachable"))  # raise_error fails the batch first
    df = batch.withColumn("_p", decoded)
    parsed = F.col("_p")
    checks.append((parsed.isNull() | _undecoded(parsed, reader), "the Avro body does not decode with its schema"))
    raw = {f.name: at_path(parsed, f.segments) for f in src.fields}
    typed = {f.name: raw[f.name].cast(f.type) for f in src.fields}
    return df, typed, checks, [*non_finite_checks(src, raw), *_utf8_checks(src, raw)]


def _utf8_checks(src: SourceSpec, raw: dict[str, Column]) -> list[Check]:
    """Text that is not UTF-8 in a string field (or inside an array or map of strings).

    Avro's strings are UTF-8 by its specification, but `from_avro` keeps the bytes as they are;
    a JSON record must be valid UTF-8 as a whole (ingest/parse.py). Rejected, so every string in
    silver is text: ClickHouse, the checks and the statistics of a string key read it as such.
    """
    return [
        (any_leaf(raw[f.name], f.ftype, lambda x: ~F.is_valid_utf8(x)), f"field {f.label} is not valid UTF-8 text")
        for f in src.fields
        if f.ftype.leaf.name == "string"
    ]


def _undecoded(parsed: Column, reader_text: str) -> Column:
    """A body that did not decode: Spark's PERMISSIVE mode gives a struct of nulls. A field the reader
    schema does not allow to be null tells it (a record whose fields are all nullable cannot)."""
    reader = json.loads(reader_text)
    non_null = [f["name"] for f in reader["fields"] if not _nullable(f["type"])]
    if non_null:
        return parsed[non_null[0]].isNull()
    names = [f["name"] for f in reader["fields"]]
    condition = F.lit(True)
    for name in names:
        condition = condition & parsed[name].isNull()
    return condition


def _nullable(typ: Any) -> bool:
    return typ == "null" or (isinstance(typ, list) and "null" in typ)
