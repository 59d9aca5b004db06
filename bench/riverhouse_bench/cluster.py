"""The same dedup run on a Spark standalone cluster: a master and two one-core workers on loopback.

The cluster comes from the pip-installed pyspark (`spark-class ...Master/Worker`), as in
tests/integration/standalone.py. On this machine the two workers share the same two
cores as the driver and the broker, so the figure shows the distributed plan's overhead
(task scheduling, executor JVMs, shuffles over the network stack) next to local[2], not
a speed-up; it is the same run a larger cluster scales out.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from riverhouse_bench.pipelines import cli_run
from riverhouse_bench.spark_metrics import read_events, tasks_by_executor

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench

WORKERS = 2
WORKER_MEMORY = "2g"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[1]} exited early: {log.read_text(errors='replace')[-1000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"{text!r} not seen in {log} within {timeout_s:.0f} s")


@contextmanager
def standalone_cluster(folder: Path) -> Iterator[str]:
    """A master and WORKERS one-core workers; yields the master URL and stops all of them (by PID) after."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    spark_class = str(spark_home / "bin" / "spark-class")
    folder.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []

    def start(log: Path, *args: str) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        procs.append(proc)
        return proc

    try:
        port = _free_port()
        master_log = folder / "master.log"
        master = start(
            master_log,
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port())),
        )
        _wait_for(master_log, "I have been elected leader", master)
        url = f"spark://127.0.0.1:{port}"
        for n in range(1, WORKERS + 1):
            log = folder / f"worker{n}.log"
            worker = start(
                log,
                "org.apache.spark.deploy.worker.Worker",
                url,
                *("--host", "127.0.0.1", "--cores", "1", "--memory", WORKER_MEMORY),
                *("--work-dir", str(folder / f"worker{n}"), "--webui-port", str(_free_port())),
            )
            _wait_for(log, "Successfully registered with master", worker)
        yield url
    finally:
        for proc in reversed(procs):  # only the processes started here, each by its own process group
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
            except ProcessLookupError:
                pass


def cluster(bench: Bench, topic: str, messages: int, expected_unique: int) -> dict[str, Any]:
    """`riverhouse run` of the dedup pipeline against the standalone cluster (2 executors, 1 core each)."""
    with standalone_cluster(bench.home / "cluster") as url:
        run = cli_run(
            bench,
            "bench_cluster",
            topic,
            url,
            {
                "SPARK_LOCAL_IP": "127.0.0.1",
                "spark.cores.max": str(WORKERS),
                "spark.executor.memory": WORKER_MEMORY,
            },
        )
    tasks = tasks_by_executor(read_events(bench.home / "bench_cluster" / "spark-events"))
    return {
        "events": messages,
        "seconds": run["seconds"],
        "events_per_s": messages / run["seconds"],
        "events_per_s_excluding_startup": run["events_per_s"],
        "startup_s": run["seconds"] - run["steady_seconds"],
        "workers": WORKERS,
        "tasks_by_executor": tasks,
        **{k: run[k] for k in ("steady_seconds", "inserted", "stage_seconds", "spark_stages")},
        # Exact, and the work ran on both workers' executors (not in the driver).
        "exact": run["inserted"] == expected_unique
        and run["read"] == messages
        and len(set(tasks) - {"driver"}) == WORKERS,
    }
