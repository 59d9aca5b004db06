"""The local Kafka: librdkafka's mock cluster hosted by a background process.

It speaks the real Kafka wire protocol on 127.0.0.1, so every client (ours and
yours) talks to it as to a broker. Its limits are real (see docs/architecture.md):
in memory only, 4 partitions per auto-created topic, about 5 MB retained per
partition, no CreateTopics with a partition count, no offset-by-timestamp.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

STATE_FILE = "state.json"


class LocalKafkaError(RuntimeError):
    pass


@dataclass(frozen=True)
class LocalKafkaState:
    pid: int
    bootstrap: str
    started_at: float

    def is_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie child of ours still answers kill(0); check /proc where we can.
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
            return "\nState:\tZ" not in status
        except OSError:
            return True


def read_state(state_dir: Path) -> LocalKafkaState | None:
    path = Path(state_dir) / STATE_FILE
    try:
        data = json.loads(path.read_text())
        return LocalKafkaState(int(data["pid"]), str(data["bootstrap"]), float(data["started_at"]))
    except (OSError, ValueError, KeyError):
        return None


def status(state_dir: Path) -> LocalKafkaState | None:
    state = read_state(state_dir)
    return state if state and state.is_alive() else None


def start(state_dir: Path, brokers: int = 1, timeout_s: float = 30.0) -> LocalKafkaState:
    """Start the mock cluster in a detached process, or return the running one."""
    state_dir = Path(state_dir)
    running = status(state_dir)
    if running:
        return running
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    log = open(state_dir / "kafka.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "riverhouse.platform.local_kafka", str(state_dir), str(brokers)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # survives the CLI that started it, ignores its Ctrl-C
    )
    log.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = read_state(state_dir)
        if state and state.pid == proc.pid:
            return state
        if proc.poll() is not None:
            raise LocalKafkaError(f"the local Kafka exited with code {proc.returncode}; see {state_dir / 'kafka.log'}")
        time.sleep(0.1)
    proc.kill()
    raise LocalKafkaError(f"the local Kafka did not start within {timeout_s:.0f}s; see {state_dir / 'kafka.log'}")


def stop(state_dir: Path, timeout_s: float = 10.0) -> bool:
    """Stop the process recorded in the state file (only that PID). True if one was running."""
    state = status(Path(state_dir))
    (Path(state_dir) / STATE_FILE).unlink(missing_ok=True)
    if not state:
        return False
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and state.is_alive():
        time.sleep(0.05)
    if state.is_alive():
        os.kill(state.pid, signal.SIGKILL)
    return True


def serve(state_dir: Path, brokers: int = 1) -> None:
    """Body of the background process: host the mock cluster until SIGTERM."""
    from confluent_kafka import Producer

    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # The mock cluster lives as long as this client handle does.
    host = Producer({"test.mock.num.brokers": brokers, "log_level": 3})
    metadata = host.list_topics(timeout=10)
    bootstrap = ",".join(f"{b.host}:{b.port}" for b in sorted(metadata.brokers.values(), key=lambda b: b.id))
    tmp = Path(state_dir) / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "bootstrap": bootstrap, "started_at": time.time()}))
    tmp.replace(Path(state_dir) / STATE_FILE)
    print(f"local Kafka (librdkafka mock cluster) listening on {bootstrap}", flush=True)
    while not stopping:
        host.poll(0.5)
    print("local Kafka stopping", flush=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1)
