"""Issue 27, item 9: `riverhouse ui`, sent SIGTERM or SIGINT, leaves no process behind.

The real command: the local broker, the engine (a Spark Connect server, in one of the two
cases), `dagster dev` and what it starts (code server, webserver, daemon). Every process of its
tree is listed from /proc while it serves the UI; after the signal, the command exits and none
of them is left, the broker and the engine included.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.runtime import engine as engine_state
from riverhouse.platform.state.settings import Settings
from tests.conftest import orders_spec, riverhouse_cmd, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def tree_of(root: int) -> list[int]:
    """The living processes below `root` (read from /proc, not from the code under test)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    found, queue = [], [root]
    while queue:
        current = queue.pop()
        kids = [pid for pid, parent in parents.items() if parent == current]
        found += kids
        queue += kids
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serves(ui: subprocess.Popen[str], port: int) -> bool:
    """Until the Dagster UI answers on `port` (True), or the command stopped because the port was taken (False)."""
    deadline = time.monotonic() + 420
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2):
                return True
        except OSError:
            if ui.poll() is not None:
                output = ui.stdout.read() if ui.stdout else ""
                assert f"port {port} is taken by another process" in output, f"riverhouse ui exited: {output}"
                return False
            assert time.monotonic() < deadline, "the Dagster UI did not come up within 420 s"
            time.sleep(1)


def test_ui_on_a_taken_port_says_so_and_starts_nothing(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = subprocess.run(
            [*riverhouse_cmd(), "ui", "--port", str(port), "--no-engine"],
            env=subprocess_env(settings, RIVERHOUSE_KAFKA_BOOTSTRAP="", RIVERHOUSE_SPARK_REMOTE=""),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 1
    assert f"port {port} is taken by another process: choose another with --port" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
    assert local_kafka.read_state(settings.kafka_state_dir) is None  # nothing was started


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reading a process tree needs Linux's /proc")
@pytest.mark.parametrize(("signum", "engine"), [(signal.SIGTERM, "--engine"), (signal.SIGINT, "--no-engine")])
def test_ui_stops_its_whole_tree_on_a_signal(tmp_path: Path, signum: int, engine: str) -> None:
    settings = Settings.from_env(tmp_path / "home")
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    data = orders_spec("ui_stop_orders", name="ui_stop").model_dump(mode="json", exclude_none=True)
    data["orchestration"]["sensor"]["enabled"] = False
    (pipelines / "ui_stop.yaml").write_text(yaml.safe_dump(data))
    tree: list[int] = []
    ui: subprocess.Popen[str] | None = None
    try:
        # Its port is chosen here, free now; the broker `riverhouse ui` starts picks free ports of
        # its own meanwhile and may take it. The command then stops and says so: another port.
        for _attempt in range(3):
            port = free_port()
            ui = subprocess.Popen(
                [*riverhouse_cmd(), "ui", "--port", str(port), "--pipelines", str(pipelines), engine],
                # Not the tests' shared engine: with --engine, `riverhouse ui` starts (and must stop) its own.
                env=subprocess_env(settings, RIVERHOUSE_KAFKA_BOOTSTRAP="", RIVERHOUSE_SPARK_REMOTE=""),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            if _serves(ui, port):
                break
        else:
            pytest.fail("three ports in a row were taken while `riverhouse ui` started")
        broker = local_kafka.status(settings.kafka_state_dir)
        assert broker is not None
        tree = tree_of(ui.pid)
        assert broker.pid in tree and len(tree) >= 4  # broker, dagster dev, webserver, daemon/code server
        started_engine = engine_state.status(settings.engine_state_dir)
        assert (started_engine is not None and started_engine.pid in tree) == (engine == "--engine")
        ui.send_signal(signum)
        assert ui.wait(timeout=120) == 0
        assert [pid for pid in tree if running(pid)] == []
        assert local_kafka.status(settings.kafka_state_dir) is None
        assert engine_state.status(settings.engine_state_dir) is None
    finally:  # whatever the test started and left: by PID
        if ui is not None and ui.poll() is None:
            ui.kill()
        for pid in tree:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        engine_state.stop(settings.engine_state_dir)
        local_kafka.stop(settings.kafka_state_dir)
