"""The local engine's fork server and launcher (runtime/worker_fork.py, worker_launcher.py), as processes.

Spark's JVM is stood for by this test process: it starts the launcher the way the JVM starts a
foreachBatch worker (`PYSPARK_PYTHON -m <module>`, pipes for its standard streams) and is the
fork server's parent, as the engine's JVM is. The worker module is tests/unit/fork_target.py.
A real engine's workers go through the same code in tests/integration/test_engine.py and every
streaming test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from riverhouse.platform.runtime import processes
from riverhouse.platform.runtime.worker_fork import local_engine_python
from riverhouse.platform.runtime.worker_launcher import PID_ENV, server_address

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests.unit.fork_target"


def wait_for(condition: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail("timed out")
        time.sleep(0.05)


def answers(engine_pid: int) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(server_address(engine_pid))
        except OSError:
            return False
    return True


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORK_TARGET_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env[PID_ENV] = str(os.getpid())  # this process stands for the engine's JVM
    return env


def start_server() -> Iterator[subprocess.Popen[bytes]]:
    # Started as the engine's shell starts it: in the background, so SIGINT and SIGQUIT ignored.
    server = subprocess.Popen(
        [sys.executable, "-m", "riverhouse.platform.runtime.worker_fork", TARGET],
        env=base_env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)],
    )
    try:
        wait_for(lambda: answers(os.getpid()) or server.poll() is not None)
        assert server.poll() is None, "the fork server ended at start"
        yield server
    finally:
        server.kill()
        server.wait()


@pytest.fixture(scope="module")
def fork_server() -> Iterator[subprocess.Popen[bytes]]:
    """One server for the tests that leave it running (each start imports pyspark: ~1 CPU second)."""
    yield from start_server()


def launch(tmp_path: Path, module: str = TARGET, **env: str) -> subprocess.Popen[str]:
    launcher, _ = local_engine_python(tmp_path, sys.executable)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.Popen(
        [launcher, "-m", module],
        env={**base_env(), **env},
        cwd=work,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_line(proc: subprocess.Popen[str], stdin: str = "hello") -> dict[str, object]:
    assert proc.stdin and proc.stdout
    proc.stdin.write(stdin + "\n")
    proc.stdin.flush()
    return dict(json.loads(proc.stdout.readline()))


def test_a_worker_is_forked_with_the_launchers_streams_environment_folder_and_exit_code(
    tmp_path: Path, fork_server: subprocess.Popen[bytes]
) -> None:
    proc = launch(tmp_path, FORK_TARGET_VALUE="from the launcher", FORK_TARGET_CODE="3")
    seen = first_line(proc)
    assert proc.wait(timeout=30) == 3
    assert seen["ppid"] == fork_server.pid and seen["pid"] != proc.pid  # forked by the server
    assert seen["value"] == "from the launcher" and seen["cwd"] == str(tmp_path / "work")
    assert seen["stdin"] == "hello"  # the launcher's stdin, stdout and stderr are the worker's
    assert seen["sigint"]  # Ctrl-C raises KeyboardInterrupt, as in a new interpreter
    assert proc.stderr and "to stderr" in proc.stderr.read()


def test_a_worker_killed_by_a_signal_ends_its_launcher_by_that_signal(
    tmp_path: Path, fork_server: subprocess.Popen[bytes]
) -> None:
    proc = launch(tmp_path, FORK_TARGET_SLEEP="60")
    seen = first_line(proc)
    os.kill(int(str(seen["pid"])), signal.SIGKILL)  # a crash point's SIGKILL of the batch body
    assert proc.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_launcher_stops_its_worker(
    tmp_path: Path, fork_server: subprocess.Popen[bytes], how: signal.Signals
) -> None:
    proc = launch(tmp_path, FORK_TARGET_SLEEP="60")
    worker = int(str(first_line(proc)["pid"]))
    proc.send_signal(how)  # Spark's stop of a worker (SIGTERM), or the launcher killed outright
    proc.wait(timeout=30)
    wait_for(lambda: not processes.pid_alive(worker), timeout_s=10)
    assert fork_server.poll() is None  # the server goes on serving
    assert first_line(launch(tmp_path))["ppid"] == fork_server.pid


def test_other_commands_and_a_missing_server_run_the_real_interpreter(
    tmp_path: Path, fork_server: subprocess.Popen[bytes]
) -> None:
    launcher, _ = local_engine_python(tmp_path, sys.executable)
    assert subprocess.run([launcher, "-c", "print(6 * 7)"], capture_output=True, text=True, env=base_env()).stdout == (
        "42\n"
    )
    other = launch(tmp_path, "tests.unit.fork_target_cold")  # a module the server did not import
    assert other.wait(timeout=30) == 1 and other.stderr and "No module named" in other.stderr.read()

    no_server = str(2**22 + 1)  # above the largest pid Linux allows: no engine, so no server, has it
    cold = launch(tmp_path, FORK_TARGET_CODE="4", **{PID_ENV: no_server})
    seen = first_line(cold)
    assert cold.wait(timeout=60) == 4
    assert seen["pid"] == cold.pid and seen["ppid"] == os.getpid()  # the launcher became the worker


def test_the_server_ends_with_its_engine(tmp_path: Path) -> None:
    # A stand-in JVM: starts the server as the engine's shell wrapper does (its own pid in the
    # environment), then waits to be killed.
    parent_code = (
        "import os, subprocess, sys, time\n"
        f"env = dict(os.environ, {PID_ENV}=str(os.getpid()))\n"
        f"server = subprocess.Popen([sys.executable, '-m', 'riverhouse.platform.runtime.worker_fork', '{TARGET}'], env=env)\n"
        "print(server.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], env=base_env(), cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout
        server = int(parent.stdout.readline())
        wait_for(lambda: answers(parent.pid))
        time.sleep(1.5)
        assert processes.pid_alive(server)  # serves while its engine lives
        parent.kill()  # the JVM SIGKILLed
        parent.wait()
        wait_for(lambda: not processes.pid_alive(server), timeout_s=10)
        assert not answers(parent.pid)
    finally:
        parent.kill()


SHARED_PAGES = """
import os, sys, time
data = bytearray(os.urandom(1 << 20)) * 160  # 160 MiB, every page written
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:  # shares the pages with its parent, as a forked worker shares the fork server's
        time.sleep(600)
        os._exit(0)
    children.append(pid)
print(" ".join(map(str, children)), flush=True)
time.sleep(600)
"""


def test_the_engines_memory_counts_pages_its_forked_workers_share_once() -> None:
    """`engine status` sums its process group's memory: a leader and three forks sharing 160 MiB
    take ~160 MiB, not 640 (each process's resident size counts every shared page again)."""
    from riverhouse.platform.runtime import engine

    leader = subprocess.Popen(
        [sys.executable, "-c", SHARED_PAGES], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert leader.stdout is not None
        children = [int(pid) for pid in leader.stdout.readline().split()]
        assert len(children) == 3
        used = engine.memory_used(leader.pid) / 2**20
        assert 160 <= used < 2 * 160, f"{used:.0f} MiB"
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
