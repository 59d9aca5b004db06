"""The class-data-sharing archives of the engine's and the local broker's JVMs: they start faster.

HotSpot maps the classes an archive holds instead of reading, parsing and verifying them from
the jars again (AppCDS: a JVM started with `-XX:ArchiveClassesAtExit` writes one when it exits,
`-XX:SharedArchiveFile` uses it). `make jars` builds it once, right after fetching the jars
(`riverhouse engine archive`, `engine.make_class_archive`): an engine started in a scratch folder,
trained with a first batch's work (archive_training.py) and stopped, so the archive holds what an
engine's start loads (Spark, its Connect server, Delta's catalog) and what a first batch loads
(JSON parsing, Parquet's writer, Delta's log, a streaming query, joins). It is valid for one JDK and one class path, so its name carries a digest of
both: another JDK, Spark home or jar set finds no archive and starts as before. The JVM also
checks the jars' sizes and times itself, and ignores an archive that does not match them (a
warning in the engine's log). Measured: bench/analysis.md, "The demo on a new engine".

The local Kafka broker's JVM has one of its own (`broker-<digest>.jsa`, `riverhouse kafka
archive`, `local_kafka.make_class_archive`), made the same way from a broker started and
stopped; the storage-format tool, run on the same class path, maps it too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from riverhouse.platform.runtime.jars import jars_root

DISABLE_ENV = "RIVERHOUSE_NO_CLASS_ARCHIVE"  # any value: engines start without the archive
WRITE_OPTION = "-XX:ArchiveClassesAtExit"
# How long a JVM that writes an archive may take to stop: it writes the archive as it exits (the
# engine's ~230 MB took 35-38 s on a loaded machine, past a stop's usual 30 s before SIGKILL, and
# a killed JVM writes none).
WRITER_STOP_TIMEOUT_S = 300.0


def _jvm_identity() -> str:
    """The JDK an engine would run on: its java's real path, and its libjvm's size and time (no JVM started)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java") or ""
    real = Path(os.path.realpath(java))
    libjvm = real.parent.parent / "lib" / "server" / "libjvm.so"
    stat = (libjvm if libjvm.exists() else real).stat() if real.exists() else None
    return f"{real}:{stat.st_size}:{int(stat.st_mtime)}" if stat else str(real)


def archive_path(spark_home: Path, jars: list[str], kind: str = "engine") -> Path:
    """Where the archive of this JDK, Spark home (or other launcher) and class path lives (it may not exist)."""
    key = "\n".join([_jvm_identity(), str(spark_home), *jars])
    return jars_root() / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def java_options(archive: Path, alongside: str = "") -> str:
    """A JVM's option for its archive: use it if it exists; none when turned off, or when the JVM's
    other options (`alongside`) make it write one (a JVM that writes an archive cannot map one)."""
    if os.environ.get(DISABLE_ENV) or not archive.is_file() or WRITE_OPTION in alongside:
        return ""
    return f"-XX:SharedArchiveFile={archive}"


def make(target: Path, run: Callable[[Path, str], None]) -> Path | None:
    """`run(scratch_folder, option)` starts and stops a JVM with `option`, which makes it write its
    archive as it exits; the archive is installed at `target` (None: the JVM wrote none)."""
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix="riverhouse-archive-") as scratch:
        run(Path(scratch), f"{WRITE_OPTION}={partial}")
    return target if install(partial, target) else None


def install(partial: Path, target: Path) -> bool:
    """Move a freshly written archive into place (whole or not at all), dropping the folder's older ones of its kind."""
    if not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        return False
    partial.replace(target)  # a start never maps half an archive
    kind = target.name.split("-", 1)[0]
    for stale in target.parent.glob(f"{kind}-*.jsa"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return True
