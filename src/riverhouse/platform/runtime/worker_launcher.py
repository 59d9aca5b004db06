"""The local engine's Python: a foreachBatch worker forked from a warm process, anything else run as is.

A local engine's PYSPARK_PYTHON is a script that runs this file with `python -I -S` (standard
library only, ~20 ms): Spark starts one foreachBatch worker per streaming query as
`PYSPARK_PYTHON -m pyspark.sql.connect.streaming.worker.foreach_batch_worker`, and importing that
module (pyspark's Connect client, gRPC, pandas, Arrow) and Riverhouse's batch body costs ~1 CPU
second each time. The engine's fork server (worker_fork.py) has them imported already: this
launcher hands it its stdin, stdout and stderr (the pipes the JVM reads) and its environment,
and the server forks the worker from its warm interpreter.

To the JVM nothing changes: the process it started stands for the worker until the worker ends
and exits with its status; Spark stopping the worker (SIGTERM to this process) stops the worker;
a worker killed by a signal (a crash test's SIGKILL) makes this process end by that signal.
Any other command (pyspark's daemon for UDFs, a version check), or no fork server to answer,
and this process becomes the real interpreter (`exec`): a cold worker, as without the server.
(A `python -m` command asks the server first; it forks only the module it has imported.)
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys
import time
from typing import NoReturn

# Set in the engine's environment to its JVM's pid (engine.server_command): its Python workers read it.
PID_ENV = "RIVERHOUSE_ENGINE_PID"
WIRE_INT = struct.Struct("!i")  # every number on the fork server's socket


def server_address(engine_pid: int | str) -> str:
    """The fork server's socket: in Linux's abstract namespace (no file to clean up), one per engine."""
    return f"\0riverhouse-worker-fork-{os.getuid()}-{engine_pid}"


def _recv_int(sock: socket.socket) -> int | None:
    """The next int the server sends; None once it is gone."""
    data = b""
    while len(data) < WIRE_INT.size:
        try:
            chunk = sock.recv(WIRE_INT.size - len(data))
        except InterruptedError:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return int(WIRE_INT.unpack(data)[0])


def _connect(engine_pid: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(server_address(engine_pid))
    except OSError:
        sock.close()
        return None
    return sock


def _exit_like(status: int) -> NoReturn:
    """End this process as the worker ended: its exit code, or killed by the same signal."""
    if status < 0:
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        time.sleep(1)
    os._exit(status if status >= 0 else 128 - status)


def ask_server(sock: socket.socket, args: list[str]) -> int:
    """Ask the fork server for the worker: its pid, or 0 if the server serves another module."""
    request = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    fds = array.array("i", [0, 1, 2])
    sock.sendmsg([WIRE_INT.pack(len(request))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    sock.sendall(request)
    pid = _recv_int(sock)
    if pid is None:
        raise OSError("the fork server did not answer")
    return pid


def stand_for(sock: socket.socket, pid: int) -> NoReturn:
    """Be the worker to the JVM until it ends, then end the same way."""
    # Spark stops a worker with SIGTERM to the process it started: pass it on.
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(pid, signal.SIGTERM))
    status = _recv_int(sock)
    while status is None:  # the server is gone: wait for the worker itself
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            status = 1
            break
        time.sleep(0.5)
    _exit_like(status)


def main(real_python: str, args: list[str]) -> None:
    engine_pid = os.environ.get(PID_ENV, "")
    if len(args) == 2 and args[0] == "-m" and engine_pid and (sock := _connect(engine_pid)):
        try:
            pid = ask_server(sock, args)
        except OSError as exc:  # no worker started: start it cold instead
            print(f"riverhouse: worker fork server unavailable ({exc}); starting the worker cold", file=sys.stderr)
            pid = 0
        if pid:
            stand_for(sock, pid)
        sock.close()
    os.execv(real_python, [real_python, *args])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
