"""The production topology as local processes: PostgreSQL from the distribution's package, a Spark
standalone master with two workers from the pip pyspark, and the three Dagster processes.

Each server is started here and stopped here by its PID; nothing is left running.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from riverhouse.platform.runtime.processes import free_port, pid_alive

SPARK_HOME = Path(pyspark.__file__).parent
PG_PASSWORD = "riverhouse-prod-test"


def wait_for_text(path: Path, text: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited ({proc.returncode}): {path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"{text!r} not in {path} within {timeout_s:.0f}s: {path.read_text(errors='replace')[-3000:]}")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, []))
    return out


# ---------------------------------------------------------------------------- PostgreSQL
def postgres_bin() -> Path:
    """The newest installed PostgreSQL server's bin folder; installs Debian's package when there is none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        install_postgresql()
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL was installed but no /usr/lib/postgresql/<version>/bin/initdb exists")
    return Path(found[-1]).parent


def install_postgresql() -> None:
    if shutil.which("apt-get") is None:
        raise RuntimeError(
            "the production tests need a PostgreSQL server (initdb, pg_ctl) and this machine has no apt-get: "
            "install PostgreSQL 13 or newer"
        )
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run([*sudo, "apt-get", "update", "-qq"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                "installing Debian's postgresql package failed (as root, or with passwordless sudo): "
                + done.stderr[-2000:]
            )


@dataclass
class Postgres:
    """A throw-away cluster: initdb in a temp folder, one port on loopback, password auth."""

    bin_dir: Path
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="riverhouse-pg-")))
    port: int = 0
    pid: int = 0
    user: str = "dagster"
    database: str = "dagster"

    def _as_owner(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        # PostgreSQL refuses to run as root: run its tools as the package's `postgres` user then.
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *args], capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stdout[-1500:]} {done.stderr[-1500:]}")
        return done

    def start(self) -> Postgres:
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
        data, pwfile = self.base / "data", self.base / "pw"
        pwfile.write_text(PG_PASSWORD)
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres")
        self._as_owner(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                self.user,
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--auth-host=scram-sha-256",
                "--auth-local=scram-sha-256",
            ]
        )
        self.port = free_port()
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._as_owner(
            [
                str(self.bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(self.base / "server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "start",
            ]
        )
        self.pid = int((data / "postmaster.pid").read_text().split()[0])
        import psycopg2

        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user=self.user, password=PG_PASSWORD, dbname="postgres"
        )
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with conn.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            conn.close()
        return self

    def env(self) -> dict[str, str]:
        return {
            "DAGSTER_POSTGRES_HOST": "127.0.0.1",
            "DAGSTER_POSTGRES_PORT": str(self.port),
            "DAGSTER_POSTGRES_USER": self.user,
            "DAGSTER_POSTGRES_PASSWORD": PG_PASSWORD,
            "DAGSTER_POSTGRES_DB": self.database,
        }

    def stop(self) -> None:
        if self.pid and pid_alive(self.pid):
            os.kill(self.pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
            deadline = time.monotonic() + 60
            while pid_alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if pid_alive(self.pid):
                os.kill(self.pid, signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)


# ---------------------------------------------------------------------------- processes
@dataclass
class Service:
    """One long-running process in its own session, its output in a log file."""

    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_text: str | None = None, timeout_s: float = 180) -> Service:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.args, env=self.env, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        if ready_text:
            wait_for_text(self.log, ready_text, timeout_s, self.proc)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crashed host would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def spark_cluster(folder: Path, env: dict[str, str], workers: int = 2) -> tuple[str, list[Service]]:
    """A standalone master and `workers` workers (1 core, 1 GB each: the machine has two cores)."""
    spark_env = {**env, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = free_port()
    master = Service(
        "spark-master",
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(free_port()),
        ],
        spark_env,
        folder / "spark-master.log",
    )
    services = [master.start("I have been elected leader", 120)]
    url = f"spark://127.0.0.1:{port}"
    try:
        for n in range(1, workers + 1):
            worker = Service(
                f"spark-worker-{n}",
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(folder / f"worker-{n}"),
                    "--webui-port",
                    str(free_port()),
                ],
                spark_env,
                folder / f"spark-worker-{n}.log",
            )
            services.append(worker.start("Successfully registered with master", 120))
    except BaseException:
        for service in reversed(services):
            service.stop()
        raise
    return url, services


def dagster_bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed next to {sys.executable}; reinstall riverhouse")
    return found
