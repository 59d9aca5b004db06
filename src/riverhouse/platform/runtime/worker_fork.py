"""The local engine's fork server: foreachBatch workers forked from an interpreter already warm.

Started beside a local engine's JVM (engine.server_command), in its process group, as
`python -m riverhouse.platform.runtime.worker_fork <worker module>`. It imports the worker
module and Riverhouse's batch body once, then listens on the engine's abstract socket
(worker_launcher.server_address). For each launcher that connects (the process Spark started
for a streaming query's foreachBatch worker) it checks the caller is the same user, takes the
launcher's stdin, stdout and stderr and its environment, and forks: the child becomes that
worker, run as `python -m <module>` would run it. The server tells the launcher the child's pid,
then its exit status; a launcher that goes away (Spark's SIGTERM, a SIGKILL) takes its worker
with it.

It ends with the engine: when its parent (the JVM, whose pid the server was started under)
is gone, on the group's SIGTERM at `riverhouse engine stop`, and its pyspark command line makes
a dead engine's leftovers (engine._kill_leftovers) include it and its workers.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import json
import os
import runpy
import selectors
import shlex
import signal
import socket
import struct
import sys
from pathlib import Path
from typing import NoReturn

from riverhouse.platform.runtime.worker_launcher import PID_ENV, WIRE_INT, server_address

# What a local engine's fork server serves: Spark's foreachBatch worker (`python -m` it).
WORKER_MODULE = "pyspark.sql.connect.streaming.worker.foreach_batch_worker"
# Imported before the first fork, beside the worker module: what unpickling the batch body needs.
PRELOAD = ("riverhouse.platform.ingest.stream",)
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_MAX_REQUEST = 16 << 20
REQUEST_TIMEOUT_S = 5.0


LAUNCHER_FILE = "worker-python"  # in the engine's state folder: its PYSPARK_PYTHON


def local_engine_python(state_dir: Path, python: str) -> tuple[str, str]:
    """A local engine's PYSPARK_PYTHON (the launcher) and the shell command that starts its fork server.

    Local engines only: a cluster's executors run the driver's PYSPARK_PYTHON for Python UDFs,
    and this script exists on the engine's machine alone.
    """
    launcher = Path(state_dir) / LAUNCHER_FILE
    script = Path(__file__).with_name("worker_launcher.py")
    launcher.write_text(
        f'#!/bin/sh\nexec {shlex.quote(python)} -I -S {shlex.quote(str(script))} {shlex.quote(python)} "$@"\n'
    )
    launcher.chmod(0o755)
    # One BLAS thread: the workers do no numeric work, and fewer threads are alive at each fork
    # (pyarrow's jemalloc and OpenBLAS register fork handlers; gRPC has no channel before it).
    server = f"OPENBLAS_NUM_THREADS=1 {shlex.quote(python)} -m riverhouse.platform.runtime.worker_fork {WORKER_MODULE}"
    return str(launcher), server


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    return int(_CRED.unpack(creds)[1])


def _read_request(conn: socket.socket) -> tuple[dict[str, object], list[int]] | None:
    """The launcher's request (args, env, cwd) and the three descriptors it passed; None if it sent none."""
    fds = array.array("i")
    head, ancdata, _, _ = conn.recvmsg(WIRE_INT.size, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if not head and not fds:  # connected and closed: someone checking the server answers
        return None
    try:
        if len(head) != WIRE_INT.size or len(fds) != 3:
            raise ValueError("malformed request")
        size = int(WIRE_INT.unpack(head)[0])
        if not 0 < size <= _MAX_REQUEST:
            raise ValueError("malformed request")
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("truncated request")
            body += chunk
        request = json.loads(body)
        if not isinstance(request, dict):
            raise ValueError("malformed request")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return request, list(fds)


def _become_worker(module: str, request: dict[str, object], fds: list[int]) -> None:
    """In the forked child: take the launcher's descriptors, environment and folder, run the module."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})  # type: ignore[call-overload]
    os.chdir(str(request["cwd"]))
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.argv = [module]
    # Run afresh as __main__, as `python -m` does: the imports it makes are the server's, already done.
    sys.modules.pop(module, None)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class ForkServer:
    """Forks a worker for each launcher that connects, until the engine is gone."""

    def __init__(self, module: str, engine_pid: int, listener: socket.socket) -> None:
        self.module, self.engine_pid, self.listener = module, engine_pid, listener
        self.workers: dict[int, socket.socket] = {}  # worker pid -> its launcher's connection
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        # A worker's end wakes the loop up at once: SIGCHLD writes to this pipe.
        self.wakeup_r, self.wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(self.wakeup_r, selectors.EVENT_READ)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self.wakeup_w)

    def serve(self) -> None:
        while os.getppid() == self.engine_pid:
            for key, _ in self.selector.select(timeout=1.0):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj == self.wakeup_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wakeup_r, 512)
                else:  # the launcher went away (it never writes after its request): end its worker
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(key.data, signal.SIGTERM)
                    self.selector.unregister(key.fileobj)
            self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            if _peer_uid(conn) != os.getuid():
                raise PermissionError("another user")
            conn.settimeout(REQUEST_TIMEOUT_S)  # a caller that sends nothing does not hold the server up
            received = _read_request(conn)
            conn.settimeout(None)
        except (OSError, ValueError) as exc:
            print(f"riverhouse worker fork server: request refused ({exc})", file=sys.stderr)
            received = None
        if received is None:
            conn.close()
            return
        request, fds = received
        if request.get("args") != ["-m", self.module]:  # not the module imported here: run it cold
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(WIRE_INT.pack(0))
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._child(conn, request, fds)
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(WIRE_INT.pack(pid))
        except OSError:  # the launcher is gone already: so is its worker
            os.kill(pid, signal.SIGTERM)
        self.workers[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _child(self, conn: socket.socket, request: dict[str, object], fds: list[int]) -> NoReturn:
        """The forked worker: none of the server's sockets, the module run as `python -m` would."""
        status = 1
        try:
            signal.set_wakeup_fd(-1)
            # As a new interpreter has them (a shell's `&` started the server with SIGINT and
            # SIGQUIT ignored).
            for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGQUIT):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.selector.close()
            for sock in (self.listener, conn, *self.workers.values()):
                sock.close()
            os.close(self.wakeup_r)
            os.close(self.wakeup_w)
            _become_worker(self.module, request, fds)
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)

    def _reap(self) -> None:
        """Tell each ended worker's launcher how it ended (exit code, or minus the signal)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.workers.pop(pid, None)
            if conn is None:
                continue
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            with contextlib.suppress(OSError):
                conn.sendall(WIRE_INT.pack(code))
            conn.close()


def main(module: str) -> None:
    engine_pid = int(os.environ[PID_ENV])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(server_address(engine_pid))
    except OSError:  # another server already answers for this engine
        return
    importlib.import_module(module)
    for name in PRELOAD:
        importlib.import_module(name)
    listener.listen(16)
    ForkServer(module, engine_pid, listener).serve()


if __name__ == "__main__":
    main(sys.argv[1])
