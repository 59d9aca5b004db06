"""Delta tables: layout, schemas, creation with delta-spark, and delta-rs readers.

delta-spark writes and creates every table (`ensure_delta_table`). The delta-rs helpers
below only read, for what needs no Spark job (checks, CLI status, tests); the driver's
bookkeeping reads (versions, commits, added files) are in `delta_log.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from riverhouse.platform.spec import FieldSpec, SourceSpec
from riverhouse.platform.state.storage import spark_uri, storage_options
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
        root = spark_uri(self.warehouse.rstrip("/"))  # s3:// -> s3a://: delta-spark writes through S3A
        return f"{root}/{layer}/{self.pipeline}/{source}"

    def bronze(self, source: str) -> str:
        return self.path("bronze", source)

    def silver(self, source: str) -> str:
        return self.path("silver", source)

    def quarantine(self, source: str) -> str:
        return self.path("quarantine", source)


def open_table(path: str) -> DeltaTable | None:
    try:
        return DeltaTable(path, storage_options=storage_options() or None)
    except TableNotFoundError:
        return None


def row_count(path: str) -> int:
    """Rows of a Delta table's latest version, from its log (each file's numRecords statistic);
    files without the statistic are counted from their Parquet footers."""
    import pyarrow.compute as pc

    table = open_table(path)
    if table is None:
        return 0
    adds = pa.table(table.get_add_actions(flatten=True))  # delta-rs hands out arro3 tables
    if adds.num_rows == 0:
        return 0
    counted = adds.column("num_records")
    if counted.null_count == 0:
        return int(pc.sum(counted).as_py() or 0)
    return table.to_pyarrow_dataset().count_rows()


def spark_schema(schema: pa.Schema) -> Any:
    """The Spark StructType of an Arrow schema (the table schemas above are declared once, in Arrow)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


# Delta table properties per kind of table. Statistics only on the columns Riverhouse prunes
# on (Delta collects min/max of the first 32 columns by default, binary payloads included,
# which costs every write); silver compacts its small per-batch files itself (auto compaction
# writes with dataChange=false, so the change feed and the loader never see those rows again).
# A Delta checkpoint (every 10 commits by default) is a Spark job inside the batch that tips it:
# one batch in ten took seconds longer (every kind of table: quarantine's took a small batch
# to 7.6 s where the others took 3-4 s). Riverhouse's own reads of the log start from the newest
# version they know, so a longer interval costs them nothing.
CHECKPOINT_INTERVAL = {"delta.checkpointInterval": "100"}
BRONZE_PROPERTIES = {"delta.dataSkippingStatsColumns": "_event_time", **CHECKPOINT_INTERVAL}
QUARANTINE_PROPERTIES = {"delta.dataSkippingStatsColumns": "_kafka_timestamp", **CHECKPOINT_INTERVAL}
SILVER_PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    "delta.dataSkippingStatsColumns": "_event_time,_kafka_timestamp",
    "delta.autoOptimize.autoCompact": "true",
    **CHECKPOINT_INTERVAL,
}
GOLD_PROPERTIES = {"delta.dataSkippingStatsColumns": "_left_event_time", **CHECKPOINT_INTERVAL}


# Key types whose order is one in Spark's min and max, Delta's file statistics and pyarrow's comparison.
KEY_RANGE_TYPES = ("string", "int", "long")


def key_range_column(src: SourceSpec) -> str | None:
    """A deduplicated source's first key column, when its range can narrow silver's lookup
    (ingest/dedup.not_in_silver).

    Two rows are duplicates only if their keys are equal, so also their first columns: a silver
    file whose first-column statistics lie outside the batch's own range holds no duplicate.
    Keys that grow with time (order numbers, time-ordered ids) leave most of a long window's
    files out; random keys leave none out, at no cost.

    A string key's values are valid UTF-8 (the parse rejects a record that is not, JSON's and
    Avro's alike): Delta writes a statistic of bytes that are not UTF-8 with U+FFFD in their
    place, which would not keep their order, and a file that holds the key could be left out.
    """
    if src.dedup is None:
        return None
    first = src.dedup_key[0]
    return first if src.field(first).type in KEY_RANGE_TYPES else None


def silver_properties(src: SourceSpec) -> dict[str, str]:
    """SILVER_PROPERTIES, with statistics on the dedup key's first column too when its range can
    narrow the ingest's lookup of silver (`key_range_column`). A table made before keeps the
    properties it was made with: its lookups are narrowed by time only."""
    column = key_range_column(src)
    if column is None:
        return SILVER_PROPERTIES
    stats = f"{SILVER_PROPERTIES['delta.dataSkippingStatsColumns']},{column}"
    return {**SILVER_PROPERTIES, "delta.dataSkippingStatsColumns": stats}


def ensure_delta_table(
    spark: Any, path: str, schema: pa.Schema, partition_by: list[str], properties: dict[str, str] | None = None
) -> None:
    """Create the table with delta-spark unless it exists; an existing one must have every column.

    An existing table's columns come from its Delta log (no Spark request). A missing one is
    created by appending no rows (version 0 holds the schema, partitioning and properties): a
    plain DataFrame write, which works the same on a local session and through Spark Connect
    (Delta's Python `DeltaTable` API needs Delta's Connect server plugin; SQL `CREATE TABLE
    delta.`path`` needs SQL on files, which Riverhouse sessions turn off).
    """
    from riverhouse.platform.state.delta_log import DeltaLog

    log = DeltaLog(path)
    if log.exists():
        existing = set(log.schema().fieldNames())
        missing = [f.name for f in schema if f.name not in existing]
        if missing:
            raise RuntimeError(
                f"Delta table {path} exists but lacks column(s) {', '.join(missing)}: it was written "
                "by another spec. Point the pipeline at a new warehouse or reset it (riverhouse reset)."
            )
        return
    # No rows, from Arrow: a local relation in every kind of session (a Python list is an RDD in
    # an in-process one). The write itself is still a Spark job.
    empty = spark.createDataFrame(schema.empty_table(), spark_schema(schema))
    writer = empty.write.format("delta").partitionBy(*partition_by)
    for key, value in (properties or {}).items():
        writer = writer.option(key, value)
    # Two processes creating the same table at once: Delta lets one commit version 0 and fails
    # the other with a concurrent-append error; the loser finds the table made.
    try:
        writer.mode("append").save(path)
    except Exception:
        if not DeltaLog(path).exists():
            raise


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
