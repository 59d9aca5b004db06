"""A Dagster run launcher whose runs start warm (issue 26): `WarmRunLauncher`.

Dagster's default launcher starts every run in a new interpreter, which imports Dagster, Great
Expectations, pyspark's Connect client, pandas and pyarrow before the run's first step: ~2 s of
a triggered run's launch, and GX's import (~2.5 CPU s) then overlapped the first batch on the
engine (bench/analysis.md). This launcher keeps one process that has imported them (the warm
server, `python -m riverhouse.launcher`) and forks each run from it: the run's process starts
with those modules in memory and imports only the code location (`riverhouse.definitions`,
which reads the pipeline specs), so a spec edited between two runs is the next run's spec.

- A run is what `dagster api execute_run` runs (Dagster's own run worker entry point, the one
  its Docker and Kubernetes launchers start), in the forked process.
- The server starts with the launcher's first run and warms in the background; until it is
  ready, and for a code location of another interpreter, a run starts as a new process of that
  interpreter (the same entry point). The server exits with the process that started it (the
  Dagster daemon, or the webserver for runs it launches itself); runs already started go on.
- Riverhouse's own modules are imported by the server too: a change to them (a new release, an
  edit in a checkout) is noticed at the next launch and the server is started again.
- `terminate` sends SIGTERM to the run's process, which Dagster's run worker turns into a
  cancellation; the process is found by its pid and start time (run tag `riverhouse/run_worker`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import _check as check
from dagster._core.launcher.base import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._serdes import ConfigurableClass, ConfigurableClassData

WORKER_TAG = "riverhouse/run_worker"  # "<pid>:<start time>" of the run's process
# What the server imports once: what every run would import again otherwise. Not the code
# location itself (it reads the specs), so each run builds its definitions from the specs of now.
PRELOAD = (
    "dagster._cli",
    "riverhouse.assets",
    "riverhouse.resources",
    "riverhouse.platform.quality.expectations",
    "pyspark.sql.connect.session",
    "pandas",
    "pyarrow",
)
READY_TIMEOUT_S = 120.0


def code_fingerprint() -> str:
    """Riverhouse's own modules as the server imported them: their paths, sizes and times."""
    import riverhouse

    digest = hashlib.sha256()
    for path in sorted(Path(riverhouse.__file__).parent.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _start_time(pid: int) -> str | None:
    from riverhouse.platform.runtime.processes import start_ticks

    ticks = start_ticks(pid)
    return None if ticks is None else str(ticks)


class WarmServer:
    """The launcher's side of the warm server: starts it, asks it for a run, stops it."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="riverhouse-launcher-"))
        self.address = str(self.folder / "server.sock")
        self.fingerprint = code_fingerprint()
        alive_r, self._alive_w = os.pipe()  # the server exits when this end closes (with us)
        ready_r, ready_w = os.pipe()
        self._ready_r = ready_r
        self.process = subprocess.Popen(
            [sys.executable, "-m", "riverhouse.launcher", self.address, str(alive_r), str(ready_w)],
            pass_fds=(alive_r, ready_w),
            stdin=subprocess.DEVNULL,
        )
        os.close(alive_r)
        os.close(ready_w)
        self._ready = False

    def ready(self, wait_s: float = 0.0) -> bool:
        if not self._ready and select.select([self._ready_r], [], [], wait_s)[0]:
            self._ready = os.read(self._ready_r, 16) == b"ready\n"
        return self._ready

    def fork(self, args_json: str) -> int:
        """A new run process from the server, running `dagster api execute_run <args_json>`."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            conn.connect(self.address)
            conn.sendall(json.dumps({"args": args_json}).encode() + b"\n")
            reply = json.loads(conn.makefile("rb").readline() or b"{}")
        return int(reply["pid"])

    def stop(self) -> None:
        for fd in (self._alive_w, self._ready_r):
            with contextlib.suppress(OSError):  # closed already (a second stop)
                os.close(fd)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            Path(self.address).unlink(missing_ok=True)
            self.folder.rmdir()


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    """Each run forked from a process that has already imported what a run imports (module doc).

    In dagster.yaml: `run_launcher: {module: riverhouse.launcher, class: WarmRunLauncher}`.
    """

    def __init__(self, inst_data: ConfigurableClassData | None = None):
        self._inst_data = inst_data
        self._server: WarmServer | None = None
        self._spawned: list[subprocess.Popen[bytes]] = []  # runs started as new processes
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> WarmRunLauncher:
        return cls(inst_data=inst_data)

    def _warm_server(self) -> WarmServer | None:
        """The server, when it is ready for this code; started (or started again) otherwise."""
        server = self._server
        if server is not None and (server.process.poll() is not None or server.fingerprint != code_fingerprint()):
            server.stop()  # it died, or Riverhouse's modules changed since it imported them
            server = self._server = None
        if server is None:
            self._server = WarmServer()
            return None
        return server if server.ready() else None

    def warm(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Start the warm server if it is not running, and wait until it takes runs (or `timeout_s`)."""
        if self._warm_server() is None and self._server is not None:
            self._server.ready(timeout_s)
        return self._warm_server() is not None

    def launch_run(self, context: LaunchRunContext) -> None:
        from dagster._grpc.types import ExecuteRunArgs
        from dagster._serdes import serialize_value

        run = context.dagster_run
        origin = check.not_none(run.job_code_origin, "WarmRunLauncher: the run has no code origin")
        args = serialize_value(
            ExecuteRunArgs(job_origin=origin, run_id=run.run_id, instance_ref=self._instance.get_ref())
        )
        same = os.path.realpath(origin.executable_path) == os.path.realpath(sys.executable)
        server = self._warm_server() if same else None
        pid, how = None, "a new process of its interpreter"
        if server is not None:
            try:
                pid, how = server.fork(args), "forked from the warm launcher's process"
            except OSError as exc:  # the server died since it said it was ready: started again next time
                how = f"a new process (the warm launcher's process did not answer: {exc})"
        elif same:
            how = "a new process (the warm launcher's process was not ready)"
        if pid is None:
            # As Dagster's other launchers start a run. The arguments (the instance's reference
            # among them) go in the environment, which only this user can read, not on the command
            # line every user's `ps` shows.
            python = sys.executable if same else origin.executable_path
            env = {**os.environ, "DAGSTER_EXECUTE_RUN_ARGS": args}
            self._spawned = [p for p in self._spawned if p.poll() is None]  # reaps those that ended
            process = subprocess.Popen(
                [python, "-m", "dagster", "api", "execute_run"], env=env, stdin=subprocess.DEVNULL
            )
            self._spawned.append(process)
            pid = process.pid
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: f"{pid}:{_start_time(pid) or ''}"})
        self._instance.report_engine_event(f"Run worker started (pid {pid}): {how}.", run, cls=self.__class__)

    def _worker(self, run: Any) -> int | None:
        """The run's process, when it is still the one the launcher started (pids are reused)."""
        pid, _, started = (run.tags.get(WORKER_TAG) or "").partition(":")
        if not pid.isdigit():
            return None
        return int(pid) if started and _start_time(int(pid)) == started else None

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if not run or run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        pid = self._worker(run)
        if pid is None:
            self._instance.report_engine_event(
                "The run's process is gone: nothing to terminate.", run, cls=self.__class__
            )
            return False
        os.kill(pid, signal.SIGTERM)  # Dagster's run worker turns it into the run's cancellation
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: Any) -> CheckRunHealthResult:
        if self._worker(run) is not None:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.NOT_FOUND, f"run worker {run.tags.get(WORKER_TAG)} is gone")

    def dispose(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


# -- the server process ---------------------------------------------------------------------------
def serve(address: str, alive_fd: int, ready_fd: int) -> str | None:
    """Import PRELOAD, then fork a run per request until `alive_fd` closes. Returns a request's
    arguments in the forked run process, None in the server when it is done."""
    import importlib

    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is for the runs; the pipe stops us
    started = time.monotonic()
    for name in PRELOAD:
        importlib.import_module(name)
    from riverhouse.platform.quality.expectations import _gx

    _gx()  # GX with its deferred modules (expectations.py)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the runs that end
    try:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    except BrokenPipeError:  # the launcher let go while we were importing
        return None
    print(f"riverhouse: the warm run launcher is ready ({time.monotonic() - started:.1f} s)", file=sys.stderr)
    while True:
        readable = select.select([listener, alive_fd], [], [])[0]
        if alive_fd in readable:  # the launcher's process ended or let go
            listener.close()
            return None
        conn, _ = listener.accept()
        with conn:
            request = json.loads(conn.makefile("rb").readline() or b"{}")
            pid = os.fork()
            if pid == 0:
                listener.close()
                os.close(alive_fd)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the run waits for its own children
                signal.signal(signal.SIGINT, signal.default_int_handler)
                return str(request["args"])
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def run_worker(args_json: str) -> int:
    """`dagster api execute_run <args_json>` in this process (a fork: the process's command line
    stays the server's, so the arguments are not shown by `ps`); its exit code."""
    from dagster._cli import main

    sys.argv = ["dagster", "api", "execute_run", args_json]
    try:
        main()
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


if __name__ == "__main__":
    request = serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    sys.exit(run_worker(request) if request is not None else 0)
