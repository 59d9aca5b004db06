"""A test double of the Riverhouse resource, the way Dagster's project_fully_featured fakes its API client.

`FakeRiverhouse` is another implementation of the abstract `Riverhouse` resource: its
pipelines do no work, and each step's metadata says what the asset handed the engine
(the window, the ingest metadata, `drain`), so tests read it back from the run's
materializations. `failing` names checks that fail (to see blocking checks stop a run).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from riverhouse.platform.kafka.lag import PipelineLag, SourceLag
from riverhouse.platform.pipeline import Window
from riverhouse.platform.publish import CheckOutcome, Published
from riverhouse.platform.spec import PipelineSpec
from riverhouse.resources import Riverhouse


def window_label(window: Window | None) -> str:
    return "none" if window is None else f"{window.start.isoformat()}/{window.end.isoformat()}"


class FakePipeline:
    def __init__(self, spec: PipelineSpec, failing: list[str], lag: int, log: Callable[[str], None]):
        self.spec = spec
        self.failing = failing
        self.waiting = lag
        self.log = log

    def _check(self, name: str) -> CheckOutcome:
        passed = name not in self.failing
        return CheckOutcome(passed, {"fake": True}, None if passed else f"{name} failed (fake)")

    def publish_ingests(self, sources: list[str], lock_wait_s: float = 0.0) -> dict[str, Published]:
        return {
            source: Published(
                "stream",
                {
                    "records_in": 10,
                    "quarantined": 1,
                    "duplicates_dropped": 2,
                    "silver_version_after": 7,
                    "source": source,
                },
                related={"quarantine": {"quarantined": 1}},
            )
            for source in sources
        }

    def publish_silver(self, source: str, window: Window | None, ingested: dict[str, Any] | None = None) -> Published:
        metadata = {"window": window_label(window), "ingested_records": int((ingested or {}).get("records_in", -1))}
        return Published("rebuild" if window else "stream", metadata, pa.table({"x": [1]}))

    def publish_gold(self, window: Window | None, drain: bool = False) -> Published:
        return Published("rebuild" if window else "stream", {"window": window_label(window), "drain": drain})

    def publish_clickhouse(self, window: Window | None) -> Published:
        return Published("rebuild" if window else "stream", {"window": window_label(window)})

    def run_checks(self, checks: dict[str, Callable[[], CheckOutcome]]) -> dict[str, CheckOutcome]:
        return {name: check() for name, check in checks.items()}

    def check_rejected_rate(self, records: int, rejected: int) -> CheckOutcome:
        return self._check("rejected_rate")

    def check_silver(self, source: str, written: Any) -> CheckOutcome:
        return self._check("silver")

    def check_unique_keys(self, source: str, spans: Any) -> CheckOutcome:
        return self._check("unique_keys")

    def check_one_row_per_left_event(self, spans: Any) -> CheckOutcome:
        return self._check("gold")

    def check_clickhouse(self) -> CheckOutcome:
        return self._check("clickhouse")

    def lag(self, sources: list[str] | None = None, closed_is_final: bool = False) -> PipelineLag:
        src = self.spec.sink_source
        return PipelineLag(
            self.spec.name, [SourceLag(self.spec.sink_source_name, src.topic, {"0": 5}, {}, self.waiting)]
        )

    def continuous(self, stop: threading.Event, load: bool = True) -> dict[str, Any]:
        stop.wait(5)
        return {"pipeline": self.spec.name, "mode": "continuous", "read": 0}


class FakeRiverhouse(Riverhouse):
    failing: list[str] = []
    lag: int = 0

    def pipeline(  # type: ignore[override]
        self, spec: PipelineSpec, log: Callable[[str], None] = print, warn: Callable[[str], None] | None = None
    ) -> FakePipeline:
        return FakePipeline(spec, list(self.failing), self.lag, log)
