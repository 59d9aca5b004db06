"""ClickHouse for Riverhouse: the client (DSN, retries), the tables (DDL, checks), the ledger, figures.

The exactly-once load of Delta versions is in `versions.py`; a backfill's partition swap in
`replace.py`. chDB (the embedded engine) allows one process per on-disk path, so clients are
opened late and closed early (`open_client` is a context manager).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from riverhouse.platform.spec import RESERVED_TABLE_PREFIX, PipelineSpec
from riverhouse.platform.state.settings import dsn_secrets, redact_dsn, split_dsn
from riverhouse.platform.types import NoClickHouseType, clickhouse_column, clickhouse_type_of_arrow
from riverhouse.platform.types import clickhouse_type as spec_clickhouse_type

# Riverhouse's own tables carry the reserved prefix, which no sink table may use (spec.py).
LEDGER_TABLE = f"{RESERVED_TABLE_PREFIX}ledger"
STAGING_PREFIX = f"{RESERVED_TABLE_PREFIX}staging__"
# Connecting: a wrong host or port should fail within seconds, saying so, not retry for a minute.
CONNECT_TIMEOUT_S = 5
CONNECT_ATTEMPTS = 3
# The embedded engine is another story: a path another process holds is released when that
# process's load ends, so waiting (with backoff, ~1 minute in all) is the right answer there.
CHDB_CONNECT_ATTEMPTS = 8
# Name resolution failures do not heal by retrying: the host in the DSN is wrong.
PERMANENT_CONNECT_HINTS = ("NameResolutionError", "Name or service not known", "nodename nor servname", "getaddrinfo")
logger = logging.getLogger("riverhouse.clickhouse")
DEDUP_WINDOW_BLOCKS = 10_000
PARTITION_COLUMN = "_event_date"  # ClickHouse partition key: a backfill swaps whole days
# Server error codes worth retrying: overload, timeouts, network, lost insert status.
TRANSIENT_CODES = {3, 159, 164, 202, 209, 210, 241, 242, 252, 319, 425, 999, 1000}
CODE_RE = re.compile(r"Code:\s*(\d+)")


class ClickHouseLoadError(RuntimeError):
    """A permanent problem (schema mismatch, bad DSN...): retrying will not help."""


def quote(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def staging_table_name(table: str) -> str:
    """The backfill's staging table for `table`: reserved prefix, so it can never be a sink table."""
    return f"{STAGING_PREFIX}{table}"


def is_transient(exc: BaseException) -> bool:
    text = str(exc)
    if any(hint in text for hint in PERMANENT_CONNECT_HINTS):
        return False
    if (
        "EmbeddedServer" in text
        or "already in use" in text.lower()
        or ("lock" in text.lower() and "chdb" in text.lower())
    ):
        return True
    match = CODE_RE.search(text)
    if match:
        return int(match.group(1)) in TRANSIENT_CODES
    from clickhouse_connect.driver.exceptions import OperationalError

    return isinstance(exc, OperationalError | ConnectionError | TimeoutError)


def with_retries(
    action: Callable[[], Any],
    what: str,
    attempts: int = 6,
    base_delay_s: float = 0.5,
    log: Callable[[str], None] | None = None,
) -> Any:
    """Run `action`, retrying transient errors with exponential backoff; permanent ones raise at once.

    Every retry is reported (to `log`, else the `riverhouse.clickhouse` logger) so a wait is never silent.
    """
    log = log or logger.warning
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except ClickHouseLoadError:
            raise
        except Exception as exc:
            if not is_transient(exc) or attempt == attempts:
                kind = "transient error persisted" if is_transient(exc) else "failed"
                raise ClickHouseLoadError(f"{what} {kind}: {_first_line(exc)}") from exc
            delay = base_delay_s * 2 ** (attempt - 1)
            log(f"{what}: transient error ({_first_line(exc)}), retry {attempt}/{attempts - 1} in {delay:.1f}s")
            time.sleep(delay)
    raise AssertionError("unreachable")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:400]


# The DSN's scheme decides the transport (clickhouse-connect's own DSN parser drops the scheme, so
# `https://host/db` went out as plain http on 8123): scheme -> (interface, TLS).
DSN_SCHEMES = {
    "http": ("http", False),
    "clickhouse": ("http", False),
    "https": ("https", True),
    "clickhouses": ("https", True),
}
DEFAULT_PORTS = {False: 8123, True: 8443}
# ClickHouse's native TCP protocol, which clickhouse-connect (an HTTP client) does not speak.
NATIVE_PORTS = {9000: "native protocol", 9440: "native protocol over TLS"}
# Query parameters that would repeat what the DSN's scheme and authority say.
AUTHORITY_PARAMS = ("host", "port", "username", "password")
_TRUE = ("1", "true", "yes", "on", "y")
_FALSE = ("0", "false", "no", "off", "n")


def check_dsn(dsn: str) -> None:
    """Refuse a DSN clickhouse-connect would misread, naming the problem (never the password)."""
    if not dsn.startswith("chdb://"):
        client_args(dsn)


def client_args(dsn: str) -> dict[str, Any]:
    """The keyword arguments for `clickhouse_connect.get_client` that a server DSN means.

    The scheme decides the transport: `https://` and `clickhouses://` are HTTPS (port 8443
    unless given), `http://` and `clickhouse://` plain HTTP (port 8123 unless given). Native
    protocol ports (9000, 9440) are refused, and so are `?secure=`/`?interface=` values that
    contradict the scheme. Other query parameters (`verify`, `ca_cert`, `compress`, ...) are
    client options, passed on as clickhouse-connect's DSN parser would.
    """
    from urllib.parse import parse_qsl, unquote, urlsplit

    shown = redact_dsn(dsn)
    scheme = dsn.partition("://")[0].lower() if "://" in dsn else ""
    if scheme not in DSN_SCHEMES:
        raise ClickHouseLoadError(
            f"unsupported ClickHouse DSN {shown!r}: use chdb:///path or http(s)://user:pass@host:port/db"
        )
    interface, secure = DSN_SCHEMES[scheme]
    parts = split_dsn(dsn)
    assert parts is not None  # it has a scheme
    if any(c in (parts.userinfo or "") for c in "/?#@"):
        # Read as a URL, these end the credentials.
        raise ClickHouseLoadError(
            f"ClickHouse DSN {shown!r}: the user or password contains '/', '?', '#' or '@'; "
            "write them percent-encoded (%2F, %3F, %23, %40)"
        )
    try:
        url = urlsplit(dsn)
        port = url.port  # raises ValueError on a non-numeric or out-of-range port
    except ValueError as exc:
        raise ClickHouseLoadError(
            f"ClickHouse DSN {shown!r} is malformed ({str(exc).split(':')[0]}): "
            "write http(s)://user:password@host:port/database with a numeric port"
        ) from None
    if not url.hostname:
        raise ClickHouseLoadError(f"ClickHouse DSN {shown!r} names no host")
    if port in NATIVE_PORTS:
        raise ClickHouseLoadError(
            f"ClickHouse DSN {shown!r}: port {port} is ClickHouse's {NATIVE_PORTS[port]}, which Riverhouse's "
            "client does not speak; use the HTTP interface: http://...:8123 or https://...:8443 "
            "(the server's http_port / https_port)"
        )
    options: dict[str, Any] = dict(parse_qsl(url.query))  # the last of a repeated name wins
    for name in AUTHORITY_PARAMS:
        if name in options:
            raise ClickHouseLoadError(
                f"ClickHouse DSN {shown!r}: ?{name}= is not taken; write it in the DSN (scheme://user:password@host:port/db)"
            )
    if url.username and ({"user", "user_name"} & options.keys()):
        raise ClickHouseLoadError(
            f"ClickHouse DSN {shown!r} names its user twice (before the host and as ?user=); keep one"
        )
    said = options.pop("interface", None)
    if said is not None and said.lower() != interface:
        raise ClickHouseLoadError(
            f"ClickHouse DSN {shown!r}: its ?interface= contradicts the scheme {scheme}://, which means {interface}; "
            "the scheme decides: drop the parameter"
        )
    said = options.pop("secure", None)
    if said is not None and (said.lower() not in _TRUE + _FALSE or (said.lower() in _TRUE) != secure):
        raise ClickHouseLoadError(
            f"ClickHouse DSN {shown!r}: its ?secure= contradicts the scheme {scheme}:// "
            f"({'TLS' if secure else 'no TLS'}); the scheme decides: use https:// for TLS, http:// without, "
            "and drop the parameter"
        )
    database = unquote(url.path[1:].split("/")[0]) if url.path else ""
    named = options.pop("database", "")
    return {
        "interface": interface,
        "secure": secure,
        "host": url.hostname,
        "port": port or DEFAULT_PORTS[secure],
        "username": unquote(url.username) if url.username else None,
        "password": unquote(url.password) if url.password else "",
        "database": database or named or None,
        **options,
    }


def _scrubbed(exc: BaseException, dsn: str) -> str:
    """The error's text without the DSN's password, should a driver ever echo it."""
    text = str(exc)
    for secret in dsn_secrets(dsn):
        text = text.replace(secret, "***")
    return text


@contextmanager
def open_client(dsn: str, attempts: int | None = None, log: Callable[[str], None] | None = None) -> Iterator[Any]:
    """A clickhouse-connect client for `chdb:///path` or `http(s)://user:pass@host:port/db`
    (the scheme decides TLS, see `client_args`).

    A host that does not resolve fails at once; one that does not answer is retried a few
    times (each retry reported) with a short connect timeout, so a wrong DSN fails in seconds.
    """
    import clickhouse_connect

    embedded = dsn.startswith("chdb://")
    args = {} if embedded else client_args(dsn)
    if embedded:
        Path(dsn[len("chdb://") :]).mkdir(parents=True, exist_ok=True)
    if attempts is None:
        attempts = CHDB_CONNECT_ATTEMPTS if embedded else CONNECT_ATTEMPTS

    def connect() -> Any:
        if embedded:
            return clickhouse_connect.get_client(dsn=dsn)
        try:
            # Every argument explicit: clickhouse-connect's DSN parser would drop the scheme.
            return clickhouse_connect.get_client(**{"connect_timeout": CONNECT_TIMEOUT_S, **args})
        except Exception as exc:
            # Re-raised with the password scrubbed; the type is kept so retry decisions hold.
            try:
                scrubbed = type(exc)(_scrubbed(exc, dsn))
            except Exception:
                scrubbed = ConnectionError(_scrubbed(exc, dsn))
            raise scrubbed from None

    client = with_retries(connect, f"connecting to ClickHouse at {redact_dsn(dsn)}", attempts=attempts, log=log)
    try:
        yield client
    finally:
        client.close()


def clickhouse_type(arrow_type: pa.DataType, where: str) -> str:
    try:
        return clickhouse_type_of_arrow(arrow_type)
    except NoClickHouseType:
        raise ClickHouseLoadError(
            f"{where}: type {arrow_type} has no ClickHouse column type; cast it in the query"
        ) from None


def sink_table_path(spec: PipelineSpec, warehouse: str) -> str:
    """The Delta table the sink loads: gold for join pipelines, else the source's silver."""
    from riverhouse.platform.state.tables import TableLayout

    layout = TableLayout(warehouse, spec.name)
    return layout.path("gold", spec.output_name) if spec.is_join else layout.silver(spec.sink_source_name)


def expected_columns(spec: PipelineSpec, schema: pa.Schema | None = None) -> list[tuple[str, str]]:
    """ClickHouse columns: the source's fields, or (join pipelines) the query's output columns.

    Plus `_event_date` (the driving event's date), the partition key that lets a
    backfill swap a day atomically.
    """
    if spec.is_join:
        if schema is None:
            return [*((name, "?") for name in spec.plan.output_names), (PARTITION_COLUMN, "Date")]
        out = []
        for name in spec.plan.output_names:
            typ = clickhouse_type(schema.field(name).type, f"output column {name}")
            out.append((name, clickhouse_column(typ, not_null=name in spec.sink.order_by)))
        return [*out, (PARTITION_COLUMN, "Date")]
    src = spec.sink_source
    out = []
    for f in src.fields:
        not_null = f.name in src.required_fields or f.name in spec.sink.order_by
        out.append((f.name, clickhouse_column(spec_clickhouse_type(f.type), not_null)))
    return [*out, (PARTITION_COLUMN, "Date")]


def delta_date_column(spec: PipelineSpec) -> str:
    """The Delta column that becomes ClickHouse's `_event_date`."""
    return "_left_event_date" if spec.is_join else "_event_date"


def qualified_table(spec: PipelineSpec) -> str:
    return (quote(spec.sink.database) + "." if spec.sink.database else "") + quote(spec.sink.table)


def create_table_sql(spec: PipelineSpec, schema: pa.Schema | None = None) -> str:
    columns = ",\n  ".join(f"{quote(n)} {t}" for n, t in expected_columns(spec, schema))
    order_by = ", ".join(quote(c) for c in spec.sink.order_by)
    return (
        f"CREATE TABLE IF NOT EXISTS {qualified_table(spec)} (\n  {columns}\n) ENGINE = MergeTree\n"
        f"PARTITION BY {PARTITION_COLUMN}\nORDER BY ({order_by})\nSETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW_BLOCKS}"
    )


def ledger_table(spec: PipelineSpec) -> str:
    return (quote(spec.sink.database) + "." if spec.sink.database else "") + quote(LEDGER_TABLE)


def _normalize_type(typ: str) -> str:
    typ = typ.replace(" ", "")
    typ = re.sub(r"^LowCardinality\((.*)\)$", r"\1", typ)
    return typ.replace("Nullable(LowCardinality(", "Nullable((")


def ensure_schema(client: Any, spec: PipelineSpec, schema: pa.Schema | None = None) -> None:
    """Create the sink and ledger tables, or check an existing sink table against the spec."""
    if spec.sink.database:
        client.command(f"CREATE DATABASE IF NOT EXISTS {quote(spec.sink.database)}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {ledger_table(spec)} (pipeline String, target String, table_id String, "
        "delta_version UInt64, rows UInt64, chunks UInt32, loaded_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        "ENGINE = MergeTree ORDER BY (pipeline, target, table_id, delta_version)"
    )
    client.command(create_table_sql(spec, schema))
    database = spec.sink.database or client.command("SELECT currentDatabase()")
    rows = client.query(
        "SELECT name, type FROM system.columns WHERE database = %(db)s AND table = %(t)s ORDER BY position",
        parameters={"db": database, "t": spec.sink.table},
    ).result_rows
    actual = {name: typ for name, typ in rows}
    problems = []
    for name, typ in expected_columns(spec, schema):
        if name not in actual:
            problems.append(f"column {name} is missing (expected {typ})")
        elif _normalize_type(actual[name]) != _normalize_type(typ):
            problems.append(f"column {name} is {actual[name]}, expected {typ}")
    engine = client.query(
        "SELECT engine, engine_full, partition_key FROM system.tables WHERE database = %(db)s AND name = %(t)s",
        parameters={"db": database, "t": spec.sink.table},
    ).result_rows
    if engine:
        name, full, partition_key = engine[0]
        if partition_key.strip("` ") != PARTITION_COLUMN:
            problems.append(
                f"it is partitioned by {partition_key or 'nothing'}, expected {PARTITION_COLUMN} "
                "(backfills replace one day at a time)"
            )
        if "MergeTree" not in name:
            problems.append(f"engine is {name}; exactly-once loading needs a MergeTree-family table")
        elif not name.startswith(("Replicated", "Shared")):
            match = re.search(r"non_replicated_deduplication_window\s*=\s*(\d+)", full)
            if not match or int(match.group(1)) == 0:
                problems.append(
                    "non_replicated_deduplication_window is 0, so retried inserts could double rows: "
                    f"ALTER TABLE {qualified_table(spec)} MODIFY SETTING "
                    f"non_replicated_deduplication_window = {DEDUP_WINDOW_BLOCKS}"
                )
    if problems:
        raise ClickHouseLoadError(
            f"ClickHouse table {qualified_table(spec)} does not match pipeline {spec.name!r}: "
            + "; ".join(problems)
            + ". Fix the table, or drop it and let Riverhouse create it."
        )


def last_loaded_version(client: Any, spec: PipelineSpec, table_id: str) -> int | None:
    rows = client.query(
        f"SELECT max(delta_version), count() FROM {ledger_table(spec)} "
        "WHERE pipeline = %(p)s AND target = %(t)s AND table_id = %(id)s",
        parameters={"p": spec.name, "t": spec.sink.table, "id": table_id},
    ).result_rows
    if not rows or rows[0][1] == 0:
        other = client.query(
            f"SELECT count() FROM {ledger_table(spec)} WHERE pipeline = %(p)s AND target = %(t)s AND table_id != %(id)s",
            parameters={"p": spec.name, "t": spec.sink.table, "id": table_id},
        ).result_rows[0][0]
        if other:
            raise ClickHouseLoadError(
                f"ClickHouse table {qualified_table(spec)} was loaded from another Delta table than "
                f"the current silver table (it was re-created). Loading would mix both: reset the pipeline "
                f"with `riverhouse reset {spec.name}` (drops the ClickHouse table and its {LEDGER_TABLE} rows, "
                "then reloads everything from Kafka)."
            )
        return None
    return int(rows[0][0])


def duplicate_key_count(client: Any, spec: PipelineSpec) -> int:
    """Keys (dedup key; join pipelines: sink.order_by) held by more than one ClickHouse row."""
    key = list(spec.sink.order_by) if spec.is_join else spec.sink_source.dedup_key
    key_expr = ", ".join(quote(k) for k in key)
    return int(
        client.query(
            f"SELECT count() FROM (SELECT {key_expr} FROM {qualified_table(spec)} GROUP BY {key_expr} HAVING count() > 1)"
        ).result_rows[0][0]
    )


def row_count(client: Any, spec: PipelineSpec) -> int:
    """Rows in the pipeline's ClickHouse table (MergeTree answers count() from its parts' metadata)."""
    return int(client.query(f"SELECT count() FROM {qualified_table(spec)}").result_rows[0][0])


def table_stats(dsn: str, spec: PipelineSpec) -> dict[str, int]:
    """Rows and duplicate keys in the ClickHouse table."""
    with open_client(dsn) as client:
        return {"rows": row_count(client, spec), "duplicate_keys": duplicate_key_count(client, spec)}


def sample_rows(dsn: str, spec: PipelineSpec, limit: int = 5) -> tuple[list[str], list[tuple[Any, ...]]]:
    order = ", ".join(quote(c) for c in spec.sink.order_by)
    with open_client(dsn) as client:
        result = client.query(f"SELECT * FROM {qualified_table(spec)} ORDER BY {order} LIMIT {int(limit)}")
        return list(result.column_names), [tuple(r) for r in result.result_rows]


def join_stats(dsn: str, spec: PipelineSpec, matched_column: str) -> dict[str, int]:
    """Joined (matched) rows, unmatched left rows and duplicate keys in a join's ClickHouse table."""
    key = ", ".join(quote(c) for c in spec.sink.order_by)
    with open_client(dsn) as client:
        joined, unmatched = client.query(
            f"SELECT countIf({quote(matched_column)} IS NOT NULL), countIf({quote(matched_column)} IS NULL) "
            f"FROM {qualified_table(spec)}"
        ).result_rows[0]
        dupes = client.query(
            f"SELECT count() FROM (SELECT {key} FROM {qualified_table(spec)} GROUP BY {key} HAVING count() > 1)"
        ).result_rows[0][0]
    return {"joined_rows": int(joined), "unmatched_left": int(unmatched), "join_duplicate_keys": int(dupes)}
