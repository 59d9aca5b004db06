"""A supervised server's process group counts as stopped once its processes have exited.

`engine.stop` waits for the group. An exited engine stays a zombie until its parent reaps it; its
parent is long gone, and init may take seconds to reap (2 s measured here after a 0.4 s shutdown).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from riverhouse.platform.runtime import processes

pytestmark = pytest.mark.unit


def _wait_until_zombie(proc: subprocess.Popen[bytes]) -> None:
    """Waits until `proc` has exited without reaping it: it stays a zombie child of this test."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if processes.stat_fields(proc.pid)[0] == "Z":
            return
        time.sleep(0.02)
    raise AssertionError("the child did not exit")


def test_a_group_of_zombies_is_not_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        _wait_until_zombie(proc)
        assert not processes.group_alive(proc.pid)
        assert processes.group_members(proc.pid) == []
    finally:
        proc.wait()


def test_a_live_member_keeps_the_group_alive_after_its_leader_exits() -> None:
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        _wait_until_zombie(leader)  # its child lives on in the leader's group
        assert processes.group_alive(leader.pid)
        members = processes.group_members(leader.pid)
        assert len(members) == 1 and "time.sleep(60)" in members[0][1]
    finally:
        processes.terminate(leader.pid, lambda: processes.group_alive(leader.pid), timeout_s=10, group=True)
        leader.wait()
    assert not processes.group_alive(leader.pid)


LEADER_ENDS_FIRST = """
import ctypes, socket, sys, threading
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
def serve():
    sys.stdin.readline()  # until the test says so
    server.close()
    import os
    os._exit(0)
threading.Thread(target=serve).start()
ctypes.CDLL(None).pthread_exit(None)  # the first thread ends; the process and its socket live on
"""


def test_a_process_whose_first_thread_ended_is_alive_while_another_runs() -> None:
    """What a JVM looks like as it shuts down: the zombie state, threads still running, its port open."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER_ENDS_FIRST],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while processes.stat_fields(proc.pid)[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert processes.stat_fields(proc.pid)[0] == "Z"  # as /proc shows it
        assert processes.port_open("127.0.0.1", port)
        assert processes.pid_alive(proc.pid) and processes.group_alive(proc.pid)
        assert [pid for pid, _ in processes.group_members(proc.pid)] == [proc.pid]
        proc.stdin.write("done\n")
        proc.stdin.flush()
        _wait_until_zombie(proc)
        deadline = time.monotonic() + 10
        while int(processes.stat_fields(proc.pid)[17]) > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not processes.pid_alive(proc.pid) and not processes.group_alive(proc.pid)
        assert not processes.port_open("127.0.0.1", port)
    finally:
        proc.kill()
        proc.wait()
