"""The SparkSession Riverhouse runs on: local by default, any Spark 4 cluster by master URL."""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from riverhouse.platform.errors import EngineUnavailable
from riverhouse.platform.runtime import collector, huge_methods, local_fs, processes
from riverhouse.platform.runtime.engine_retry import engine_retry_policy
from riverhouse.platform.runtime.spark_defaults import is_local, spark_defaults

# Every session (a user's RIVERHOUSE_SPARK_CONF may change them): Arrow for Python <-> JVM, quiet progress.
SESSION_DEFAULTS: dict[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.ui.showConsoleProgress": "false",
    # Spark caches generated classes per session and code, 100 by default for the whole JVM; one
    # pipeline's batch compiles ~65, so two pipelines on one engine evicted each other's and
    # compiled them again every run (bench/analysis.md). Static: the engine's (or the process's).
    "spark.sql.codegen.cache.maxEntries": "1000",
    # Delta's auto compaction (silver) by default takes a modified partition that this JVM has not
    # compacted yet, counting only the files this JVM added. A compaction removes more than that
    # count, the partition drops out of it, and the next append finds it "not compacted yet" again:
    # in any JVM that did not write the table from its start (a new process, a restarted engine)
    # each batch rewrote its whole day. Deciding on the table's count compacts (the table's small
    # files) once some partition gathered minNumFiles (50) small files in this JVM's count.
    "spark.databricks.delta.autoCompact.modifiedPartitionsOnly.enabled": "false",
    # The cache a micro-batch is read from by its writes (ingest/writer.py) holds one batch, which
    # max_offsets_per_trigger bounds, for a second or two: compressing its columns cost 5.0 CPU
    # microseconds per record, storing them as they are 1.6 (bench/analysis.md), for 2-3x the
    # memory of a batch (MEMORY_AND_DISK spills what does not fit).
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    # Timestamps as INT64 micros, not legacy INT96 (converted per value, dictionary-encoded as 12-byte
    # binaries); no dictionary for bronze's unique raw key and value (built per page, thrown away):
    # a bronze-shaped append 3.45 -> 2.71 JVM CPU s per 400,000 rows (bench/analysis.md). Readers read
    # both timestamp forms. The dictionary ones are static: an engine gets them at its start.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.hadoop.parquet.enable.dictionary#_value": "false",
    "spark.hadoop.parquet.enable.dictionary#_key": "false",
    # PySpark's call sites for error messages: in an in-process session each Column function then
    # made ~8 more py4j round trips (a class looked up per segment of a dotted name), 40% of a small
    # batch's; off, the batch's Python and JVM CPU fell 15-28% and 8-13% (bench/analysis.md). Static.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}
# Small-machine defaults, in local mode only: a cluster keeps its own (spark-defaults.conf,
# spark-submit's flags, RIVERHOUSE_SPARK_CONF).
LOCAL_DEFAULTS: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "2g",
    # Delta rebuilds a table's snapshot (log replay) in 50 tasks by default: on a 2-core
    # machine that was the largest share of a batch (make bench: 25 s of 61 s); 4 tasks
    # replay the same log in 5 s. A cluster with large logs may raise it in its settings.
    "spark.databricks.delta.snapshotPartitions": "4",
    # Adaptive execution re-plans every shuffle stage as a job of its own: on a micro-batch of a
    # few thousand records that is most of the work (a 7,000-record batch 3.6 s -> 1.8 s
    # without it, bench/analysis.md), and with 4 shuffle partitions there is little to adapt.
    "spark.sql.adaptive.enabled": "false",
}
# Spec SQL runs in these sessions: no `SELECT ... FROM text.`/path`` reads of the driver's files; plans
# printed whole (Spark's default of 25 fields ends a long SELECT with "... N more fields"), so that
# gold/plan_guard.py sees every expression of a spec's query.
SQL_SAFETY_CONF: dict[str, str] = {"spark.sql.runSQLOnFiles": "false", "spark.sql.debug.maxToStringFields": "100000"}
# Spark replaces a conf's or a data source option's value with "*********(redacted)" in
# plans, the UI, the event log and its own log lines when the key or the value matches.
# Besides Spark's defaults: the Kafka connector options that hold a secret once Riverhouse
# resolved `${env:...}` (the SASL JAAS line, the client's private key), and S3A's SSE-C key
# (`fs.s3a.encryption.key`; S3A's access/secret keys and session token match the defaults).
REDACTION_CONF: dict[str, str] = {
    "spark.redaction.regex": r"(?i)secret|password|token|access[.]?key|jaas|keystore\.key|ssl\.key|encryption\.key",
    "spark.sql.redaction.options.regex": r"(?i)url|jaas|password|secret|token|keystore\.key|ssl\.key",
}
# Applied last on every session and on the engine: nothing (a setting, the resource's config) overrides them.
# Spark's default replaces an active query of the same checkpoint when another starts; a run
# allows it only after the old query's batch in flight ended, and only in a session of its own
# (ingest/stream.py): sessions are shared between processes.
STREAMING_CONF: dict[str, str] = {"spark.sql.streaming.stopActiveRunOnRestart": "false"}
# A timestamp without a zone is UTC, and `_event_date` is the UTC day (docs/pipeline-spec.md): in
# another session zone the same record would read as another instant, and a replay under a changed
# setting would not find the rows it wrote. The driver's JVM runs in UTC too (UTC_JVM).
TIME_CONF: dict[str, str] = {"spark.sql.session.timeZone": "UTC"}
FIXED_CONF: dict[str, str] = {**REDACTION_CONF, **SQL_SAFETY_CONF, **STREAMING_CONF, **TIME_CONF}

MASTER_ENV = "RIVERHOUSE_SPARK_MASTER"
REMOTE_ENV = "RIVERHOUSE_SPARK_REMOTE"
CONNECT_PORT = 15002  # Spark Connect's own default (a URL without a port means it)
CONF_ENV = "RIVERHOUSE_SPARK_CONF"
DEFAULT_MASTER = "local[2]"
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
# The driver JVM's zone is UTC, whatever options a user gives it: in another zone Delta 4.4 rebuilt
# the table's state after every commit to check its checksum (a job; an append 0.25 -> 1.2-1.5 s).
UTC_JVM = "-Duser.timezone=UTC"
# Under Spark Connect a client sets these on its own session; every other setting is the server's.
_SESSION_PREFIXES = ("spark.sql.", "spark.databricks.delta.")
_SERVER_ONLY = {"spark.sql.extensions", "spark.sql.catalog.spark_catalog", "spark.sql.warehouse.dir"}
_SERVER_ONLY |= {"spark.sql.codegen.cache.maxEntries"}


class SparkConfError(ValueError):
    """RIVERHOUSE_SPARK_CONF cannot be used; the message says why and what to write."""


def user_conf(text: str | None = None) -> dict[str, str]:
    """RIVERHOUSE_SPARK_CONF: a JSON object of Spark settings, e.g. {"spark.executor.memory": "4g"}.

    JSON, as RIVERHOUSE_STORAGE_OPTIONS: values hold commas, spaces and `=` (extraJavaOptions,
    jar lists) that a `k=v,k=v` list could not carry. Another value for a fixed setting (redaction,
    SQL safety, the UTC time zone) and the master/remote (their own variables) are refused, not
    silently dropped.
    """
    text = os.environ.get(CONF_ENV, "") if text is None else text
    if not text.strip():
        return {}
    example = '{"spark.sql.shuffle.partitions": "16", "spark.executor.memory": "4g"}'
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SparkConfError(f"{CONF_ENV} is not JSON ({exc}): write a JSON object such as {example}") from None
    if not isinstance(data, dict):
        raise SparkConfError(f"{CONF_ENV} must be a JSON object of Spark settings, such as {example}")
    conf: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(value, str | int | float | bool) or not key.startswith("spark."):
            raise SparkConfError(
                f"{CONF_ENV}: {key!r} must be a Spark setting (spark....) with a string, number or boolean value"
            )
        conf[key] = str(value).lower() if isinstance(value, bool) else str(value)
    if fixed := sorted(k for k in conf if k in FIXED_CONF and conf[k] != FIXED_CONF[k]):
        raise SparkConfError(
            f"{CONF_ENV} sets {', '.join(fixed)}, which Riverhouse keeps fixed (secrets stay out of plans and "
            "logs; spec SQL cannot read files by path; times are read in UTC): remove them"
        )
    for key, variable in (("spark.master", MASTER_ENV), ("spark.remote", REMOTE_ENV)):
        if key in conf:
            raise SparkConfError(f"{CONF_ENV} sets {key}: set {variable} instead")
    return conf


def spark_defaults_master() -> str | None:
    """`spark.master` of spark-defaults.conf ($SPARK_CONF_DIR, else $SPARK_HOME/conf), if it sets one."""
    return spark_defaults().get("spark.master") or None


def configured_master() -> str:
    """The master sessions use when the caller names none.

    RIVERHOUSE_SPARK_MASTER; else what Spark itself was given: under `spark-submit` its
    --master is already in the JVM ("" = leave it to Spark); else spark-defaults.conf's; else local[2].
    """
    if os.environ.get(MASTER_ENV):
        return os.environ[MASTER_ENV]
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # this Python was started by spark-submit
        return ""
    return spark_defaults_master() or DEFAULT_MASTER


def session_conf(master: str, conf: dict[str, str] | None = None) -> dict[str, str]:
    """Every setting of a Riverhouse session (or engine) on `master`, lowest precedence first.

    Defaults (small-machine ones and Riverhouse's local file system in local mode only) < the
    pinned jars, Delta and quiet logs < RIVERHOUSE_SPARK_CONF < `conf` (the caller's: settings,
    the Dagster resource) < the fixed ones. The driver's Java options keep spark-defaults.conf's
    (spark-submit gives a setting passed to it precedence over the file's, whole).
    """
    from riverhouse.platform.runtime.jars import spark_conf, spark_jar_files
    from riverhouse.platform.state.storage import s3a_conf

    local = {**LOCAL_DEFAULTS, **local_fs.conf(spark_jar_files())} if is_local(master) else {}
    storage = s3a_conf()  # object storage (S3A) from RIVERHOUSE_STORAGE_OPTIONS; the keys: _launch_env
    merged = {
        **SESSION_DEFAULTS,
        **local,
        **spark_conf(),
        # spark-defaults.conf's driver options too: given as a setting here, ours would replace them.
        "spark.driver.extraJavaOptions": " ".join(
            [f"-Dlog4j2.configurationFile=file:{LOG_CONFIG}", spark_defaults().get("spark.driver.extraJavaOptions", "")]
        ).strip(),
        **storage,
        **user_conf(),
        **(conf or {}),
        **FIXED_CONF,
    }
    if "-Duser.timezone=" not in (java := merged["spark.driver.extraJavaOptions"]):
        merged["spark.driver.extraJavaOptions"] = f"{java} {UTC_JVM}".strip()
    return local_fs.on_class_path(huge_methods.with_flag(merged, master))


def connect_session_conf(conf: dict[str, str]) -> dict[str, str]:
    """The part of `conf` a Spark Connect client sets on its own session (the rest is the server's)."""
    return {k: v for k, v in conf.items() if k.startswith(_SESSION_PREFIXES) and k not in _SERVER_ONLY}


class JavaMissingError(RuntimeError):
    pass


def check_java() -> str:
    """Version line of the Java Spark will use; a clear error when there is none (or too old)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaMissingError(
            "Java was not found. PySpark 4 needs Java 17 or newer: install it "
            "(Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    # The JVM announces JAVA_TOOL_OPTIONS / JDK_JAVA_OPTIONS first ("Picked up ..."): not the version.
    lines = [ln for ln in (out.stderr or out.stdout).splitlines() if not ln.startswith(("Picked", "NOTE: Picked"))]
    line = lines[0] if lines else ""
    try:
        major = int(line.split('"')[1].split(".")[0])
    except (IndexError, ValueError):
        return line
    if major < 17:
        raise JavaMissingError(f"{line}: PySpark 4 needs Java 17 or newer (set JAVA_HOME to one).")
    return line


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    try:
        path = Path(base) / "riverhouse"
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return Path(tempfile.gettempdir())


def local_spark_home(package_dir: Path, version: str = "") -> Path | None:
    """A SPARK_HOME for local mode whose Python workers import pyspark from the installed package.

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on its Python workers' path. Python compiles
    every module it imports from a zip on each import (no bytecode cache): each worker, planner and
    streaming-source process spent ~1.3 s (2 cores) compiling pyspark, ~6 s of a cold `riverhouse run`,
    1 s of each query start. This folder links all of the pip-installed pyspark but that zip, so the
    workers (the same interpreter, see get_spark) import the same pyspark from site-packages,
    compiled once at install. None when pyspark is not pip-installed.
    """
    if not (package_dir / "python" / "lib" / "pyspark.zip").exists():
        return None
    digest = hashlib.sha256(f"{package_dir.resolve()}:{version}".encode()).hexdigest()[:12]
    home = _cache_dir() / f"spark-home-{digest}"
    if (home / "bin").exists():
        return home
    building = home.with_name(f"{home.name}.tmp-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    (building / "python" / "lib").mkdir(parents=True)
    for entry in package_dir.iterdir():
        if entry.name != "python":
            (building / entry.name).symlink_to(entry)
    for entry in (package_dir / "python" / "lib").iterdir():
        if entry.name != "pyspark.zip":
            (building / "python" / "lib" / entry.name).symlink_to(entry)
    try:
        building.rename(home)
    except OSError:  # another process made it first
        shutil.rmtree(building, ignore_errors=True)
    return home if (home / "bin").exists() else None


def overlay_spark_home(master: str) -> Path | None:
    """The local overlay SPARK_HOME (see local_spark_home) when it applies, else None.

    Only local mode and only when nobody chose a SPARK_HOME or another worker Python:
    cluster managers (YARN) ship `pyspark.zip` to executors from SPARK_HOME.
    """
    import pyspark

    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    if not is_local(master) or "SPARK_HOME" in os.environ or python != sys.executable:
        return None
    try:
        return local_spark_home(Path(pyspark.__file__).parent, pyspark.__version__)
    except OSError:
        return None


@contextmanager
def _launch_env(master: str) -> Iterator[None]:
    """The environment the JVM starts with: the local overlay SPARK_HOME when it applies, the
    object store's keys (state/storage.py s3a_env: S3A reads them there, not from a setting)."""
    from riverhouse.platform.state.storage import s3a_env

    overlay = overlay_spark_home(master)
    launch = {**s3a_env(), **({"SPARK_HOME": str(overlay)} if overlay is not None else {})}
    saved = {name: os.environ.get(name) for name in launch}
    os.environ.update(launch)
    try:
        yield
    finally:
        # The JVM has its own copy; child processes of ours choose for themselves.
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def get_spark(master: str | None = None, app_name: str = "riverhouse", conf: dict[str, str] | None = None) -> Any:
    """The process's SparkSession: through Spark Connect when an engine is given, else in this process.

    `conf["spark.remote"]` (Settings puts the running engine of its home there) or
    RIVERHOUSE_SPARK_REMOTE name a Spark Connect engine (`sc://host:port`): a down engine fails
    at once, naming `riverhouse engine start`. Otherwise a classic session on `master` (None:
    the process's session if it has one, else configured_master()) with the pinned jars
    (Kafka connector, Delta), Delta's extension, redaction and the SQL safety settings.
    """
    conf = dict(conf or {})
    remote = conf.pop("spark.remote", None) or os.environ.get(REMOTE_ENV) or None
    if remote:
        return _connect(remote, conf)
    if master is None:
        if (existing := _connect_session()) is not None:
            return existing
        master = configured_master()
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:  # "": spark-submit gave the master (and its settings) to the JVM already
        builder = builder.master(master)
    from pyspark import SparkContext

    settings = local_fs.loadable(session_conf(master, conf), SparkContext._active_spark_context)
    settings = collector.with_local_collector(settings) if is_local(master) else settings
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _launch_env(master):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _connect_session() -> Any:
    """The Spark Connect session this process already uses, if any."""
    if "SPARK_CONNECT_MODE_ENABLED" not in os.environ:
        return None
    from pyspark.sql import SparkSession

    try:
        return SparkSession.active()
    except Exception:  # PySparkRuntimeError NO_ACTIVE_OR_DEFAULT_SESSION
        return None


def parse_remote(url: str) -> tuple[str, int]:
    """Host and port of a Spark Connect URL (`sc://host[:port][/;params]`)."""
    if not url.startswith("sc://"):
        raise EngineUnavailable(f"{redact_remote(url)!r} is not a Spark Connect address: write sc://host:port")
    hostport = url.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0]
    if hostport.startswith("["):  # [ipv6]:port
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = hostport.partition(":")
    try:
        return host or "localhost", int(port) if port else CONNECT_PORT
    except ValueError:
        raise EngineUnavailable(f"{redact_remote(url)!r}: the port is not a number (sc://host:port)") from None


def require_reachable(url: str, timeout_s: float = 3.0) -> None:
    """Fail at once, saying how to start it, when nothing listens at the engine's address.

    Spark Connect's client would retry an unreachable server with backoff for minutes.
    """
    host, port = parse_remote(url)
    if not processes.port_open(host, port, timeout_s):
        raise EngineUnavailable(
            f"the Spark engine at {host}:{port} does not answer. Start it with `riverhouse engine start` "
            f"(add --home to name a state folder), point {REMOTE_ENV} at a running Spark Connect server, "
            f"or unset {REMOTE_ENV} to run Spark inside each run's process"
        )


def shared_session_id(remote: str, settings: dict[str, str], generation: int = 0) -> str:
    """The engine session every process with these SQL settings attaches to (a UUID).

    Spark caches the code it generates per session (the cache key holds the session's
    classloader), so a new session per run compiled ~65 classes again on every triggered run
    (~1 s on 2 cores, bench/analysis.md). Processes with the same settings therefore share one
    session on the engine; processes with other settings get another. The session's settings
    are the same for all of them by construction, and nothing else per run lives in it (query
    names carry the run, temporary views a random suffix). `generation` moves to a fresh id when
    the engine has closed this one (an idle session expires on the server).
    """
    digest = json.dumps({"engine": redact_remote(remote), "conf": sorted(settings.items()), "generation": generation})
    return str(uuid.uuid5(_SESSION_NAMESPACE, digest))


_SESSION_NAMESPACE = uuid.UUID("7f3c1d52-9a4e-4c8b-b1a5-2e6f0c9d8a71")
# How many closed generations a process steps over, from the last one it found open, before
# it gives up on sharing (the engine closes an idle session after an hour by default).
_SESSION_GENERATIONS = 64


def _connect(remote: str, conf: dict[str, str]) -> Any:
    """A Spark Connect session on `remote` with this session's SQL settings (the server holds the rest)."""
    require_reachable(remote)
    settings = connect_session_conf({**SESSION_DEFAULTS, **user_conf(), **conf, **FIXED_CONF})
    if _named_session(remote):  # the URL names its own session: the caller's choice
        try:
            return _attach(remote, remote, settings)
        except _SessionClosed:
            raise RuntimeError(
                f"the engine at {redact_remote(remote)} has closed the session that {REMOTE_ENV} names "
                "(session_id=...): name another, or leave it out (runs then share one per settings)"
            ) from None
    remembered = _generation_file(remote, settings)
    first = _read_generation(remembered)
    for generation in range(first, first + _SESSION_GENERATIONS):
        try:
            spark = _attach(session_url(remote, shared_session_id(remote, settings, generation)), remote, settings)
        except _SessionClosed:
            continue
        if generation != first:
            with contextlib.suppress(OSError):
                remembered.write_text(str(generation))
        return spark
    return _attach(remote, remote, settings, fresh=True)  # every shared id closed: a session of its own


def session_url(remote: str, session_id: str | None) -> str:
    """`remote` (sc://host:port, maybe with `/;key=value` parameters) naming `session_id`, or
    naming none (None: the server gives a new session)."""
    base, _, params = remote.partition("/;")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    if session_id is not None:
        kept.append(f"session_id={session_id}")
    return f"{base.rstrip('/')}/;{';'.join(kept)}" if kept else base.rstrip("/")


def _named_session(url: str) -> str | None:
    """The session id a Spark Connect URL names, if any."""
    params = url.partition("/;")[2].split(";")
    return next((p.removeprefix("session_id=") for p in params if p.startswith("session_id=")), None)


def _generation_file(remote: str, settings: dict[str, str]) -> Path:
    """Where this machine remembers the generation of the shared session it last found open."""
    return _cache_dir() / f"session-{shared_session_id(remote, settings)}"


def _read_generation(path: Path) -> int:
    try:
        return max(0, int(path.read_text().strip()))
    except (OSError, ValueError):
        return 0


class _SessionClosed(Exception):
    """The engine closed this session id (it expired); the next generation's id is tried."""


def own_session(spark: Any) -> Any | None:
    """A new session of its own on `spark`'s engine, with the same settings (shared with nothing);
    None for a Connect session this process did not attach itself (its settings are unknown).

    For the rare step that must set a session setting for itself alone: on a shared session,
    another process's setting could change under it. Release it with `release_session`.
    """
    if spark.session_id not in _ATTACHED:
        return None
    remote, settings = _ATTACHED[spark.session_id]
    return _attach(session_url(remote, None), remote, settings, fresh=True)


def attach_named_session(spark: Any, session_id: str) -> Any:
    """The session `session_id` of `spark`'s engine, with `spark`'s settings (a resident query's own
    session, ingest/resident.py). Leaving it only closes the connection: the session stays."""
    remote, settings = _ATTACHED[spark.session_id]
    return _attach(session_url(remote, session_id), remote, settings)


# The engine and settings each Connect session of this process was attached with (`own_session`).
_ATTACHED: dict[str, tuple[str, dict[str, str]]] = {}
_SESSIONS: list[Any] = []  # every Connect session this process attached (close_connect_sessions)


def _attach(url: str, remote: str, settings: dict[str, str], fresh: bool = False) -> Any:
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    try:
        builder = SparkSession.builder.remote(url)
        spark = builder.create() if fresh else builder.getOrCreate()
        named = _named_session(url)
        if named and spark.session_id != named:
            # getOrCreate gave the process's earlier session (another engine or other settings):
            # these settings must not land on it.
            spark = builder.create()
            fresh = True
        if fresh:
            # A session that is not the process's default is closed by pyspark when collected; at
            # interpreter exit that close can wait forever on gRPC: close it while gRPC still runs.
            atexit.register(release_session, spark)
    except PySparkRuntimeError as exc:
        if "SESSION_ALREADY_EXIST" not in str(exc):
            raise
        raise RuntimeError(
            "this process already runs Spark in-process; it cannot also attach to the engine at "
            f"{redact_remote(remote)}: one process uses one kind of session"
        ) from None
    # About 25 s rides out a hiccup; after that the client stops retrying (engine_retry.py).
    spark.client.set_retry_policies([engine_retry_policy()])
    if named:
        spark.release_session_on_close = False  # shared: stopping this client leaves it to the others
    # The SQL settings (static ones were given at the server's start); setting them again on a
    # shared session sets the same values.
    for key, value in settings.items():
        try:
            spark.conf.set(key, value)
        except Exception as exc:
            _forget(spark)  # a retry in this process gets a new client, not this one
            if "SESSION_CLOSED" in str(exc):
                raise _SessionClosed(redact_remote(url)) from None
            raise SparkConfError(
                f"{key} cannot be set on a session of the engine at {redact_remote(remote)} ({exc}): a static "
                f"setting is the engine's, given when it starts ({CONF_ENV} of `riverhouse engine start`)"
            ) from None
    _ATTACHED[spark.session_id] = (remote, settings)
    _SESSIONS.append(spark)
    return spark


def close_connect_sessions() -> None:
    """End this process's use of every Spark Connect session it attached, before it stops the
    engine they live on (`riverhouse demo`). pyspark's exit hook otherwise asks the stopped engine
    to clear its ML cache, and retries for ~25 s before the process can exit."""
    while _SESSIONS:
        with contextlib.suppress(Exception):
            release_session(_SESSIONS.pop())


def _forget(spark: Any) -> None:
    """Drop a client whose session the engine closed, so the next getOrCreate makes a new one."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    with contextlib.suppress(Exception):
        spark.client.close()
    with ConnectSession._lock:
        if ConnectSession._default_session is spark:
            ConnectSession._default_session = None
        if getattr(ConnectSession._active_session, "session", None) is spark:
            ConnectSession._active_session.session = None


def is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def release_session(spark: Any) -> None:
    """End this process's use of a Spark Connect session (a classic session is left to its process).

    A session of its own is released on the server; a shared one (`shared_session_id`) stays
    there for the next process, and only the connection closes.

    pyspark releases a query's last results in the background and its `stop()` releases the
    session first: waiting for those releases keeps the engine's log free of errors about them.
    """
    if not is_connect(spark):
        return
    pending = list(getattr(spark.client, "_release_futures", ()))
    concurrent.futures.wait(pending, timeout=10)
    spark.stop()


def redact_remote(remote: str) -> str:
    """A Spark Connect URL without its parameters (`;token=...`): safe to print."""
    return remote.split("/;", 1)[0].split(";", 1)[0]
