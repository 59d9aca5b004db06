"""Where Riverhouse keeps its state, chosen once per process from flags and env.

Defaults put everything under `./.riverhouse/` so a newcomer needs no setup;
production points the warehouse at `s3://...` and the DSN at a ClickHouse server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# Spark settings every Riverhouse session gets. `runSQLOnFiles` off: SQL can no longer read
# files by naming them (SELECT ... FROM json.`/etc/...`), a second barrier behind the spec
# SQL allow-list (riverhouse.platform.sql). Spark 4.2 has no setting that turns off
# reflect()/java_method(); the allow-list is what keeps them out of spec SQL.
RESTRICTED_SPARK_CONF = {"spark.sql.runSQLOnFiles": "false"}
# DSN query parameters whose values are secrets.
SECRET_QUERY_KEYS = ("password", "secret", "token", "key", "credential")


class SettingsError(ValueError):
    """An environment setting Riverhouse cannot use; the message names it and what to do."""


@dataclass(frozen=True)
class Settings:
    home: Path
    warehouse: str
    checkpoints: Path
    clickhouse_dsn: str
    kafka_state_dir: Path
    kafka_bootstrap: str | None = None  # overrides the spec's bootstrap_servers
    spark_master: str = "local[2]"
    spark_conf: dict[str, str] = field(default_factory=lambda: dict(RESTRICTED_SPARK_CONF))

    @classmethod
    def from_env(cls, home: str | Path | None = None) -> Settings:
        root = Path(home or os.environ.get("RIVERHOUSE_HOME", ".riverhouse")).resolve()
        return cls(
            home=root,
            warehouse=os.environ.get("RIVERHOUSE_WAREHOUSE", str(root / "warehouse")),
            checkpoints=local_folder(
                "RIVERHOUSE_CHECKPOINTS", os.environ.get("RIVERHOUSE_CHECKPOINTS", str(root / "checkpoints"))
            ),
            clickhouse_dsn=os.environ.get("RIVERHOUSE_CLICKHOUSE_DSN", f"chdb://{root / 'clickhouse'}"),
            kafka_state_dir=Path(os.environ.get("RIVERHOUSE_KAFKA_STATE", str(root / "kafka"))),
            kafka_bootstrap=os.environ.get("RIVERHOUSE_KAFKA_BOOTSTRAP") or None,
            spark_master=os.environ.get("RIVERHOUSE_SPARK_MASTER", "local[2]"),
        )

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def local_folder(variable: str, value: str) -> Path:
    """`value` as a local folder; a URL is refused (`Path("s3a://b/c")` would silently be `s3a:/b/c`).

    Checkpoints hold the pipeline locks (flock) and the stream's app id, which need a POSIX
    file system: object storage is not one.
    """
    if value.startswith("file://"):
        return Path(urlsplit(value).path)
    if "://" in value or value.startswith(("s3:", "s3a:", "gs:", "abfss:", "hdfs:")):
        raise SettingsError(
            f"{variable}={value!r} is a URL, but checkpoints must be a local or mounted folder (they hold "
            "locks); put the warehouse on object storage (RIVERHOUSE_WAREHOUSE) and the "
            "checkpoints on a persistent volume"
        )
    return Path(value)


def redact_dsn(dsn: str) -> str:
    """The DSN with its password and secret query parameters replaced, safe to print or attach as metadata.

    Works on the raw text, so a malformed DSN (a non-numeric port...) is redacted too instead of raising.
    """
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable DSN>"
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
    query = "&".join(_redact_param(param) for param in parts.query.split("&")) if parts.query else ""
    if netloc == parts.netloc and query == parts.query:
        return dsn
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    if eq and any(hint in name.lower() for hint in SECRET_QUERY_KEYS):
        return f"{name}=***"
    return param
