"""Continuous mode: `riverhouse run --continuous` publishes as events arrive, stops cleanly on
SIGTERM, and a restart resumes without loss or duplicates (also after a SIGKILL)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.sink.clickhouse import open_client, qualified_table
from riverhouse.platform.state.settings import Settings
from tests.conftest import order, orders_spec, orders_spec_data, produce, riverhouse_cmd, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class Continuous:
    """A `riverhouse run --continuous` process whose stderr is followed line by line."""

    def __init__(self, spec_path: Path, settings: Settings):
        self.proc = subprocess.Popen(
            [*riverhouse_cmd(), "run", str(spec_path), "--continuous", "--json"],
            env=subprocess_env(settings),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())

    def wait_for_loaded(self, total: int, timeout_s: float = 300, verb: str = "loaded") -> None:
        """Until the process reports `total` rows loaded (or `verb`: produced) this session."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.lines:
                if line.startswith(f"{verb} ") and f", {total:,} this session)" in line:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"{total} rows never reported loaded:\n" + "\n".join(self.lines[-30:]))

    def stop(self, sig: int = signal.SIGTERM) -> dict[str, Any] | None:
        os.kill(self.proc.pid, sig)
        # stderr belongs to the reader thread; stdout holds only the small JSON summary.
        self.proc.wait(timeout=120)
        assert self.proc.stdout is not None
        stdout = self.proc.stdout.read()
        self._reader.join(timeout=30)
        if sig == signal.SIGKILL:
            with contextlib.suppress(ProcessLookupError):  # beside an engine there is no JVM of its own
                os.killpg(self.proc.pid, signal.SIGKILL)  # our own group: the orphaned JVM
            time.sleep(2)
            return None
        assert self.proc.returncode == 0, "\n".join(self.lines[-30:])
        return json.loads(stdout.strip().splitlines()[-1])


def ch_orders(settings: Settings, spec: Any) -> list[str]:
    with open_client(settings.clickhouse_dsn) as client:
        return sorted(r[0] for r in client.query(f"SELECT order_id FROM {qualified_table(spec)}").result_rows)


def test_continuous_mode_stops_cleanly_and_resumes_exactly_once(
    kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    spec = orders_spec(topic, name="streaming")
    spec_path = tmp_path / "streaming.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))

    def batch(prefix: str, n: int) -> list[tuple[bytes, bytes]]:
        events = [order(f"{prefix}{i}", "2026-01-01T10:00:00Z") for i in range(n)]
        return events + events[: n // 5]  # producer retries: duplicates

    produce(kafka, topic, batch("a", 50))
    first = Continuous(spec_path, settings)
    first.wait_for_loaded(50)
    produce(kafka, topic, batch("b", 30))  # arrives while the query runs
    first.wait_for_loaded(80)
    summary = first.stop(signal.SIGTERM)
    assert summary is not None and summary["mode"] == "continuous"
    assert summary["inserted"] == 80 and summary["duplicates_dropped"] == 16
    assert any("received SIGTERM" in line for line in first.lines)
    assert ch_orders(settings, spec) == sorted([f"a{i}" for i in range(50)] + [f"b{i}" for i in range(30)])

    # Killed outright this time: the restart finishes whatever the kill interrupted.
    produce(kafka, topic, batch("c", 20))
    second = Continuous(spec_path, settings)
    second.wait_for_loaded(20)
    second.stop(signal.SIGKILL)
    produce(kafka, topic, batch("d", 10))
    third = Continuous(spec_path, settings)
    third.wait_for_loaded(10)
    third.stop(signal.SIGTERM)
    want = sorted(
        [f"a{i}" for i in range(50)]
        + [f"b{i}" for i in range(30)]
        + [f"c{i}" for i in range(20)]
        + [f"d{i}" for i in range(10)]
    )
    assert ch_orders(settings, spec) == want


def test_continuous_mode_produces_to_its_topic_exactly_once(
    kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    """One transactional producer for the session; a SIGKILL in between costs no row and doubles none."""
    from tests.integration.test_topic_sink import committed_records

    data = orders_spec_data(topic, name="streaming_topic")
    data["sinks"] = [data.pop("sink"), {"kind": "kafka", "topic": f"{topic}_out", "key": ["order_id"]}]
    spec_path = tmp_path / "streaming_topic.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    produce(kafka, topic, [order(f"a{i}", "2026-01-01T10:00:00Z") for i in range(40)])
    first = Continuous(spec_path, settings)
    first.wait_for_loaded(40, verb="produced")
    produce(kafka, topic, [order(f"b{i}", "2026-01-01T10:00:00Z") for i in range(20)])
    first.wait_for_loaded(60, verb="produced")
    first.stop(signal.SIGKILL)
    produce(kafka, topic, [order(f"c{i}", "2026-01-01T10:00:00Z") for i in range(10)] * 2)
    second = Continuous(spec_path, settings)
    second.wait_for_loaded(10, verb="produced")
    summary = second.stop(signal.SIGTERM)
    assert summary is not None and summary["topic_rows_produced"] == 10
    want = sorted([f"a{i}" for i in range(40)] + [f"b{i}" for i in range(20)] + [f"c{i}" for i in range(10)])
    assert sorted(r.key().decode() for r in committed_records(kafka, f"{topic}_out")) == want
