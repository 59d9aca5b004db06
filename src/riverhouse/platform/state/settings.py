"""Where Riverhouse keeps its state, chosen once per process from flags and env.

Defaults put everything under `./.riverhouse/` so a newcomer needs no setup;
production points the warehouse at `s3://...` and the DSN at a ClickHouse server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from riverhouse.platform.runtime.spark import (
    DEFAULT_MASTER,
    REMOTE_ENV,
    SQL_SAFETY_CONF,
    SparkConfError,
    configured_master,
    redact_remote,
    user_conf,
)

# Spark settings every Riverhouse session gets (runtime/spark.py keeps them fixed). `runSQLOnFiles`
# off: SQL can no longer read files by naming them (SELECT ... FROM json.`/etc/...`), a second
# barrier behind the spec SQL allow-list (riverhouse.platform.sql). Spark 4.2 has no setting that
# turns off reflect()/java_method(); the allow-list is what keeps them out of spec SQL.
RESTRICTED_SPARK_CONF = SQL_SAFETY_CONF
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
    spark_master: str = DEFAULT_MASTER
    # `spark.remote` here (Spark's own key) sends every session to that Spark Connect engine.
    spark_conf: dict[str, str] = field(default_factory=lambda: dict(RESTRICTED_SPARK_CONF))

    @classmethod
    def from_env(cls, home: str | Path | None = None) -> Settings:
        root = Path(home or os.environ.get("RIVERHOUSE_HOME", ".riverhouse")).resolve()
        try:
            user_conf()  # read by every session; a mistake in it is said before anything starts
        except SparkConfError as exc:
            raise SettingsError(str(exc)) from None
        spark_conf = dict(RESTRICTED_SPARK_CONF)
        if remote := engine_remote(root):
            spark_conf["spark.remote"] = remote
        return cls(
            home=root,
            warehouse=os.environ.get("RIVERHOUSE_WAREHOUSE", str(root / "warehouse")),
            checkpoints=local_folder(
                "RIVERHOUSE_CHECKPOINTS", os.environ.get("RIVERHOUSE_CHECKPOINTS", str(root / "checkpoints"))
            ),
            clickhouse_dsn=os.environ.get("RIVERHOUSE_CLICKHOUSE_DSN", f"chdb://{root / 'clickhouse'}"),
            kafka_state_dir=Path(os.environ.get("RIVERHOUSE_KAFKA_STATE", str(root / "kafka"))),
            kafka_bootstrap=os.environ.get("RIVERHOUSE_KAFKA_BOOTSTRAP") or None,
            spark_master=configured_master(),
            spark_conf=spark_conf,
        )

    @property
    def engine_state_dir(self) -> Path:
        """The local engine's folder (`riverhouse engine start`): its port, pid and logs."""
        return self.home / "engine"

    @property
    def spark_remote(self) -> str | None:
        """The Spark Connect engine this process's sessions attach to; None: Spark runs in-process."""
        return self.spark_conf.get("spark.remote") or os.environ.get(REMOTE_ENV) or None

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def engine_remote(home: Path) -> str | None:
    """Where a home's sessions run: RIVERHOUSE_SPARK_REMOTE, else the home's running local engine.

    A URL with parameters (`;token=...`) stays in the environment only (get_spark reads it
    there): settings end up in the Dagster resource's config, which the UI shows.
    """
    from riverhouse.platform.errors import EngineUnavailable
    from riverhouse.platform.runtime import engine

    if remote := os.environ.get(REMOTE_ENV):
        try:
            engine.parse_remote(remote)
        except EngineUnavailable as exc:
            raise SettingsError(f"{REMOTE_ENV}: {exc}") from None
        return remote if redact_remote(remote) == remote else None
    state = engine.status(home / "engine")
    return state.url if state else None


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
