"""The settings of Spark's own spark-defaults.conf, which spark-submit applies to every session it starts."""

from __future__ import annotations

import os
import re
from pathlib import Path

# java.util.Properties' separator: the key ends at the first whitespace, '=' or ':' (escapes and
# continued lines are not read: Spark's own files do not need them for the keys read here).
_KEY_END = re.compile(r"[\s=:]")


def spark_defaults_file() -> Path | None:
    """$SPARK_CONF_DIR/spark-defaults.conf, else $SPARK_HOME/conf's, when either variable is set."""
    folder = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else ""
    )
    return Path(folder, "spark-defaults.conf") if folder else None


def spark_defaults() -> dict[str, str]:
    """The file's settings ({} when there is none or it cannot be read)."""
    path = spark_defaults_file()
    try:
        lines = path.read_text().splitlines() if path is not None else []
    except OSError:
        return {}
    settings = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        end = _KEY_END.search(line)
        key, rest = (line[: end.start()], line[end.start() :]) if end else (line, "")
        # One '=' or ':' may follow the key, with whitespace around it.
        settings[key] = re.sub(r"^\s*[=:]?\s*", "", rest, count=1).strip()
    return settings


def is_local(master: str) -> bool:
    """A local master (`local`, `local[2]`, `local[*]`): the driver's JVM runs the tasks."""
    return master.startswith("local")
