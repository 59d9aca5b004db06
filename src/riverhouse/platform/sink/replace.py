"""Backfill a time window in ClickHouse: swap its days for the Delta snapshot's rows.

ClickHouse tables are partitioned by `_event_date`. The streaming loader first catches up (so
nothing the snapshot holds is loaded again later); then each day of the window is read from
exactly the Delta version the loader reached, written to a staging table, and swapped in with
`ALTER TABLE ... REPLACE PARTITION`: readers see the old day or the new day, never half of it
or both. The day is read from the snapshot's files (delta-rs resolves which files make up the
version), slice by slice: no Spark job, and the driver never holds more than a slice.
Rebuild commits carry `riverhouse.rebuild`, and the streaming loader records them in its
ledger without inserting their rows, so a day is never loaded twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.sink.clickhouse import (
    ClickHouseLoadError,
    open_client,
    qualified_table,
    quote,
    sink_table_path,
    staging_table_name,
    with_retries,
)
from riverhouse.platform.sink.versions import SinkColumns, conformed, load_new_versions
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import sink_lock
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import open_table
from riverhouse.platform.state.windows import window_days


@dataclass
class ReplaceResult:
    table: str
    days: list[str]
    rows: int = 0
    caught_up_rows: int = 0
    delta_version: int | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def replace_clickhouse_window(
    spec: PipelineSpec,
    settings: Settings,
    start: datetime,
    end: datetime,
    log: Callable[[str], None] = print,
) -> ReplaceResult:
    """Swap the days covering [start, end) of the ClickHouse table for the Delta snapshot's rows."""
    started = time.monotonic()
    days = window_days(start, end)
    path = sink_table_path(spec, settings.warehouse)
    result = ReplaceResult(table=qualified_table(spec), days=[d.isoformat() for d in days])
    sink = SinkColumns.of(spec)
    with sink_lock(settings, spec.name, log):
        caught_up = load_new_versions(spec, settings.clickhouse_dsn, path, log=log)
        result.caught_up_rows = caught_up.rows_loaded
        table = open_table(path)
        if table is None or caught_up.delta_version is None:
            raise ClickHouseLoadError(f"Delta table {path} does not exist yet: run the pipeline first")
        # Exactly the version the loader reached: later versions are the stream's to load.
        table.load_as_version(caught_up.delta_version)
        result.delta_version = caught_up.delta_version
        dataset = table.to_pyarrow_dataset()
        wanted = [*sink.columns, *(["_status"] if sink.emitted_only else [])]
        staging_table = (quote(spec.sink.database) + "." if spec.sink.database else "") + quote(
            staging_table_name(spec.sink.table)
        )
        with open_client(settings.clickhouse_dsn) as client:
            for day in days:
                with_retries(
                    lambda: client.command(f"DROP TABLE IF EXISTS {staging_table}"), "dropping staging", log=log
                )
                with_retries(
                    lambda: client.command(f"CREATE TABLE {staging_table} AS {qualified_table(spec)}"),
                    "creating staging",
                    log=log,
                )
                count = 0
                in_day = pc.field(sink.date_column) == pa.scalar(day, pa.date32())
                for batch in dataset.to_batches(columns=wanted, filter=in_day, batch_size=spec.sink.batch_size):
                    rows = pa.Table.from_batches([batch])
                    if sink.emitted_only:
                        rows = rows.filter(pc.equal(rows.column("_status"), "emitted")).drop_columns(["_status"])
                    if not rows.num_rows:
                        continue
                    chunk = conformed(rows, sink, day.isoformat())
                    with_retries(
                        lambda c=chunk: client.insert_arrow(staging_table, c),
                        f"staging {day} for {qualified_table(spec)}",
                        log=log,
                    )
                    count += chunk.num_rows
                with_retries(
                    lambda d=day: client.command(
                        f"ALTER TABLE {qualified_table(spec)} REPLACE PARTITION '{d.isoformat()}' FROM {staging_table}"
                    ),
                    f"replacing partition {day}",
                    log=log,
                )
                client.command(f"DROP TABLE IF EXISTS {staging_table}")
                result.rows += count
                log(
                    f"ClickHouse {qualified_table(spec)} partition {day}: replaced with {count:,} rows "
                    f"(Delta version {caught_up.delta_version})"
                )
    result.seconds = time.monotonic() - started
    return result
