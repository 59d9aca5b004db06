"""The local Kafka: a real single-node Apache Kafka broker (KRaft) from the pinned jars.

`riverhouse kafka start` runs broker and controller in one JVM (`process.roles=broker,controller`)
from jvm/lib/broker (jvm/pom.xml pins the version). Everything lives under the state folder
(`<home>/kafka/`): `data/` (the log segments and the KRaft metadata), `logs/server.log`,
`server.properties`, `broker.json` (cluster id and ports, fixed at the first start so the
formatted storage and the clients' addresses stay valid) and `state.json` (pid and
addresses while it runs). Topics and offsets survive a stop and a start.

With `secure=True` the broker also opens a SASL_SSL listener (SCRAM-SHA-512) and an SSL
listener that requires client certificates (mTLS), with a throwaway CA made at the first
secure start (see kafka_tls.py); the SCRAM user's password is in `secure/credentials.json`.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from riverhouse.platform.runtime.processes import free_ports, pid_alive, port_free, terminate

STATE_FILE = "state.json"
BROKER_FILE = "broker.json"
DEFAULT_HEAP = os.environ.get("RIVERHOUSE_KAFKA_HEAP", "1g")
DEFAULT_PARTITIONS = 4  # auto-created topics; `riverhouse generate --partitions N` chooses
CREATE_TOPIC_TIMEOUT_S = 30.0
LOG_CONFIG = Path(__file__).with_name("kafka_log4j2.properties")


class LocalKafkaError(RuntimeError):
    pass


@dataclass(frozen=True)
class LocalKafkaState:
    pid: int
    bootstrap: str
    started_at: float
    # Listener name -> host:port (PLAINTEXT always; SASL_SSL and SSL when started secure).
    listeners: dict[str, str] = field(default_factory=dict)
    state_dir: str = ""

    def is_alive(self) -> bool:
        return pid_alive(self.pid)

    @property
    def secure(self) -> bool:
        return "SASL_SSL" in self.listeners


def read_state(state_dir: Path) -> LocalKafkaState | None:
    try:
        data = json.loads((Path(state_dir) / STATE_FILE).read_text())
        return LocalKafkaState(
            int(data["pid"]),
            str(data["bootstrap"]),
            float(data["started_at"]),
            dict(data.get("listeners") or {}),
            str(state_dir),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def status(state_dir: Path) -> LocalKafkaState | None:
    state = read_state(state_dir)
    return state if state and state.is_alive() else None


def _cluster_id() -> str:
    # Kafka's Uuid.randomUuid().toString(): 16 random bytes, URL-safe base64 without padding,
    # never starting with '-' (Kafka rejects those as command-line arguments).
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _broker_record(state_dir: Path, secure: bool) -> dict[str, Any]:
    """Cluster id and ports, chosen once: the controller's port is written into the storage."""
    path = state_dir / BROKER_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {"cluster_id": _cluster_id(), "ports": {}}
    names = ["PLAINTEXT", "CONTROLLER", *(["SASL_SSL", "SSL"] if secure else [])]
    if missing := [name for name in names if name not in record["ports"]]:
        # Different ports, and none of those already recorded (the broker may be down: they are free).
        record["ports"].update(zip(missing, free_ports(len(missing), taken=set(record["ports"].values())), strict=True))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(path)
    return record


def _server_properties(state_dir: Path, ports: dict[str, int], secure: bool) -> str:
    names = ["PLAINTEXT", "CONTROLLER"] + (["SASL_SSL", "SSL"] if secure else [])
    listeners = ",".join(f"{name}://127.0.0.1:{ports[name]}" for name in names)
    advertised = ",".join(f"{name}://127.0.0.1:{ports[name]}" for name in names if name != "CONTROLLER")
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{ports['CONTROLLER']}",
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": ",".join(f"{n}:{'PLAINTEXT' if n == 'CONTROLLER' else n}" for n in names),
        "log.dirs": str(state_dir / "data"),
        "num.partitions": str(DEFAULT_PARTITIONS),
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        # One node: every internal topic has one replica.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Kept until deleted, up to 1 GiB per partition: records keep their producer's timestamps,
        # so time-based retention would delete replayed history (event times days old) at once.
        "log.retention.ms": "-1",
        "log.retention.bytes": str(1 << 30),
        "log.segment.bytes": str(256 * 1024 * 1024),
        "message.max.bytes": str(16 * 1024 * 1024),
    }
    if secure:
        from riverhouse.platform.kafka.kafka_tls import broker_tls

        props.update(broker_tls(state_dir / "secure"))
    return "".join(f"{key}={value}\n" for key, value in props.items())


def _java() -> str:
    from riverhouse.platform.runtime.spark import check_java

    check_java()
    java_home = os.environ.get("JAVA_HOME")
    return os.path.join(java_home, "bin", "java") if java_home else "java"


def class_archive(classpath: str) -> Path:
    """Where the class-data archive of a broker on this class path is (runtime/class_archive.py); may not exist."""
    from riverhouse.platform.runtime.class_archive import archive_path

    return archive_path(Path("kafka.Kafka"), classpath.split(os.pathsep), kind="broker")


def make_class_archive() -> Path | None:
    """Start a broker that writes its class-data archive as it exits, and stop it; the archive (None: none written)."""
    from riverhouse.platform.runtime.class_archive import WRITER_STOP_TIMEOUT_S, make
    from riverhouse.platform.runtime.jars import broker_classpath

    def run(scratch: Path, write: str) -> None:
        start(scratch / "kafka", java_options=write)
        stop(scratch / "kafka", timeout_s=WRITER_STOP_TIMEOUT_S)  # the JVM writes the archive as it exits

    return make(class_archive(broker_classpath()), run)


def _format_storage(state_dir: Path, java: str, classpath: str, cluster_id: str, share: list[str]) -> None:
    if (state_dir / "data" / "meta.properties").exists():
        return
    (state_dir / "data").mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [java, "-Xmx256m", *share, "-cp", classpath, f"-Dlog4j2.configurationFile=file:{LOG_CONFIG}",
         f"-Dkafka.logs.dir={state_dir / 'logs'}", "kafka.tools.StorageTool", "format", "--standalone",
         "-t", cluster_id, "-c", str(state_dir / "server.properties")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise LocalKafkaError(
            f"formatting the Kafka storage in {state_dir / 'data'} failed: {done.stdout}{done.stderr}"
        )


def start(
    state_dir: Path,
    brokers: int = 1,
    timeout_s: float = 90.0,
    secure: bool = False,
    heap: str = DEFAULT_HEAP,
    java_options: str = "",
) -> LocalKafkaState:
    """Start the broker in the background (or return the running one) and wait until it answers.

    `java_options`: added to the broker JVM's options (`make_class_archive`'s archive writer).
    """
    from riverhouse.platform.runtime.class_archive import java_options as class_archive_options
    from riverhouse.platform.runtime.jars import JarsMissingError, broker_classpath

    if brokers != 1:
        raise LocalKafkaError("the local Kafka runs one broker; point kafka.bootstrap_servers at a cluster for more")
    state_dir = Path(state_dir).resolve()
    running = status(state_dir)
    if running:
        if secure and not running.secure:
            raise LocalKafkaError(
                "the local Kafka is running without its secure listeners: stop it "
                "(`riverhouse kafka stop`) and start it again with --secure"
            )
        return running
    try:
        classpath = broker_classpath()
    except JarsMissingError as exc:
        raise LocalKafkaError(str(exc)) from None
    java = _java()
    for folder in ("data", "logs"):
        (state_dir / folder).mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    record = _broker_record(state_dir, secure)
    ports: dict[str, int] = record["ports"]
    wanted = ["PLAINTEXT", "CONTROLLER"] + (["SASL_SSL", "SSL"] if secure else [])
    if busy := [f"{name} {ports[name]}" for name in wanted if not port_free(ports[name])]:
        raise LocalKafkaError(
            f"the local Kafka's port(s) {', '.join(busy)} (fixed in {state_dir / BROKER_FILE} at its first start) "
            "are taken by another process: stop that process, or remove the state folder to start afresh"
        )
    if secure:
        from riverhouse.platform.kafka.kafka_tls import ensure_tls_material

        ensure_tls_material(state_dir / "secure")
    (state_dir / "server.properties").write_text(_server_properties(state_dir, ports, secure))
    # The class-data archive, when made: the format tool and the broker map the classes it holds
    # (the JVM that writes an archive cannot also map one).
    share = class_archive_options(class_archive(classpath), java_options).split()
    _format_storage(state_dir, java, classpath, record["cluster_id"], share)
    log = open(state_dir / "logs" / "kafka.out", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [java, f"-Xmx{heap}", f"-Xms{min(heap, '256m', key=_bytes)}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
         *share, *java_options.split(),
         "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile=file:{LOG_CONFIG}",
         f"-Dkafka.logs.dir={state_dir / 'logs'}", f"-Dkafka.log.level={os.environ.get('KAFKA_LOG_LEVEL', 'WARN')}",
         "-cp", classpath, "kafka.Kafka", str(state_dir / "server.properties")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,  # survives the CLI that started it, ignores its Ctrl-C
    )  # fmt: skip
    log.close()
    listeners = {name: f"127.0.0.1:{ports[name]}" for name in wanted if name != "CONTROLLER"}
    state = LocalKafkaState(proc.pid, listeners["PLAINTEXT"], time.time(), listeners, str(state_dir))
    try:
        _wait_until_ready(state, proc, timeout_s)
        if secure:
            _ensure_scram_user(state)
    except BaseException:
        terminate(proc.pid, lambda: proc.poll() is None)
        raise
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps({"pid": proc.pid, "bootstrap": state.bootstrap, "started_at": state.started_at,
                               "listeners": listeners}))  # fmt: skip
    tmp.replace(state_dir / STATE_FILE)
    return state


def _bytes(size: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(size[:-1]) * units[size[-1].lower()] if size[-1].lower() in units else int(size)


def _wait_until_ready(state: LocalKafkaState, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until the broker answers a metadata request on its PLAINTEXT listener."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": state.bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LocalKafkaError(
                f"the Kafka broker exited with code {proc.returncode} while starting:\n{_log_tail(state)}"
            )
        try:
            metadata = admin.list_topics(timeout=1)
        except Exception:  # not listening yet
            time.sleep(0.2)
            continue
        # After a restart, existing partitions answer only once they have a leader again.
        leaderless = [
            (name, p.id)
            for name, t in metadata.topics.items()
            for p in t.partitions.values()
            if p.leader < 0 or p.error
        ]
        if metadata.brokers and not leaderless:
            return
        time.sleep(0.2)
    raise LocalKafkaError(f"the Kafka broker did not answer within {timeout_s:.0f}s:\n{_log_tail(state)}")


def _log_tail(state: LocalKafkaState, lines: int = 15) -> str:
    logs = Path(state.state_dir) / "logs"
    text = ""
    for name in ("kafka.out", "server.log"):
        with contextlib.suppress(OSError):
            text += (logs / name).read_text(errors="replace")
    return "\n".join(text.splitlines()[-lines:]) + f"\n(full log in {logs})"


def _ensure_scram_user(state: LocalKafkaState) -> None:
    """The SCRAM-SHA-512 user of the SASL_SSL listener (kept in KRaft metadata; upserted each start)."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    from riverhouse.platform.kafka.kafka_tls import credentials

    creds = credentials(Path(state.state_dir) / "secure")
    admin = AdminClient({"bootstrap.servers": state.bootstrap, "log_level": 0})
    upsert = UserScramCredentialUpsertion(
        creds["username"], ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), creds["password"].encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)


def stop(state_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the broker recorded in the state file (only that PID). True if one was running."""
    state = status(Path(state_dir))
    (Path(state_dir) / STATE_FILE).unlink(missing_ok=True)
    if not state:
        return False
    terminate(state.pid, state.is_alive, timeout_s)  # Kafka's shutdown hook: controlled shutdown
    return True


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, Any] | None = None) -> bool:
    """Create `topic` with `partitions` partitions; False when it exists (its partitions are kept)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(config or {})})
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=-1)])[topic]
    try:
        future.result(timeout=CREATE_TOPIC_TIMEOUT_S)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
    except concurrent.futures.TimeoutError:  # its message is empty
        raise LocalKafkaError(
            f"Kafka at {bootstrap} did not create topic {topic!r} within {CREATE_TOPIC_TIMEOUT_S:.0f}s"
        ) from None
    return True
