"""Crash points for the exactly-once tests.

Setting RIVERHOUSE_CRASH_AT=<point> makes the process SIGKILL itself when it
reaches that point (optionally on the Nth visit with RIVERHOUSE_CRASH_ON=N), so
tests can prove that a re-run after a crash anywhere gives the same rows. A
real kill, not a simulated exception: nothing gets to clean up.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "after_bronze_commit",
    "after_silver_commit",
    "after_silver_compaction",
    "during_clickhouse_insert",
    "before_ledger_write",
)
_visits: dict[str, int] = {}


def crash_point(point: str) -> None:
    target = os.environ.get("RIVERHOUSE_CRASH_AT")
    if target != point:
        return
    _visits[point] = _visits.get(point, 0) + 1
    if _visits[point] >= int(os.environ.get("RIVERHOUSE_CRASH_ON", "1")):
        os.kill(os.getpid(), signal.SIGKILL)
