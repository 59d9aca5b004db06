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


def _exited(proc: subprocess.Popen[bytes]) -> None:
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
        _exited(proc)
        assert not processes.group_alive(proc.pid)
        assert processes.group_members(proc.pid) == []
    finally:
        proc.wait()


def test_a_live_member_keeps_the_group_alive_after_its_leader_exits() -> None:
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        _exited(leader)  # its child lives on in the leader's group
        assert processes.group_alive(leader.pid)
        members = processes.group_members(leader.pid)
        assert len(members) == 1 and "time.sleep(60)" in members[0][1]
    finally:
        processes.terminate(leader.pid, lambda: processes.group_alive(leader.pid), timeout_s=10, group=True)
        leader.wait()
    assert not processes.group_alive(leader.pid)
