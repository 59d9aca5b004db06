"""A backfill's window: its label, its days, and a rebuild's result.

Shared by the rebuilds of each layer (ingest/rebuild.py, gold/rebuild.py, sink/replace.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, timedelta
from typing import Any


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

    def summary(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in values.items()}


def window_label(start: datetime, end: datetime) -> str:
    return f"{start.astimezone(UTC).isoformat()}/{end.astimezone(UTC).isoformat()}"


def window_days(start: datetime, end: datetime) -> list[date]:
    first = start.astimezone(UTC).date()
    last = (end.astimezone(UTC) - timedelta(microseconds=1)).date()
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]
