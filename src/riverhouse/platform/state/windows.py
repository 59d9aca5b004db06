"""A backfill's window: its label, its days, its result, and its rows as a table holds them.

Shared by the rebuilds of each layer (ingest/rebuild.py, gold/rebuild.py, sink/replace.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.state.tables import open_table, plain_strings


@dataclass(frozen=True)
class Window:
    """A half-open time window [start, end) in UTC: what a backfill of one partition recomputes."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", self.start.astimezone(UTC))
        object.__setattr__(self, "end", self.end.astimezone(UTC))
        if self.end <= self.start:
            raise ValueError(f"a window must end after it starts, got {self.start.isoformat()}/{self.end.isoformat()}")


@dataclass
class RebuildResult:
    table: str
    window: str
    rows: int = 0
    rows_before: int = 0
    changed: bool = False
    delta_version: int | None = None
    seconds: float = 0.0
    # The window's rows as the table now holds them (what the checks validate), read with
    # delta-rs after the commit; None when the caller asked for no rows (`publish=False`).
    published: pa.Table | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "published"}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in values.items()}


def window_label(start: datetime, end: datetime) -> str:
    return f"{start.astimezone(UTC).isoformat()}/{end.astimezone(UTC).isoformat()}"


def window_days(start: datetime, end: datetime) -> list[date]:
    first = start.astimezone(UTC).date()
    last = (end.astimezone(UTC) - timedelta(microseconds=1)).date()
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def published_rows(path: str, time_col: str, date_col: str, start: datetime, end: datetime) -> pa.Table:
    """The window's rows as the table holds them, for the checks (a delta-rs read: no JVM needed)."""
    table = open_table(path)
    if table is None:
        raise RuntimeError(f"Delta table {path} does not exist: run the pipeline before backfilling it")
    lo_date = pa.scalar(start.astimezone(UTC).date(), pa.date32())
    hi_date = pa.scalar((end.astimezone(UTC) - timedelta(microseconds=1)).date(), pa.date32())
    flt = (
        (pc.field(date_col) >= lo_date)
        & (pc.field(date_col) <= hi_date)
        & (pc.field(time_col) >= start)
        & (pc.field(time_col) < end)
    )
    return plain_strings(table.to_pyarrow_dataset().to_table(filter=flt))
