"""The local schema registry: Apicurio Registry's runnable build (jvm/pom.xml, profile `registry`).

`riverhouse registry start` runs it on 127.0.0.1 only, with its schemas in an H2 database file
under the state folder (`<home>/registry/data/`), so schema ids stay valid across restarts (the
records in Kafka carry them). `registry.json` keeps the port chosen at the first start,
`state.json` the pid and URL while it runs, `logs/registry.out` its log. Producers and sources
use its Confluent-compatible API, `<url>/apis/ccompat/v7`; new subjects get BACKWARD
compatibility, as Confluent's registry does by default (Apicurio's own default checks nothing).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from riverhouse.platform.runtime import processes
from riverhouse.platform.runtime.processes import free_port, pid_alive, port_free, terminate

STATE_FILE = "state.json"
RECORD_FILE = "registry.json"
CCOMPAT = "/apis/ccompat/v7"
HEAP = os.environ.get("RIVERHOUSE_REGISTRY_HEAP", "256m")


class LocalRegistryError(RuntimeError):
    pass


@dataclass(frozen=True)
class RegistryState:
    pid: int
    url: str  # http://127.0.0.1:PORT (the Confluent-compatible API is at url + CCOMPAT)
    started_at: float
    state_dir: str = ""

    @property
    def api(self) -> str:
        return self.url + CCOMPAT

    def is_alive(self) -> bool:
        return pid_alive(self.pid)


def runner_jar() -> Path:
    from riverhouse.platform.runtime.jars import jars_root

    found = sorted((jars_root() / "registry").glob("apicurio-registry-app-*-runner.jar"))
    if not found:
        raise LocalRegistryError(
            f"the schema registry is not in {jars_root() / 'registry'}: run `make jars` in the Riverhouse "
            "checkout (it fetches Apicurio Registry from Maven Central)"
        )
    return found[-1]


def read_state(state_dir: Path) -> RegistryState | None:
    try:
        data = json.loads((Path(state_dir) / STATE_FILE).read_text())
        return RegistryState(int(data["pid"]), str(data["url"]), float(data["started_at"]), str(state_dir))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def status(state_dir: Path) -> RegistryState | None:
    state = read_state(state_dir)
    return state if state and state.is_alive() else None


def _port(state_dir: Path) -> int:
    path = state_dir / RECORD_FILE
    try:
        return int(json.loads(path.read_text())["port"])
    except (OSError, ValueError, KeyError, TypeError):
        port = free_port()
        path.write_text(json.dumps({"port": port}))
        return port


def start(state_dir: Path, timeout_s: float = 90.0) -> RegistryState:
    """Start the registry in the background (or return the running one) and wait until it is ready."""
    from riverhouse.platform.kafka.local_kafka import _java

    state_dir = Path(state_dir).resolve()
    if running := status(state_dir):
        return running
    jar = runner_jar()
    for folder in ("data", "logs"):
        (state_dir / folder).mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    port = _port(state_dir)
    if not port_free(port):
        raise LocalRegistryError(
            f"the local registry's port {port} (fixed in {state_dir / RECORD_FILE} at its first start) is taken "
            "by another process: stop that process, or remove that file to choose another port"
        )
    env = {**os.environ, "REGISTRY_DATASOURCE_URL": f"jdbc:h2:file:{state_dir / 'data' / 'registry'}"}
    log = open(state_dir / "logs" / "registry.out", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [_java(), f"-Xmx{HEAP}", "-Djava.awt.headless=true", "-Dquarkus.http.host=127.0.0.1",
         f"-Dquarkus.http.port={port}", "-jar", str(jar)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=state_dir,
        start_new_session=True,  # survives the CLI that started it, ignores its Ctrl-C
    )  # fmt: skip
    log.close()
    state = RegistryState(proc.pid, f"http://127.0.0.1:{port}", time.time(), str(state_dir))
    try:
        _wait_until_ready(state, proc, timeout_s)
        _request(state.api + "/config", "PUT", {"compatibility": "BACKWARD"})
    except BaseException:
        terminate(proc.pid, lambda: proc.poll() is None)
        raise
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps({"pid": proc.pid, "url": state.url, "started_at": state.started_at}))
    tmp.replace(state_dir / STATE_FILE)
    return state


def _request(url: str, method: str = "GET", body: object | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/vnd.schemaregistry.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def _wait_until_ready(state: RegistryState, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LocalRegistryError(
                f"the schema registry exited with code {proc.returncode} while starting:\n{log_tail(state)}"
            )
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            if _request(state.url + "/health/ready") is not None:
                return
        time.sleep(0.2)
    raise LocalRegistryError(f"the schema registry did not get ready within {timeout_s:.0f}s:\n{log_tail(state)}")


def log_tail(state: RegistryState, lines: int = 15) -> str:
    return processes.log_tail(Path(state.state_dir) / "logs" / "registry.out", lines)


def stop(state_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the registry recorded in the state file (only that PID). True if one was running."""
    state = status(Path(state_dir))
    (Path(state_dir) / STATE_FILE).unlink(missing_ok=True)
    if not state:
        return False
    terminate(state.pid, state.is_alive, timeout_s)
    return True
