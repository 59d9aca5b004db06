"""Crash points for the exactly-once tests.

Setting RIVERHOUSE_CRASH_AT=<point> makes the process SIGKILL itself when it reaches that
point (on the Nth visit with RIVERHOUSE_CRASH_ON=N), so tests can prove that a re-run after
a crash anywhere gives the same rows. A real kill, not a simulated exception: nothing gets
to clean up.

The batch body of a streaming query may run in another process than the one that started
the run (beside a Spark Connect server), whose environment is the server's. So a run
captures its plan once (`FaultPlan.from_env`) and hands it to the batch body, which calls
`plan.hit(point)`. `RIVERHOUSE_CRASH_KILL_PIDS` names more processes to kill with it (the
engine's JVM: "the engine died mid-batch").

RIVERHOUSE_STALL_AT=<point> with RIVERHOUSE_STALL_S=<seconds> makes the first visit of that
point sleep instead: a slow batch, so a test can kill the run's client while the batch is
still being written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass

_visits: dict[str, int] = {}


@dataclass(frozen=True)
class FaultPlan:
    point: str = ""
    visit: int = 1
    kill_pids: tuple[int, ...] = ()
    stall_point: str = ""
    stall_s: float = 0.0

    @classmethod
    def from_env(cls) -> FaultPlan:
        env = os.environ
        pids = tuple(int(p) for p in env.get("RIVERHOUSE_CRASH_KILL_PIDS", "").split(",") if p.strip())
        crash = (env.get("RIVERHOUSE_CRASH_AT", ""), int(env.get("RIVERHOUSE_CRASH_ON", "1")), pids)
        return cls(*crash, env.get("RIVERHOUSE_STALL_AT", ""), float(env.get("RIVERHOUSE_STALL_S", "0") or 0))

    def hit(self, point: str) -> None:
        if self.stall_point == point and not _visits.get(f"stall:{point}"):
            _visits[f"stall:{point}"] = 1
            time.sleep(self.stall_s)
        if not self.point or self.point != point:
            return
        _visits[point] = _visits.get(point, 0) + 1
        if _visits[point] >= self.visit:
            for pid in self.kill_pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


def crash_point(point: str) -> None:
    """A crash point in code that runs in the run's own process (the loader, gold)."""
    FaultPlan.from_env().hit(point)
