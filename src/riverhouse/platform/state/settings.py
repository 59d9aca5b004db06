"""Where Riverhouse keeps its state, chosen once per process from flags and env.

Defaults put everything under `./.riverhouse/` so a newcomer needs no setup;
production points the warehouse at `s3://...` and the DSN at a ClickHouse server.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import unquote, urlsplit

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
# turns off reflect()/java_method(); the allow-list keeps them out of spec SQL, and
# gold/plan_guard.py refuses a query whose analyzed plan has them.
RESTRICTED_SPARK_CONF = SQL_SAFETY_CONF
# DSN query parameters whose values are shown when a DSN is printed; every other one's is hidden.
DSN_QUERY_SHOWN = frozenset(
    {
        *("database", "user", "username", "secure", "verify", "compress", "compression", "interface"),
        *("connect_timeout", "send_receive_timeout", "query_limit", "client_name", "apply_server_timezone"),
    }
)


class SettingsError(ValueError):
    """An environment setting Riverhouse cannot use; the message names it and what to do."""


@dataclass(frozen=True)
class Settings:
    home: Path
    warehouse: str
    checkpoints: Path
    clickhouse_dsn: str = field(repr=False)  # printed only through redact_dsn
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


def _plain(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text) is not None


@dataclass(frozen=True)
class DsnParts:
    """A DSN cut into its pieces the way a person writing one means them (see `split_dsn`)."""

    scheme: str
    userinfo: str | None  # the text before the '@' that ends the credentials, None without one
    host: str  # host[:port] as written
    path: str
    query: str | None
    fragment: str | None

    @property
    def user(self) -> str | None:
        return None if self.userinfo is None else self.userinfo.partition(":")[0]

    @property
    def password(self) -> str | None:
        if self.userinfo is None or ":" not in self.userinfo:
            return None
        return self.userinfo.partition(":")[2]


def split_dsn(dsn: str) -> DsnParts | None:
    """`scheme://user:password@host:port/path?query#fragment`, None when there is no `scheme://`.

    Not `urlsplit`: a password is often written with `/`, `#`, `?` or `@` unescaped, which a URL
    parser reads as the start of the path, fragment or query (`https://u:pa/ss@host` has the host
    `u:pa` there), so the password was printed. Here the credentials end at the last `@` that
    is followed by a host[:port] and then the end, `/`, `?` or `#`.
    """
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", dsn)
    if match is None:
        return None
    rest = dsn[match.end() :]
    userinfo = None
    for at in reversed([i for i, c in enumerate(rest) if c == "@"]):
        if re.match(r"[^/?#@]*(?:[/?#]|$)", rest[at + 1 :]):
            userinfo, rest = rest[:at], rest[at + 1 :]
            break
    host, rest = re.match(r"([^/?#]*)(.*)", rest, re.S).groups()  # type: ignore[union-attr]
    rest, hash_, fragment = rest.partition("#")
    path, question, query = rest.partition("?")
    return DsnParts(match.group(1), userinfo, host, path, query if question else None, fragment if hash_ else None)


def redact_dsn(dsn: str) -> str:
    """The DSN safe to print, log or attach as metadata: the one function that shows a DSN.

    Redacted by parsing (`split_dsn`) and then keeping only what is known to be harmless: the
    user name, a plain host and port, a plain path, and the values of DSN_QUERY_SHOWN
    parameters; every other value (the password, `?password=`, `?PassWord%3D`, `;token=`,
    a fragment, anything that does not parse) becomes `***`. A malformed DSN is redacted
    too, never raised on. The DSN comes back unchanged when nothing in it needed hiding.
    """
    parts = split_dsn(dsn)
    if parts is None:
        return dsn if _plain(r"[A-Za-z0-9_.:/-]*", dsn) else "***"
    out = f"{parts.scheme}://"
    if parts.userinfo is not None:
        user = parts.user or ""
        out += (user if _plain(r"[A-Za-z0-9_.%+-]*", user) else "***") + (":***" if ":" in parts.userinfo else "") + "@"
    host, colon, port = parts.host.rpartition(":") if not parts.host.endswith("]") else (parts.host, "", "")
    host, port = (host, port) if colon else (parts.host, "")
    out += host if _plain(r"[A-Za-z0-9_.-]*|\[[0-9A-Fa-f:.]+\]", host) else "***"
    out += colon + (port if _plain(r"[0-9]*", port) else "***")  # a password can land here: `u:pw/db`
    out += parts.path if _plain(r"[A-Za-z0-9_.~/ -]*", parts.path) else "/***"
    if parts.query is not None:
        pieces = re.split(r"([&;])", parts.query)  # separators kept: an unchanged DSN comes back as written
        out += "?" + "".join(piece if piece in ("&", ";", "") else _redact_param(piece) for piece in pieces)
    if parts.fragment is not None:
        out += "#***" if parts.fragment else "#"
    return out


def _redact_param(param: str) -> str:
    name, eq, value = param.partition("=")
    shown = unquote(name).strip().lower()
    if not _plain(r"[a-z0-9_.-]*", shown):
        return "***"
    if not eq:
        return name if shown in DSN_QUERY_SHOWN else "***"
    keep = shown in DSN_QUERY_SHOWN and _plain(r"[A-Za-z0-9_.:/-]*", value)
    return f"{name}={value if keep else '***'}"


def dsn_secrets(dsn: str) -> list[str]:
    """The DSN's secret texts (as written and percent-decoded), to scrub from a driver's error message."""
    parts = split_dsn(dsn)
    if parts is None:
        return []
    found = [parts.password or ""]
    if parts.userinfo is not None and ":" not in parts.userinfo and not _plain(r"[A-Za-z0-9_.%+-]*", parts.userinfo):
        found.append(parts.userinfo)  # not a user name: what was meant as credentials or a query
    for param in re.split(r"[&;]", parts.query or ""):
        name, _, value = param.partition("=")
        if unquote(name).strip().lower() not in DSN_QUERY_SHOWN:
            found.append(value)
    found.append(parts.fragment or "")
    return sorted({s for text in found for s in (text, unquote(text)) if s}, key=len, reverse=True)


def dsn_database(dsn: str) -> str:
    """The ClickHouse database a DSN connects to (clickhouse-connect's reading): its path's first
    segment (not for `chdb:///path`, where the path is the folder), else `?database=`, else `default`."""
    parts = split_dsn(dsn)
    if parts is None:
        return "default"
    if parts.host and parts.path.strip("/"):
        named = unquote(parts.path[1:].split("/")[0])
        if named:
            return named
    for param in re.split(r"[&;]", parts.query or ""):
        name, _, value = param.partition("=")
        if unquote(name).strip() == "database" and value:
            return unquote(value)
    return "default"
