"""The demo prints each step of its Dagster runs as it ends (`demo.StepReporter`), failures too."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from riverhouse.demo import StepReporter

pytestmark = pytest.mark.dagster


def test_each_step_is_reported_once_as_it_ends_and_a_failure_says_so(tmp_path: Path) -> None:
    home = tmp_path / "dagster"
    home.mkdir()
    second_may_end = threading.Event()

    @dg.asset
    def first() -> int:
        return 1

    @dg.asset
    def second(first: int) -> int:
        assert second_may_end.wait(30)
        return first + 1

    @dg.asset
    def third(second: int) -> int:
        raise RuntimeError("third fails")

    lines: list[tuple[float, str]] = []
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        # A run before the reporter starts: its steps are not the demo's and are not printed.
        assert dg.materialize([first], instance=instance).success
        with StepReporter(home, lambda line: lines.append((time.monotonic(), line))):
            runner = threading.Thread(
                target=lambda: dg.materialize([first, second, third], instance=instance, raise_on_error=False)
            )
            runner.start()
            deadline = time.monotonic() + 60
            while not any("first" in line for _, line in lines) and time.monotonic() < deadline:
                time.sleep(0.1)
            # The first step was printed while the run still waited in the second: as it ended.
            assert [line for _, line in lines] == [lines[0][1]] and lines[0][1].startswith("  step first done in ")
            second_may_end.set()
            runner.join(60)
    finally:
        instance.dispose()
    steps = [line.split()[1:3] for _, line in lines]
    assert steps == [["first", "done"], ["second", "done"], ["third", "FAILED"]]
