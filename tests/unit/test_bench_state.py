"""dedup_state's result: what it measures in its two processes, put together (the processes are the bench's)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from riverhouse.platform.state.settings import Settings
from riverhouse_bench import state

pytestmark = pytest.mark.unit


def test_the_result_adds_the_build_and_the_silver_step_and_caps_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's time is `silver_step_s` (reading `step_s` ended every run in a KeyError); a small key
    count gets a batch of at most ten times its keys, so its tenth of repeats are all stored keys."""
    calls: list[tuple[str, tuple[Any, ...]]] = []

    def own_process(target: Any, *args: Any) -> dict[str, Any]:
        calls.append((target.__name__, args))
        if target is state.build_silver:
            return {"files": 1}
        batch_rows = args[3]  # silver, warm-up table, keys, batch rows, master, settings
        return {
            "batch_events": batch_rows,
            "silver_step_s": 1.5,
            "bytes_per_key": 40.0,
            "inserted": batch_rows * 9 // 10,
        }

    monkeypatch.setattr(state, "_in_own_process", own_process)
    bench: Any = SimpleNamespace(settings=Settings.from_env(tmp_path))
    result = state.dedup_state(bench, 2000)
    assert [name for name, _ in calls] == ["build_silver", "measure_silver_step"]
    assert calls[1][1][2:4] == (2000, 20_000)  # keys, batch rows: ten times the keys
    assert result["keys"] == 2000 and result["events"] == 22_000 and result["batch_events"] == 20_000
    assert result["seconds"] == pytest.approx(result["build_s"] + 1.5, abs=1e-3)  # build_s is rounded
    calls.clear()
    assert state.dedup_state(bench, 1_000_000)["batch_events"] == 200_000  # large counts: the default batch
