"""CPU seconds of the bench's process tree by role, sampled so any window of a run can be read back."""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Processes of the bench's tree by what they do (_role sorts them; the page has a column each).
CPU_ROLES = ("driver", "jvm", "spark_python", "kafka", "other")


def _process_tree(root: int | None = None) -> list[int]:
    """`root` (this process) and every process below it.

    Read from each process's parent in /proc: a thread's children (the JVM starts
    Python workers from its threads) are not in the main thread's `children` list.
    """
    root = root or os.getpid()
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def _role(pid: int) -> str:
    """What a process of the tree does: driver, jvm, spark_python (workers, planners), kafka, other."""
    if pid == os.getpid():
        return "driver"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    if "java" in cmd.split(" ", 1)[0]:
        return "kafka" if " kafka.Kafka " in cmd else "jvm"
    if "pyspark" in cmd:
        return "spark_python"
    if "local_kafka" in cmd:
        return "kafka"
    return "other"


CpuSample = dict[int, tuple[str, float]]  # pid -> (role, CPU seconds it has used)


def listening_inodes(port: int, tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> set[str]:
    """Socket inodes listening on `port` (any address), from the kernel's TCP tables."""
    inodes = set()
    for table in tables:
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local_address is ADDR:PORT in hex; state 0A is LISTEN; the inode is the 10th field.
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def pid_listening_on(port: int) -> int | None:
    """The process of this user that listens on `port` on this machine, if any."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    if not wanted:
        return None
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid != os.getuid():
                continue
            if any(os.readlink(fd) in wanted for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue
    return None


def engine_root() -> int | None:
    """A warm engine's process on this machine (RIVERHOUSE_SPARK_REMOTE=sc://localhost:port), if any.

    Its JVM and Python workers are not below the bench, but do the runs' work: they are metered too.
    """
    remote = os.environ.get("RIVERHOUSE_SPARK_REMOTE")
    return _engine_at(remote) if remote else None


@functools.lru_cache(maxsize=4)
def _engine_at(remote: str) -> int | None:
    # Looked up once per address: finding a socket's owner reads every process's open files.
    parts = urlsplit(remote)
    if parts.hostname not in ("localhost", "127.0.0.1", "::1"):
        return None
    return pid_listening_on(parts.port or 15002)


def cpu_by_process() -> CpuSample:
    """User + system CPU seconds of every process of the tree so far, with its role."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: CpuSample = {}
    engine = engine_root()
    for pid in [*_process_tree(), *(_process_tree(engine) if engine else [])]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime and stime are fields 14 and 15 of stat, 11 and 12 after the command.
        out[pid] = (_role(pid), (int(fields[11]) + int(fields[12])) / ticks)
    return out


class CpuMeter:
    """Samples each process's CPU time every `interval_s`, so any window of a run can be read back.

    `window(t0, t1)` (time.monotonic() values) says what each role used in between, next
    to what the machine's cores allowed (cores x wall). Processes that end inside the
    window (Spark's planners and source runners) count up to their last sample.
    """

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, CpuSample]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)

    def _sample(self) -> None:
        self.samples.append((time.monotonic(), cpu_by_process()))

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> CpuMeter:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        first = min(self.samples, key=lambda sample: abs(sample[0] - t0))
        latest: CpuSample = {}
        for when, sample in self.samples:
            if when > t1 + self.interval_s / 2:
                break
            latest.update(sample)
        used = dict.fromkeys(CPU_ROLES, 0.0)
        for pid, (role, seconds) in latest.items():
            used[role] += max(0.0, seconds - first[1].get(pid, (role, 0.0))[1])
        used = {role: round(value, 3) for role, value in used.items()}
        wall = max(t1 - t0, 1e-9)
        cores = os.cpu_count() or 1
        return {
            "wall_s": round(wall, 3),
            "cores": cores,
            "by_role": used,
            "total": round(sum(used.values()), 3),
            "utilization": round(sum(used.values()) / (wall * cores), 3),
        }
