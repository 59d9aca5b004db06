"""The background processes Riverhouse supervises (the local Kafka, the engine, the schema registry): pids, ports, logs, stopping.

Each runs in a session of its own (`start_new_session=True`), so it outlives the command that
started it, ignores that terminal's Ctrl-C, and its process group holds the children it starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Collection
from pathlib import Path


def stat_fields(pid: int | str) -> list[str]:
    """`/proc/<pid>/stat` (`pid` may be "self") after the command name: field 3 of proc(5), the
    state letter, comes first. Raises OSError when there is no such process (or no /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses


def start_ticks(pid: int | str) -> int | None:
    """When the process started, in clock ticks since boot (field 22 of proc(5)); None when there
    is no such process (or no /proc). With the pid it names one process: pids are reused."""
    try:
        return int(stat_fields(pid)[19])
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours still answers kill(0)
        return not _exited(stat_fields(pid))
    except OSError:
        return True


def _exited(fields: list[str]) -> bool:
    """Whether `/proc/<pid>/stat` (`stat_fields`) describes a process that has exited: a zombie
    with no thread left. A process whose first thread has ended shows the zombie state too while
    its other threads still run (a JVM's launcher thread, as the JVM shuts down, its sockets
    still open), so the state letter alone does not tell."""
    return fields[0] == "Z" and int(fields[17]) <= 1  # field 20 of proc(5): num_threads


def group_alive(pgid: int) -> bool:
    """Whether a process of the group is left that has not exited.

    An exited member stays a zombie until its parent reaps it; an engine's parent is the
    command that started it, long gone, so init reaps it, which on some machines takes seconds
    (2 s measured with a 0.4 s JVM shutdown). A zombie with no thread left holds no port, memory
    or file, so it does not count.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not Path("/proc/self/stat").exists():  # no /proc to tell zombies by
        return True
    return any(not exited for _, exited in _group_states(pgid))


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process in the process group `pgid` that has not exited."""
    members = []
    for pid, exited in _group_states(pgid):
        if not exited:
            with contextlib.suppress(OSError):
                members.append((pid, Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")))
    return members


def _group_states(pgid: int) -> list[tuple[int, bool]]:
    """(pid, whether it has exited) of the processes of the group `pgid`, from /proc."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat_fields(proc.name)
            if int(fields[2]) == pgid:
                found.append((int(proc.name), _exited(fields)))
    return found


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1", taken: Collection[int] = ()) -> list[int]:
    """`count` different ports free now, none in `taken` (ports a service has recorded as its own).

    Every socket stays bound until all are chosen: the kernel may give the port one bind just
    released to the next bind (a local broker once got the same port for two listeners).
    """
    ports: list[int] = []
    with contextlib.ExitStack() as held:
        while len(ports) < count:
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            if (port := int(sock.getsockname()[1])) not in taken:
                ports.append(port)
    return ports


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As a server binds: connections of its previous run in TIME_WAIT do not hold the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections there (refused and unreachable answer at once)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def terminate(pid: int, alive: Callable[[], bool], timeout_s: float = 30.0, group: bool = False) -> None:
    """SIGTERM (the process's shutdown hooks run), then SIGKILL after `timeout_s`.

    `group`: signal the whole process group led by `pid` (a server and the workers it started).
    """
    kill: Callable[[int, int], None] = os.killpg if group else os.kill
    try:
        kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        reap(pid)
        time.sleep(0.1)
    if alive():
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)
        while alive() and time.monotonic() < deadline + 10:
            reap(pid)
            time.sleep(0.1)
    reap(pid)


def log_tail(path: Path, lines: int = 20) -> str:
    """The last lines of a service's log file, and where the whole of it is (for an error message)."""
    text = ""
    with contextlib.suppress(OSError):
        text = path.read_text(errors="replace")
    return "\n".join(text.splitlines()[-lines:]) + f"\n(full log in {path})"
