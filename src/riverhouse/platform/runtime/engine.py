"""The engine: a Spark Connect server, supervised like the local Kafka.

`riverhouse engine start` runs Spark's own Connect server (`SparkConnectServer`, shipped in
pyspark's jars) through pyspark's bin/spark-submit with the pinned jars (jvm/lib/spark) and the
settings every Riverhouse session gets (runtime/spark.py: Delta's extension and catalog,
redaction, the SQL safety settings, RIVERHOUSE_SPARK_CONF). Riverhouse processes attach to it
with `SparkSession.builder.remote("sc://host:port")`: the JVM, its JIT and Delta's caches stay
warm between triggered runs, and each run still has its own session (its own SQL settings).

Everything lives under the state folder (`<home>/engine/`): `engine.json` (the port, chosen
free at the first start and kept, so clients' addresses stay valid), `state.json` (pid and
address while it runs), `spark-engine.conf` (the settings it started with; mode 0600, a
user's settings may hold credentials) and `logs/engine.out`.

Under Spark Connect a `foreachBatch` body runs in a Python process the server starts beside
itself: `PYSPARK_PYTHON -m pyspark.sql.connect.streaming.worker.foreach_batch_worker`, one per
streaming query, in the engine's process group. It runs this interpreter with the server's
environment, so it imports the same riverhouse; `engine_pid()` tells such a body (or anyone)
which process the engine is. A local engine's PYSPARK_PYTHON is a launcher that has the worker
forked by the engine's fork server, an interpreter that imported it once (runtime/worker_fork.py:
~1 CPU second less per query start).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from riverhouse.platform.errors import EngineUnavailable
from riverhouse.platform.runtime import processes
from riverhouse.platform.runtime.class_archive import WRITER_STOP_TIMEOUT_S, archive_path, make
from riverhouse.platform.runtime.class_archive import java_options as class_archive_options
from riverhouse.platform.runtime.collector import COLLECTOR_RE, collector_chosen
from riverhouse.platform.runtime.spark import (
    CONNECT_PORT,  # noqa: F401  (engine's API: the address parts live beside the session code)
    DEFAULT_MASTER,
    REMOTE_ENV,
    check_java,
    configured_master,
    is_local,
    overlay_spark_home,
    parse_remote,
    redact_remote,
    release_session,
    require_reachable,  # noqa: F401  (engine's API, used by `riverhouse engine status`)
    session_conf,
)
from riverhouse.platform.runtime.worker_fork import local_engine_python
from riverhouse.platform.runtime.worker_launcher import PID_ENV  # the JVM's pid, in its workers' environment

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STATE_FILE = "state.json"
ENGINE_FILE = "engine.json"
CONF_FILE = "spark-engine.conf"
LOG_FILE = "engine.out"
MEMORY_ENV = "RIVERHOUSE_ENGINE_MEMORY"
DEFAULT_MEMORY = os.environ.get(MEMORY_ENV, "2g")
# For an engine (and the demo's broker) that lives for one command (`riverhouse demo`): HotSpot's C2
# compiler costs such a JVM more CPU than its code gives back on 2 cores (bench/analysis.md, "The
# demo on a new engine").
# With C1 only, HotSpot sizes the code cache at 48 MB instead of 240: Spark's generated classes
# filled it in one demo ("Out of space in CodeCache for adapters" failed a query), so it keeps 240.
SHORT_LIVED_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
# Such an engine also collects with the serial collector: G1's concurrent work cost the demo's
# engine 5-7 of its ~49 CPU seconds (bench/analysis.md). Left out when the JVM's options already
# choose a collector (two are an error); the broker's scripts choose G1 themselves.
SHORT_LIVED_ENGINE_JAVA_OPTIONS = f"{SHORT_LIVED_JAVA_OPTIONS} -XX:+UseSerialGC"
# What makes a Python process a Spark Connect client or a spark-submit child: the server and
# the Python workers it starts must not inherit them (they would attach to themselves).
_CLIENT_ENV = (
    "SPARK_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_LOCAL_REMOTE",
    "SPARK_API_MODE",
    "PYSPARK_GATEWAY_PORT",
    "PYSPARK_GATEWAY_SECRET",
    "PYSPARK_SUBMIT_ARGS",
    REMOTE_ENV,
)


class EngineError(RuntimeError):
    """The engine could not be started or stopped; the message says why and what to do."""


@dataclass(frozen=True)
class EngineState:
    pid: int
    url: str  # sc://host:port, what clients use
    started_at: float
    master: str
    memory: str
    state_dir: str = ""

    def is_alive(self) -> bool:
        return processes.pid_alive(self.pid)

    @property
    def address(self) -> str:
        return self.url.removeprefix("sc://")


def read_state(state_dir: Path) -> EngineState | None:
    try:
        data = json.loads((Path(state_dir) / STATE_FILE).read_text())
        return EngineState(
            int(data["pid"]),
            str(data["url"]),
            float(data["started_at"]),
            str(data["master"]),
            str(data["memory"]),
            str(state_dir),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def status(state_dir: Path) -> EngineState | None:
    """The engine recorded in the state folder, if its process is alive."""
    state = read_state(state_dir)
    return state if state and state.is_alive() else None


def engine_lost(exc: BaseException, remote: str) -> EngineUnavailable | None:
    """The error to raise when a Spark Connect call failed because the engine stopped answering.

    The client retries an unreachable server for about 25 s (runtime/engine_retry.py), then raises
    gRPC's UNAVAILABLE. None for any other error (a failed query stays that query's error).
    """
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for error in chain:
        code = getattr(error, "getGrpcStatusCode", None)
        # A retried call ends with the raw gRPC error's text; the status code then says UNKNOWN.
        if (code is not None and code().name == "UNAVAILABLE") or "StatusCode.UNAVAILABLE" in str(error):
            host, port = parse_remote(remote)
            return EngineUnavailable(
                f"the Spark engine at {host}:{port} stopped answering during the run. Start it again with "
                "`riverhouse engine start` and run again: the run resumes from its last committed batch"
            )
    return None


def _record(state_dir: Path, port: int | None, host: str) -> dict[str, Any]:
    """The engine's port, chosen free at the first start and kept (clients hold its address)."""
    path = state_dir / ENGINE_FILE
    try:
        record = json.loads(path.read_text())
        int(record["port"])
    except (OSError, ValueError, KeyError, TypeError):
        record = {}
    if port is not None:
        record["port"] = port
    record.setdefault("port", processes.free_port(host))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(path)
    return record


def _properties(conf: dict[str, str]) -> str:
    """Java .properties text: `\\` escapes there (the redaction regexes hold backslashes)."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("\n", "\\n")

    return "".join(f"{escape(key)}={escape(value)}\n" for key, value in sorted(conf.items()))


def _spark_home(master: str) -> Path:
    import pyspark

    return overlay_spark_home(master) or Path(pyspark.__file__).parent


def _launch_parts(master: str) -> tuple[Path, list[str]]:
    """The engine's Spark home and its class path's jars (pinned ones, then Spark Connect's)."""
    import pyspark

    from riverhouse.platform.runtime.jars import spark_jar_files

    connect_jar = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-connect_*.jar"))
    return _spark_home(master), [str(j) for j in [*spark_jar_files(), *connect_jar]]


def class_archive(master: str | None = None) -> Path:
    """Where the class-data archive of an engine on `master` is (runtime/class_archive.py); may not exist."""
    return archive_path(*_launch_parts(master or configured_master() or DEFAULT_MASTER))


def make_class_archive() -> Path | None:
    """Start an engine that writes the class-data archive as it exits, and stop it; the archive (None: none written)."""

    from riverhouse.platform.runtime.archive_training import train

    def run(scratch: Path, write: str) -> None:
        state = start(scratch / "engine", java_options=f"{SHORT_LIVED_JAVA_OPTIONS} {write}")
        try:
            train(state.url, scratch / "training")  # the first batch's classes, too
        except Exception as exc:  # best effort: an archive of the start's classes still helps
            print(f"the class-data archive holds the engine's start only: its training failed ({exc})", file=sys.stderr)
        finally:
            stop(scratch / "engine", timeout_s=WRITER_STOP_TIMEOUT_S)  # the JVM writes the archive as it exits

    return make(class_archive(), run)


def server_command(
    state_dir: Path, master: str, memory: str, host: str, port: int, java_options: str = ""
) -> tuple[list[str], dict[str, str]]:
    """spark-submit's command line and environment for the engine; writes its settings file.

    `java_options`: added to the driver JVM's options (the settings' own are kept), beside the
    class-data archive's when there is one (runtime/class_archive.py).
    """
    conf = session_conf(master)
    conf.pop("spark.jars", None)  # the class path below replaces it: one list, spark-connect included
    packages = conf.pop("spark.jars.packages", None)
    conf.update({"spark.connect.grpc.binding.address": host, "spark.connect.grpc.binding.port": str(port)})
    home, jars = _launch_parts(master)
    key = "spark.driver.extraJavaOptions"
    if collector_chosen(conf):
        java_options = COLLECTOR_RE.sub("", java_options)  # the user's collector, not a second one
    java_options = f"{java_options} {class_archive_options(archive_path(home, jars), java_options)}".strip()
    java_options = " ".join(java_options.split())
    if java_options:
        conf[key] = f"{conf.get(key, '')} {java_options}".strip()
    conf_file = state_dir / CONF_FILE
    conf_file.touch(mode=0o600)
    os.chmod(conf_file, 0o600)
    conf_file.write_text(_properties(conf))
    argv = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", "riverhouse-engine"]
    argv += ["--master", master, "--driver-memory", memory, "--properties-file", str(conf_file)]
    argv += ["--load-spark-defaults"]  # a cluster's spark-defaults.conf still applies; ours wins
    # The driver's class path is where Delta's catalog must be found when the server builds its
    # sessions (spark.jars alone is too late). A cluster's executors also need --jars; a local
    # engine's run in the driver's JVM, where --jars only copied every jar into a scratch folder
    # and started a `chmod` process per jar (~0.4 s of each start, bench/analysis.md).
    argv += ["--driver-class-path", os.pathsep.join(jars)]
    if not is_local(master):
        argv += ["--jars", ",".join(jars)]
    if packages:  # no jvm/lib/spark: Ivy fetches the POM's coordinates (network at start)
        argv += ["--packages", packages]
    from riverhouse.platform.state.storage import s3a_env

    # The object store's keys reach S3A through the JVM's environment, not a setting (state/storage.py).
    env = {**{k: v for k, v in os.environ.items() if k not in _CLIENT_ENV}, **s3a_env()}
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    env.update({"SPARK_HOME": str(home), "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python})
    in_background = ""
    if is_local(master):  # foreachBatch workers forked from a warm interpreter (runtime/worker_fork.py)
        env["PYSPARK_PYTHON"], fork_server = local_engine_python(state_dir, python)
        in_background = f"{fork_server} </dev/null & "
    # `exec` keeps the pid from sh through spark-submit and spark-class to the JVM: $$ is the JVM's
    # (and the fork server's parent).
    wrapper = ["/bin/sh", "-c", f'{PID_ENV}=$$; export {PID_ENV}; {in_background}exec "$0" "$@"']
    return wrapper + argv, env


def start(
    state_dir: Path,
    master: str | None = None,
    memory: str = DEFAULT_MEMORY,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout_s: float = 180.0,
    java_options: str = "",
) -> EngineState:
    """Start the engine in the background (or return the running one); wait for a session round trip.

    `java_options`: added to its JVM's options (SHORT_LIVED_ENGINE_JAVA_OPTIONS for one command's engine).
    """
    state_dir = Path(state_dir).resolve()
    running = status(state_dir)
    if running:
        return running
    if crashed := read_state(state_dir):
        _kill_leftovers(crashed.pid)
    check_java()
    master = master or configured_master() or DEFAULT_MASTER
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    port = int(_record(state_dir, port, host)["port"])
    if not processes.port_free(port, host):
        raise EngineError(
            f"the engine's port {port} (kept in {state_dir / ENGINE_FILE} since its first start) is taken by "
            "another process: stop that process, or start the engine with --port"
        )
    argv, env = server_command(state_dir, master, memory, host, port, java_options)
    log = open(state_dir / "logs" / LOG_FILE, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=state_dir,  # Spark's derby.log and spark-warehouse/ defaults land here, not in the user's folder
        start_new_session=True,  # survives the command that started it; its group holds its Python workers
    )
    log.close()
    client_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    state = EngineState(proc.pid, f"sc://{client_host}:{port}", time.time(), master, memory, str(state_dir))
    try:
        _wait_until_ready(state, proc, timeout_s)
    except BaseException:
        processes.terminate(proc.pid, lambda: processes.group_alive(proc.pid), group=True)
        raise
    record = {"pid": proc.pid, "url": state.url, "started_at": state.started_at, "master": master, "memory": memory}
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(state_dir / STATE_FILE)
    return state


def run_foreground(state_dir: Path, master: str | None, memory: str, host: str, port: int) -> NoReturn:
    """Become the engine (a container's main process): no state file, the caller's signals stop it."""
    check_java()
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    argv, env = server_command(state_dir, master or configured_master() or DEFAULT_MASTER, memory, host, port)
    os.chdir(state_dir)
    os.execve(argv[0], argv, env)


def _wait_until_ready(state: EngineState, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until a session round trip works: the port opens only once Spark is up; the query loads Delta's catalog."""
    host, port = parse_remote(state.url)
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineError(f"the engine exited with code {proc.returncode} while starting:\n{log_tail(state)}")
        if not processes.port_open(host, port, 1.0):
            time.sleep(0.2)
            continue
        try:
            probe(state.url)
            return
        except Exception as exc:  # up, but its sessions fail (a jar missing): retried until the deadline
            last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            time.sleep(1.0)
    raise EngineError(
        f"the engine did not answer a session within {timeout_s:.0f}s"
        + (f" (last error: {last_error})" if last_error else "")
        + f":\n{log_tail(state)}"
    )


def probe(url: str) -> float:
    """Seconds for a new session's round trip: a catalog query (Delta's) and a Spark job.

    Spark Connect's own session class, not the process-wide builder: this process does not
    become a Connect client (pyspark marks that in its environment, which children inherit).
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    started = time.monotonic()
    session = ConnectSession.builder.remote(url).create()
    try:
        session.sql("SHOW NAMESPACES").collect()
        if session.range(3).count() != 3:
            raise EngineError(f"the engine at {redact_remote(url)} answered a count of 3 rows wrongly")
    finally:
        release_session(session)
    return time.monotonic() - started


def log_tail(state: EngineState, lines: int = 20) -> str:
    return processes.log_tail(Path(state.state_dir) / "logs" / LOG_FILE, lines)


def stop(state_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the engine recorded in the state folder and the workers it started (its process group)."""
    recorded = read_state(Path(state_dir))
    state = recorded if recorded and recorded.is_alive() else None
    (Path(state_dir) / STATE_FILE).unlink(missing_ok=True)
    if not state:
        if recorded:
            _kill_leftovers(recorded.pid)
        return False
    # SIGTERM: Spark's shutdown hook stops the server and its streaming queries; the Python
    # workers of the group get it too (a worker exits with the JVM's socket anyway).
    processes.terminate(state.pid, lambda: processes.group_alive(state.pid), timeout_s, group=True)
    return True


def _kill_leftovers(pgid: int) -> None:
    """Python workers a killed engine left behind (its process group outlives its JVM).

    When the JVM dies (SIGKILL, OOM), a worker busy in a foreachBatch body keeps retrying
    the server it talks to. Only pyspark's workers are killed: the group id is the dead JVM's
    pid, which the system may since have given to an unrelated process.
    """
    for pid, cmdline in processes.group_members(pgid):
        if pid != pgid and "pyspark" in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def memory_used(pid: int) -> int:
    """Resident bytes of the engine's process group (the JVM, the fork server, the Python workers).

    Each process's proportional share (PSS): a page shared by n processes counts 1/n in each. A
    local engine's workers are forked from its fork server and share most of its pages, which a
    sum of resident sizes (RSS) counted once per worker.
    """
    return sum(_proportional_bytes(member) for member, _ in processes.group_members(pid))


def _proportional_bytes(pid: int) -> int:
    """A process's proportional set size, or its resident size where the kernel has no smaps_rollup."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024  # kB
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(processes.stat_fields(pid)[21]) * os.sysconf("SC_PAGE_SIZE")  # rss, in pages (field 24 of stat)
    return 0


def engine_pid(state_dir: Path | None = None) -> int | None:
    """The pid of the engine's JVM, for fault injection (SIGKILL the engine mid-batch).

    Inside the engine's Python workers (a foreachBatch body under Spark Connect) from the
    environment the engine gave them; with `state_dir`, the running engine recorded there.
    None elsewhere (a classic in-process session: the caller's own process is the engine).
    """
    if state_dir is not None:
        state = status(Path(state_dir))
        return state.pid if state else None
    with contextlib.suppress(ValueError):
        pid = int(os.environ.get(PID_ENV, ""))
        if processes.pid_alive(pid):
            return pid
    return None
