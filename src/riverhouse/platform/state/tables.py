"""Delta tables: layout, schemas, creation with delta-spark, and the delta-rs helpers.

delta-spark writes every table the ingest writes (bronze, quarantine, silver) and creates
them (`ensure_delta_table`). The delta-rs helpers below serve the readers that need no JVM
(checks, CLI status) and the gold/backfill code of issue 18, which still uses them;
tests/spark/test_delta_interop.py shows delta-rs reading what delta-spark writes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import TableNotFoundError

from riverhouse.platform.spec import FieldSpec, SourceSpec
from riverhouse.platform.types import arrow_type

TS = pa.timestamp("us", tz="UTC")

KAFKA_COLUMNS = [
    pa.field("_topic", pa.string()),
    pa.field("_partition", pa.int32()),
    pa.field("_offset", pa.int64()),
    pa.field("_kafka_timestamp", TS),
]
# A record's Kafka coordinates: its identity in bronze and silver.
KAFKA_IDENTITY = ["_topic", "_partition", "_offset"]
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def field_arrow(f: FieldSpec) -> pa.Field:
    return pa.field(f.name, arrow_type(f.type))


def bronze_schema(src: SourceSpec) -> pa.Schema:
    """Every record as received, with its Kafka coordinates and parse status."""
    return pa.schema(
        [
            *KAFKA_COLUMNS,
            pa.field("_key", pa.binary()),
            pa.field("_value", pa.binary()),
            pa.field("_headers", HEADERS),
            pa.field("_status", pa.string()),  # ok | rejected
            pa.field("_reason", pa.string()),
            pa.field("_event_time", TS),
            pa.field("_event_date", pa.date32()),
            pa.field("_batch_id", pa.int64()),
        ]
    )


def quarantine_schema(src: SourceSpec) -> pa.Schema:
    return pa.schema(
        [
            *KAFKA_COLUMNS,
            pa.field("_key", pa.binary()),
            pa.field("_value", pa.binary()),
            pa.field("_reason", pa.string()),
            pa.field("_event_date", pa.date32()),
            pa.field("_batch_id", pa.int64()),
        ]
    )


def silver_schema(src: SourceSpec) -> pa.Schema:
    """The clean stream: typed fields, event time, and where each row came from."""
    return pa.schema(
        [
            *(field_arrow(f) for f in src.fields),
            pa.field("_event_time", TS),
            pa.field("_event_date", pa.date32()),
            *KAFKA_COLUMNS,
            pa.field("_batch_id", pa.int64()),
        ]
    )


@dataclass(frozen=True)
class TableLayout:
    """Where a pipeline's tables live: `<warehouse>/<layer>/<pipeline>/<source>`."""

    warehouse: str
    pipeline: str

    def path(self, layer: str, source: str) -> str:
        root = self.warehouse.rstrip("/")
        return f"{root}/{layer}/{self.pipeline}/{source}"

    def bronze(self, source: str) -> str:
        return self.path("bronze", source)

    def silver(self, source: str) -> str:
        return self.path("silver", source)

    def quarantine(self, source: str) -> str:
        return self.path("quarantine", source)


def storage_options() -> dict[str, str] | None:
    """delta-rs storage options (S3 credentials...) from RIVERHOUSE_STORAGE_OPTIONS (JSON)."""
    raw = os.environ.get("RIVERHOUSE_STORAGE_OPTIONS")
    return json.loads(raw) if raw else None


def open_table(path: str) -> DeltaTable | None:
    try:
        return DeltaTable(path, storage_options=storage_options())
    except TableNotFoundError:
        return None


def ensure_table(path: str, schema: pa.Schema, partition_by: list[str], cdf: bool = False) -> DeltaTable:
    """Open the table, creating it (empty, version 0) with this schema if it does not exist."""
    table = open_table(path)
    if table is not None:
        existing = {f.name for f in pa.schema(table.schema())}
        missing = [f.name for f in schema if f.name not in existing]
        if missing:
            raise RuntimeError(
                f"Delta table {path} exists but lacks column(s) {', '.join(missing)}: it was written "
                "by another spec. Reset the pipeline (`riverhouse reset <pipeline>`) or point it at a new warehouse."
            )
        return table
    if not path.startswith(("s3://", "s3a://", "gs://", "az://", "abfss://")):
        os.makedirs(path, exist_ok=True)
    configuration = {"delta.enableChangeDataFeed": "true"} if cdf else None
    return DeltaTable.create(
        path,
        schema=schema,
        partition_by=partition_by,
        configuration=configuration,
        storage_options=storage_options(),
        mode="ignore",
    )


def spark_schema(schema: pa.Schema) -> Any:
    """The Spark StructType of an Arrow schema (the table schemas above are declared once, in Arrow)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def ensure_delta_table(spark: Any, path: str, schema: pa.Schema, partition_by: list[str], cdf: bool = False) -> None:
    """Create the table with delta-spark unless it exists; an existing one must have every column."""
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, path):
        existing = set(DeltaTable.forPath(spark, path).toDF().columns)
        missing = [f.name for f in schema if f.name not in existing]
        if missing:
            raise RuntimeError(
                f"Delta table {path} exists but lacks column(s) {', '.join(missing)}: it was written "
                "by another spec. Point the pipeline at a new warehouse or reset it (riverhouse reset)."
            )
        return
    # Delta's builder names the table `delta.`<path>``, which Riverhouse sessions refuse
    # (spark.sql.runSQLOnFiles=false keeps spec SQL from reading files). Only this create
    # runs in a session of its own that allows it; no spec SQL ever runs there.
    creator = spark.newSession()
    creator.conf.set("spark.sql.runSQLOnFiles", "true")
    builder = DeltaTable.createIfNotExists(creator).location(path).addColumns(spark_schema(schema))
    builder = builder.partitionedBy(*partition_by)
    if cdf:
        builder = builder.property("delta.enableChangeDataFeed", "true")
    builder.execute()


def plain_strings(table: pa.Table) -> pa.Table:
    """delta-rs hands out string_view columns; Spark, compute kernels and clickhouse-connect want string."""
    if not any(pa.types.is_string_view(f.type) for f in table.schema):
        return table
    fields = [pa.field(f.name, pa.string()) if pa.types.is_string_view(f.type) else f for f in table.schema]
    return table.cast(pa.schema(fields))


def read_inserts(path: str, start: int, end: int, columns: list[str]) -> pa.Table:
    """Rows inserted by Delta versions start..end (change data feed), with `_commit_version`."""
    table = open_table(path)
    if table is None:
        raise RuntimeError(f"Delta table {path} does not exist")
    wanted = [*dict.fromkeys([*columns, "_change_type", "_commit_version"])]
    changes = pa.RecordBatchReader.from_stream(
        table.load_cdf(starting_version=start, ending_version=end, columns=wanted)
    ).read_all()
    changes = plain_strings(changes.select(wanted))
    changes = changes.filter(pc.equal(changes.column("_change_type"), "insert"))
    return changes.drop_columns(["_change_type"])


def committed(table: DeltaTable, app_id: str, batch_id: int) -> bool:
    """Has this app already committed this batch (or a later one) to the table?"""
    version = table.transaction_version(app_id)
    return version is not None and version >= batch_id


def commit_properties(app_id: str, batch_id: int, extra: dict[str, Any] | None = None) -> CommitProperties:
    meta = {"riverhouse.batch_id": str(batch_id), **{k: str(v) for k, v in (extra or {}).items()}}
    return CommitProperties(app_transactions=[Transaction(app_id=app_id, version=batch_id)], custom_metadata=meta)
