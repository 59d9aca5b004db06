"""Prometheus metrics: continuous mode's endpoint and a triggered run's push agree with the runs' own summaries."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from riverhouse.platform.state.settings import Settings
from tests.conftest import order, orders_spec, produce, riverhouse_cmd, subprocess_env
from tests.integration.test_continuous import Continuous

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(text: str, pipeline: str) -> dict[str, float]:
    """Sample name -> value summed over the pipeline's sources and partitions."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("pipeline") == pipeline:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def events(prefix: str, n: int, malformed: int) -> list[tuple[bytes, bytes]]:
    unique = [order(f"{prefix}{i}", "2026-01-01T10:00:00Z") for i in range(n)]
    return unique + unique[: n // 4] + [(b"x", b'{"order_id": ') for _ in range(malformed)]


class MeteredContinuous(Continuous):
    """test_continuous's process, started with the metrics variables set."""

    def __init__(self, spec_path: Path, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [*riverhouse_cmd(), "run", str(spec_path), "--continuous", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


def test_continuous_endpoint_counts_what_the_run_summary_reports(
    kafka: str, topic: str, settings: Settings, tmp_path: Path
) -> None:
    spec = orders_spec(topic, name="metered")
    spec_path = tmp_path / "metered.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    port = free_port()
    produce(kafka, topic, events("a", 40, malformed=3))
    run = MeteredContinuous(
        spec_path, subprocess_env(settings, RIVERHOUSE_METRICS_PORT=str(port), RIVERHOUSE_METRICS_LAG_INTERVAL="1")
    )
    try:
        run.wait_for_loaded(40)
        produce(kafka, topic, events("b", 20, malformed=2))
        run.wait_for_loaded(60)
        time.sleep(2.5)  # two lag refreshes after the last commit
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            scraped = samples(response.read().decode(), "metered")
    finally:
        summary = run.stop(signal.SIGTERM)
    assert summary is not None
    # Figures written by hand from the events produced, then the summary, then the endpoint.
    assert (summary["read"], summary["duplicates_dropped"], summary["quarantined"]) == (80, 15, 5)
    assert scraped["riverhouse_records_read_total"] == summary["read"]
    assert scraped["riverhouse_duplicates_dropped_total"] == summary["duplicates_dropped"]
    assert scraped["riverhouse_quarantined_total"] == summary["quarantined"]
    assert scraped["riverhouse_silver_inserted_total"] == summary["inserted"] == 60
    assert scraped["riverhouse_batches_total"] == summary["batches"]
    assert scraped["riverhouse_batch_duration_seconds_count"] == summary["batches"]
    assert scraped["riverhouse_clickhouse_rows_loaded_total"] == summary["clickhouse_rows_loaded"] == 60
    assert scraped["riverhouse_clickhouse_insert_errors_total"] == 0
    assert scraped["riverhouse_last_loaded_delta_version"] >= 1
    assert scraped["riverhouse_kafka_lag_records"] == 0  # everything produced was committed
    # The endpoint goes away with the run.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


class PushCapture(BaseHTTPRequestHandler):
    """Records what a Pushgateway would receive (PUT /metrics/job/<job>/<label>/<value>)."""

    received: list[tuple[str, str, str]] = []

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        PushCapture.received.append(("PUT", self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def push_capture() -> Iterator[str]:
    PushCapture.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), PushCapture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_triggered_run_pushes_its_figures(
    kafka: str, topic: str, settings: Settings, tmp_path: Path, push_capture: str
) -> None:
    spec = orders_spec(topic, name="pushed")
    spec_path = tmp_path / "pushed.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    produce(kafka, topic, events("p", 30, malformed=4))
    proc = subprocess.run(
        [*riverhouse_cmd(), "run", str(spec_path), "--json"],
        env=subprocess_env(settings, RIVERHOUSE_METRICS_PUSHGATEWAY=push_capture),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    pushes = PushCapture.received
    assert pushes and all(path == "/metrics/job/riverhouse/pipeline/pushed" for _, path, _ in pushes)
    last = samples(pushes[-1][2], "pushed")
    assert (summary["read"], summary["duplicates_dropped"], summary["quarantined"]) == (41, 7, 4)
    assert last["riverhouse_records_read_total"] == summary["read"]
    assert last["riverhouse_duplicates_dropped_total"] == summary["duplicates_dropped"]
    assert last["riverhouse_quarantined_total"] == summary["quarantined"]
    assert last["riverhouse_clickhouse_rows_loaded_total"] == summary["clickhouse_rows_loaded"] == 30
    assert last["riverhouse_last_loaded_delta_version"] == summary["last_loaded_version"]
    assert last["riverhouse_kafka_lag_records"] == 0
    assert last["riverhouse_metrics_pushed_timestamp_seconds"] > time.time() - 600
