"""A command and every process it starts, stopped together: what `riverhouse ui` runs `dagster dev` under.

`riverhouse ui` used to exec `dagster dev`; sent SIGTERM or SIGINT, `dagster dev` exited
while its code server, webserver and daemon (and the runs they had started) kept running,
and so did the local broker (issue 27). Now the CLI stays the parent: it becomes a child
subreaper (Linux), so a process that loses its parent is re-parented to it rather than to
init, and on SIGTERM/SIGINT it stops the tree in order: `dagster dev` first (it stops its
webserver, daemon and code server itself), then whatever of its tree is still there, then
the caller's own last step (the local broker).

Linux only in what it finds (`/proc`); elsewhere the tree is `dagster dev` alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from riverhouse.platform.runtime.processes import pid_alive as alive
from riverhouse.platform.runtime.processes import stat_fields

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of this process's tree are re-parented to it, so they can still be found and stopped."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process (from /proc; empty where there is none)."""
    out: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = stat_fields(entry.name)
        except OSError:
            continue
        if len(fields) > 1:
            out[int(entry.name)] = (int(fields[1]), fields[0])
    return out


def descendants(pid: int) -> list[int]:
    """Every living process below `pid`, parents before their children (a zombie is gone already)."""
    children: dict[int, list[int]] = {}
    for child, (parent, state) in _processes().items():
        if state != "Z":
            children.setdefault(parent, []).append(child)
    found, queue = [], list(children.get(pid, []))
    while queue:
        current = queue.pop(0)
        found.append(current)
        queue.extend(children.get(current, []))
    return found


def reap(exclude: set[int]) -> None:
    """Collect the exit status of this process's finished children (re-parented orphans included),
    except `exclude`: children whose owners wait for them themselves (a Popen)."""
    me = os.getpid()
    for pid, (parent, state) in _processes().items():
        if parent == me and state == "Z" and pid not in exclude:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _wait_gone(pids: list[int], timeout_s: float, exclude: set[int]) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = pids
    while True:
        reap(exclude)
        left = [p for p in left if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def stop_tree(
    proc: subprocess.Popen[bytes], signum: int, keep: set[int], grace_s: float = 30.0, rest_s: float = 10.0
) -> None:
    """Stop `proc` with `signum` (its own shutdown first), then what is left of this process's tree.

    `keep`: processes the caller stops itself afterwards (the local broker). What does not
    stop within the grace periods is killed.
    """
    keep = set(keep) | {child for pid in keep for child in descendants(pid)}  # kept with their subtrees
    before = [p for p in descendants(os.getpid()) if p not in keep]
    _signal(proc.pid, signum)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    keep |= {child for pid in keep for child in descendants(pid)}
    rest = [p for p in dict.fromkeys([*before, *descendants(os.getpid())]) if p not in keep and alive(p)]
    for pid in rest:
        _signal(pid, signal.SIGTERM)
    for pid in _wait_gone(rest, rest_s, keep | {proc.pid}):
        _signal(pid, signal.SIGKILL)
    if proc.poll() is None:
        _signal(proc.pid, signal.SIGKILL)
        proc.wait()
    _wait_gone(rest, 5.0, keep | {proc.pid})


def run_until_signalled(
    argv: list[str], env: dict[str, str], keep: set[int], finally_: Callable[[], None], grace_s: float = 30.0
) -> int:
    """Run `argv` until it exits or this process gets SIGTERM/SIGINT, then stop the whole tree and
    call `finally_` (stopping what `keep` names). Returns the exit code to end with."""
    become_subreaper()
    received: list[int] = []
    wake = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        wake.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    # Its own session: the terminal's Ctrl-C reaches this process only, which then stops the tree in order.
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        while proc.poll() is None and not wake.wait(0.5):
            reap(keep | {proc.pid})
        stop_tree(proc, received[0] if received else signal.SIGTERM, keep, grace_s)
    finally:
        try:
            finally_()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    code = proc.returncode or 0
    return 0 if received or code in (-signal.SIGINT, -signal.SIGTERM) else code
