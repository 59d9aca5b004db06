"""The engine JVM's class-data-sharing archive: an engine answers in ~5 s instead of ~9.

HotSpot maps the classes an archive holds instead of reading, parsing and verifying them from
the jars again (AppCDS: a JVM started with `-XX:ArchiveClassesAtExit` writes one when it exits,
`-XX:SharedArchiveFile` uses it). `make jars` builds it once, right after fetching the jars
(`python -m riverhouse.platform.runtime.class_archive`): an engine started and stopped in a
scratch folder, so the archive holds what an engine's start loads (Spark, its Connect server,
Delta's catalog). It is valid for one JDK and one class path, so its name carries a digest of
both: another JDK, Spark home or jar set finds no archive and starts as before. The JVM also
checks the jars' sizes and times itself, and ignores an archive that does not match them (a
warning in the engine's log). Measured: bench/analysis.md, "The demo on a new engine".
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from riverhouse.platform.runtime.jars import jars_root

DISABLE_ENV = "RIVERHOUSE_NO_CLASS_ARCHIVE"  # any value: engines start without the archive


def _jvm_identity() -> str:
    """The JDK an engine would run on: its java's real path, and its libjvm's size and time (no JVM started)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java") or ""
    real = Path(os.path.realpath(java))
    libjvm = real.parent.parent / "lib" / "server" / "libjvm.so"
    stat = (libjvm if libjvm.exists() else real).stat() if real.exists() else None
    return f"{real}:{stat.st_size}:{int(stat.st_mtime)}" if stat else str(real)


def archive_path(spark_home: Path, jars: list[str]) -> Path:
    """Where the archive of this JDK, Spark home and class path lives (it may not exist)."""
    key = "\n".join([_jvm_identity(), str(spark_home), *jars])
    return jars_root() / f"engine-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def java_options(archive: Path) -> str:
    """The engine JVM's option for its archive: use it if it exists; none when turned off."""
    if os.environ.get(DISABLE_ENV) or not archive.is_file():
        return ""
    return f"-XX:SharedArchiveFile={archive}"


def build(log: Callable[[str], None] = print) -> Path | None:
    """Start an engine that writes the archive when it exits, stop it; the archive's path (None: none made)."""
    from riverhouse.platform.runtime import engine

    target = engine.class_archive()
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="riverhouse-archive-") as scratch:
        state_dir = Path(scratch) / "engine"
        options = f"{engine.SHORT_LIVED_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={partial}"
        engine.start(state_dir, java_options=options)
        engine.stop(state_dir)  # the JVM writes the archive as it exits
        if not partial.is_file() or partial.stat().st_size == 0:
            partial.unlink(missing_ok=True)
            return None
        partial.replace(target)  # whole or not at all: a start never maps half an archive
    for stale in target.parent.glob("engine-*.jsa"):
        if stale != target:
            stale.unlink(missing_ok=True)
    log(f"class-data archive for the engine's JVM: {target} ({time.monotonic() - started:.0f}s)")
    return target


if __name__ == "__main__":
    try:
        made = build()
    except Exception as exc:  # the archive only speeds engines up: an install goes on without it
        print(f"no class-data archive for the engine ({exc}); engines start without one", file=sys.stderr)
        sys.exit(0)
    if made is None:
        print("no class-data archive for the engine: the JVM wrote none; engines start without one", file=sys.stderr)
