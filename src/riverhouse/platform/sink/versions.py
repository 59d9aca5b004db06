"""Load new Delta versions into ClickHouse, exactly once, from the files each commit added.

For each Delta version v after the last one in the ledger, the rows v inserted are the data
files its commit added (read from the Delta log: no Spark job). They are cut into chunks by
file and slice: chunk `<f>.<s>` is rows [s*batch_size, (s+1)*batch_size) of the commit's f-th
file in path order. A commit's files never change, so a replayed version re-sends identical
chunks, each with the same `insert_deduplication_token = <pipeline>/<table>/<delta table
id>/<v>/<f>.<s>`; ClickHouse drops the ones it already has (block deduplication). After every
chunk of v is in, v goes into a ledger table in ClickHouse; a crash anywhere re-runs to the
same result, and nothing is skipped. Memory is bounded by a chunk: the files are read slice by
slice. Versions a backfill wrote are recorded but not inserted: their days reach ClickHouse by
a partition swap (sink/replace.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from riverhouse.platform.faults import crash_point
from riverhouse.platform.sink.clickhouse import (
    LEDGER_TABLE,
    PARTITION_COLUMN,
    ClickHouseLoadError,
    ensure_schema,
    last_loaded_version,
    ledger_table,
    open_client,
    qualified_table,
    with_retries,
)
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.delta_log import MARK_REBUILD, Commit, DeltaLog


@dataclass
class LoadResult:
    table: str
    versions_loaded: list[int] = field(default_factory=list)
    rows_loaded: int = 0
    chunks: int = 0
    last_loaded_version: int | None = None
    delta_version: int | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "versions_loaded": len(self.versions_loaded),
            "rows_loaded": self.rows_loaded,
            "chunks": self.chunks,
            "last_loaded_version": self.last_loaded_version,
            "delta_version": self.delta_version,
            "seconds": round(self.seconds, 3),
        }


def is_rebuild(commit: Commit) -> bool:
    """Was this version written by a backfill (its rows reach ClickHouse by partition swap)?"""
    return MARK_REBUILD in commit.user_metadata


@dataclass(frozen=True)
class SinkColumns:
    """Which Delta columns become the ClickHouse table's, and how."""

    columns: list[str]  # data columns, in ClickHouse's order
    date_column: str  # the Delta partition column that becomes `_event_date`
    emitted_only: bool  # join pipelines keep every driving event in gold; only emitted rows load

    @classmethod
    def of(cls, spec: PipelineSpec) -> SinkColumns:
        if spec.is_join:
            return cls(list(spec.plan.output_names), "_left_event_date", True)
        return cls([f.name for f in spec.sink_source.fields], "_event_date", False)


def version_chunks(log: DeltaLog, commit: Commit, sink: SinkColumns, size: int) -> Iterator[tuple[str, pa.Table]]:
    """(chunk id, rows) of what a commit added: per file in path order, slices of `size` rows."""
    for file_index, added in enumerate(log.added_files(commit)):
        partition = added.partition_values
        wanted = [c for c in sink.columns if c not in partition]
        if sink.emitted_only:
            wanted.append("_status")
        day = partition.get(sink.date_column)
        with log.fs.open_input_file(added.path) as handle:
            parquet = pq.ParquetFile(handle)
            for slice_index, batch in enumerate(parquet.iter_batches(batch_size=size, columns=wanted)):
                rows = pa.Table.from_batches([batch])
                if sink.emitted_only:
                    rows = rows.filter(pc.equal(rows.column("_status"), "emitted")).drop_columns(["_status"])
                yield f"{file_index}.{slice_index}", conformed(rows, sink, day)


def conformed(rows: pa.Table, sink: SinkColumns, day: str | None) -> pa.Table:
    """The chunk in ClickHouse's column order, with `_event_date`, timestamps as UTC microseconds."""
    n = rows.num_rows
    columns, names = [], []
    for name in sink.columns:
        column = rows.column(name)
        if pa.types.is_timestamp(column.type):
            # Spark writes INT96 (read as naive nanoseconds) or micros: both mean UTC instants.
            column = column.cast(pa.timestamp("us", tz="UTC"))
        elif pa.types.is_string_view(column.type) or pa.types.is_large_string(column.type):
            column = column.cast(pa.string())  # delta-rs reads strings as views; ClickHouse wants string
        columns.append(column)
        names.append(name)
    event_date = date.fromisoformat(day) if day else None
    columns.append(pa.array([event_date] * n, pa.date32()))
    names.append(PARTITION_COLUMN)
    return pa.table(columns, names=names)


def load_new_versions(
    spec: PipelineSpec,
    dsn: str,
    delta_path: str,
    log: Callable[[str], None] | None = None,
    client: Any = None,
) -> LoadResult:
    """Load every version after the last one in the ledger; returns what was loaded.

    `client`: an open client to reuse (continuous mode keeps one for the session: a new
    connection costs ~0.1 s); by default one is opened for this load and closed after it.
    """
    started = time.monotonic()
    result = LoadResult(table=spec.sink.table)
    delta = DeltaLog(delta_path)
    current = delta.latest_version()
    if current is None:
        raise ClickHouseLoadError(f"Delta table {delta_path} does not exist yet: run the pipeline first")
    table_id = delta.table_id()
    result.delta_version = current
    schema = _arrow_schema(delta) if spec.is_join else None
    sink = SinkColumns.of(spec)
    with nullcontext(client) if client is not None else open_client(dsn, log=log) as client:
        with_retries(lambda: ensure_schema(client, spec, schema), "preparing the ClickHouse tables", log=log)
        last = with_retries(lambda: last_loaded_version(client, spec, table_id), "reading the ledger", log=log)
        result.last_loaded_version = last
        for version in range(0 if last is None else last + 1, current + 1):
            commit = delta.commit(version)
            rows, chunks = (
                (0, 0) if is_rebuild(commit) else _insert_version(client, spec, table_id, delta, commit, sink, log)
            )
            crash_point("before_ledger_write")
            with_retries(
                lambda v=version, n=rows, c=chunks: client.insert(
                    ledger_table(spec),
                    [[spec.name, spec.sink.table, table_id, v, n, c]],
                    column_names=["pipeline", "target", "table_id", "delta_version", "rows", "chunks"],
                ),
                f"recording Delta version {version} in {LEDGER_TABLE}",
                log=log,
            )
            result.versions_loaded.append(version)
            result.rows_loaded += rows
            result.chunks += chunks
            result.last_loaded_version = version
    result.seconds = time.monotonic() - started
    return result


def _arrow_schema(delta: DeltaLog) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(delta.schema(), timezone="UTC")


def _insert_version(
    client: Any,
    spec: PipelineSpec,
    table_id: str,
    delta: DeltaLog,
    commit: Commit,
    sink: SinkColumns,
    log: Callable[[str], None] | None,
) -> tuple[int, int]:
    """Insert a version's chunks in order; returns (rows, chunks)."""
    rows = chunks = 0
    for chunk_id, chunk in version_chunks(delta, commit, sink, spec.sink.batch_size):
        chunks += 1
        if not chunk.num_rows:
            continue
        token = f"{spec.name}/{spec.sink.table}/{table_id}/{commit.version}/{chunk_id}"
        with_retries(
            lambda c=chunk, t=token: client.insert_arrow(
                qualified_table(spec), c, settings={"insert_deduplication_token": t}
            ),
            f"inserting Delta version {commit.version} chunk {chunk_id} into {qualified_table(spec)}",
            log=log,
        )
        rows += chunk.num_rows
        crash_point("during_clickhouse_insert")
    return rows, chunks
