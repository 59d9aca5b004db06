"""Load new silver Delta versions into ClickHouse, exactly once.

For each Delta version v after the last one loaded, the rows v inserted (change
data feed, read by Spark) are sorted by Kafka coordinates and cut into chunks of
`batch_size`. Spark numbers the rows and the driver fetches one chunk at a time as
Arrow, so its memory is bounded by a chunk, not by a version.
Chunk i is inserted with `insert_deduplication_token = <pipeline>/<table>/<delta
table id>/<v>/<i>`; after every chunk of v is in, v goes into a ledger table in
ClickHouse. A crash anywhere re-runs to the same result: chunks already inserted
are dropped by ClickHouse's block deduplication, the ledger moves only after a
whole version, and nothing is skipped.

chDB (the embedded engine) allows one process per on-disk path, so clients are
opened late and closed early (`open_client` is a context manager).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from riverhouse.platform.faults import crash_point
from riverhouse.platform.spec import RESERVED_TABLE_PREFIX, PipelineSpec
from riverhouse.platform.state.settings import dsn_secrets, redact_dsn, split_dsn
from riverhouse.platform.state.tables import open_table

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
REBUILD_KEY = "riverhouse.rebuild"  # commit metadata of backfill versions
CLICKHOUSE_TYPES = {
    "string": "String",
    "int": "Int32",
    "long": "Int64",
    "float": "Float32",
    "double": "Float64",
    "boolean": "Bool",
    "timestamp": "DateTime64(6, 'UTC')",
    "date": "Date32",
}
# Server error codes worth retrying: overload, timeouts, network, lost insert status.
TRANSIENT_CODES = {3, 159, 164, 202, 209, 210, 241, 242, 252, 319, 425, 999, 1000}
CODE_RE = re.compile(r"Code:\s*(\d+)")


class ClickHouseLoadError(RuntimeError):
    """A permanent problem (schema mismatch, bad DSN...): retrying will not help."""


class TransientClickHouseError(RuntimeError):
    pass


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


def check_dsn(dsn: str) -> None:
    """Refuse a DSN clickhouse-connect would misread, naming the problem (never the password)."""
    from urllib.parse import urlsplit

    if dsn.startswith("chdb://"):
        return
    if not dsn.startswith(("http://", "https://", "clickhouse://", "clickhouses://")):
        raise ClickHouseLoadError(
            f"unsupported ClickHouse DSN {redact_dsn(dsn)!r}: use chdb:///path or http(s)://user:pass@host:port/db"
        )
    userinfo = split_dsn(dsn).userinfo or ""  # type: ignore[union-attr]
    if any(c in userinfo for c in "/?#@"):
        # clickhouse-connect reads the DSN as a URL, where these end the credentials.
        raise ClickHouseLoadError(
            f"ClickHouse DSN {redact_dsn(dsn)!r}: the user or password contains '/', '?', '#' or '@'; "
            "write them percent-encoded (%2F, %3F, %23, %40)"
        )
    try:
        parts = urlsplit(dsn)
        _ = parts.port  # raises ValueError on a non-numeric or out-of-range port
    except ValueError as exc:
        raise ClickHouseLoadError(
            f"ClickHouse DSN {redact_dsn(dsn)!r} is malformed ({str(exc).split(':')[0]}): "
            "write http(s)://user:password@host:port/database with a numeric port"
        ) from None
    if not parts.hostname:
        raise ClickHouseLoadError(f"ClickHouse DSN {redact_dsn(dsn)!r} names no host")


def _scrubbed(exc: BaseException, dsn: str) -> str:
    """The error's text without the DSN's password, should a driver ever echo it."""
    text = str(exc)
    for secret in dsn_secrets(dsn):
        text = text.replace(secret, "***")
    return text


@contextmanager
def open_client(dsn: str, attempts: int | None = None, log: Callable[[str], None] | None = None) -> Iterator[Any]:
    """A clickhouse-connect client for `chdb:///path` or `http(s)://user:pass@host:port/db`.

    A host that does not resolve fails at once; one that does not answer is retried a few
    times (each retry reported) with a short connect timeout, so a wrong DSN fails in seconds.
    """
    import clickhouse_connect

    check_dsn(dsn)
    embedded = dsn.startswith("chdb://")
    if embedded:
        Path(dsn[len("chdb://") :]).mkdir(parents=True, exist_ok=True)
    if attempts is None:
        attempts = CHDB_CONNECT_ATTEMPTS if embedded else CONNECT_ATTEMPTS

    def connect() -> Any:
        if embedded:
            return clickhouse_connect.get_client(dsn=dsn)
        try:
            return clickhouse_connect.get_client(dsn=dsn, connect_timeout=CONNECT_TIMEOUT_S)
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
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return "String"
    if pa.types.is_boolean(arrow_type):
        return "Bool"
    if pa.types.is_integer(arrow_type):
        return ("UInt" if pa.types.is_unsigned_integer(arrow_type) else "Int") + str(arrow_type.bit_width)
    if pa.types.is_float32(arrow_type):
        return "Float32"
    if pa.types.is_floating(arrow_type):
        return "Float64"
    if pa.types.is_timestamp(arrow_type):
        return "DateTime64(6, 'UTC')"
    if pa.types.is_date(arrow_type):
        return "Date32"
    if pa.types.is_decimal(arrow_type):
        return f"Decimal({arrow_type.precision}, {arrow_type.scale})"
    raise ClickHouseLoadError(f"{where}: type {arrow_type} has no ClickHouse column type; cast it in the query")


def sink_table_path(spec: PipelineSpec, warehouse: str) -> str:
    """The Delta table the sink loads: gold for join pipelines, else the source's silver."""
    from riverhouse.platform.state.tables import TableLayout

    layout = TableLayout(warehouse, spec.name)
    return layout.path("gold", spec.sink.table) if spec.is_join else layout.silver(spec.sink_source_name)


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
            out.append((name, typ if name in spec.sink.order_by else f"Nullable({typ})"))
        return [*out, (PARTITION_COLUMN, "Date")]
    src = spec.sink_source
    out = []
    for f in src.fields:
        typ = CLICKHOUSE_TYPES[f.type]
        not_null = f.name in src.required_fields or f.name in spec.sink.order_by
        out.append((f.name, typ if not_null else f"Nullable({typ})"))
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


@dataclass
class LoadResult:
    table: str
    versions_loaded: list[int] = field(default_factory=list)
    rows_loaded: int = 0
    chunks: int = 0
    last_loaded_version: int | None = None
    delta_version: int | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "versions_loaded": len(self.versions_loaded),
            "rows_loaded": self.rows_loaded,
            "chunks": self.chunks,
            "last_loaded_version": self.last_loaded_version,
            "delta_version": self.delta_version,
            "seconds": round(self.seconds, 3),
        }


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


def rebuild_versions(table: Any, first: int, last: int) -> set[int]:
    """Versions in [first, last] written by a backfill (their rows reach ClickHouse by partition swap)."""
    if last < first:
        return set()
    out = set()
    for commit in table.history(last - first + 1):
        version = commit.get("version")
        if version is not None and first <= int(version) <= last and _is_rebuild(commit):
            out.add(int(version))
    return out


def _is_rebuild(commit: dict[str, Any]) -> bool:
    """delta-spark keeps Riverhouse's commit metadata as JSON in `userMetadata` (delta-rs: top-level keys)."""
    if REBUILD_KEY in commit:
        return True
    try:
        meta = json.loads(commit.get("userMetadata") or "{}")
    except ValueError:
        return False
    return isinstance(meta, dict) and REBUILD_KEY in meta


def _changes(spark: Any, path: str, start: int, end: int, columns: list[str], emitted_only: bool) -> Any:
    """The rows Delta versions start..end inserted (change data feed), as a Spark plan."""
    from pyspark.sql import functions as F

    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .option("endingVersion", end)
        .load(path)
        .where(F.col("_change_type") == "insert")
    )
    if emitted_only:
        # Join pipelines keep every driving event in gold; only emitted rows reach ClickHouse.
        changes = changes.where(F.col("_status") == "emitted")
    return changes.select(*dict.fromkeys([*columns, "_commit_version"]))


def _numbered_chunks(changes: Any, order: list[str], size: int) -> Any:
    """Each row's chunk: its rank in (version, Kafka coordinates) order, divided by the chunk size.

    The same rows always get the same chunk, so a replayed version re-sends identical
    chunks with identical tokens.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rank = F.row_number().over(Window.partitionBy("_commit_version").orderBy(*order))
    return changes.withColumn("_chunk", F.floor((rank - 1) / F.lit(size)).cast("long"))


def load_new_versions(
    spec: PipelineSpec,
    dsn: str,
    delta_path: str,
    log: Callable[[str], None] | None = None,
    client: Any = None,
    spark: Any = None,
) -> LoadResult:
    """Load every silver version after the last one in the ledger; returns what was loaded.

    `client`: an open client to reuse (continuous mode keeps one for the session: a new
    connection costs ~0.1 s); by default one is opened for this load and closed after it.
    `spark`: the session that reads the change feed (by default the process's session).
    """
    started = time.monotonic()
    result = LoadResult(table=spec.sink.table)
    silver = open_table(delta_path)
    if silver is None:
        raise ClickHouseLoadError(f"Delta table {delta_path} does not exist yet: run the pipeline first")
    table_id = silver.metadata().id
    current = silver.version()
    result.delta_version = current
    if spec.is_join:
        columns = [*spec.plan.output_names, "_left_event_date"]
        order = ["_left_topic", "_left_partition", "_left_offset"]
        schema: pa.Schema | None = pa.schema(silver.schema())
    else:
        columns = [*(f.name for f in spec.sink_source.fields), "_event_date"]
        order = ["_topic", "_partition", "_offset"]
        schema = None
    with nullcontext(client) if client is not None else open_client(dsn, log=log) as client:
        with_retries(lambda: ensure_schema(client, spec, schema), "preparing the ClickHouse tables", log=log)
        last = with_retries(lambda: last_loaded_version(client, spec, table_id), "reading the ledger", log=log)
        result.last_loaded_version = last
        first = 0 if last is None else last + 1
        if first > current:
            result.seconds = time.monotonic() - started
            return result
        skipped = rebuild_versions(silver, first, current)
        if spark is None:
            from riverhouse.platform.runtime.spark import get_spark

            spark = get_spark()  # the process's session if there is one
        changes = _changes(spark, delta_path, first, current, [*columns, *order], spec.is_join)
        # One row per version (counts) reaches the driver here; the rows come chunk by chunk.
        counts = {int(r[0]): int(r[1]) for r in changes.groupBy("_commit_version").count().collect()}
        numbered = _numbered_chunks(changes, order, spec.sink.batch_size).persist()
        try:
            for version in range(first, current + 1):
                rows = 0 if version in skipped else counts.get(version, 0)
                chunks = _insert_version(client, spec, table_id, version, numbered, rows, columns, order, log)
                crash_point("before_ledger_write")
                with_retries(
                    lambda v=version, n=rows, c=chunks: client.insert(
                        ledger_table(spec),
                        [[spec.name, spec.sink.table, table_id, v, n, c]],
                        column_names=["pipeline", "target", "table_id", "delta_version", "rows", "chunks"],
                    ),
                    f"recording Delta version {version} in {LEDGER_TABLE}",
                    log=log,
                )
                result.versions_loaded.append(version)
                result.rows_loaded += rows
                result.chunks += chunks
                result.last_loaded_version = version
        finally:
            numbered.unpersist()
    result.seconds = time.monotonic() - started
    return result


def _insert_version(
    client: Any,
    spec: PipelineSpec,
    table_id: str,
    version: int,
    numbered: Any,
    rows: int,
    columns: list[str],
    order: list[str],
    log: Callable[[str], None] | None,
) -> int:
    """Insert a version's chunks in order; each chunk is fetched from Spark as Arrow when its turn comes."""
    from pyspark.sql import functions as F

    size = spec.sink.batch_size
    chunks = 0
    for chunk_index in range((rows + size - 1) // size):
        chunk = (
            numbered.where((F.col("_commit_version") == version) & (F.col("_chunk") == chunk_index))
            .orderBy(*order)
            .select(*columns[:-1], F.col(columns[-1]).alias(PARTITION_COLUMN))
            .toArrow()
        )
        token = f"{spec.name}/{spec.sink.table}/{table_id}/{version}/{chunk_index}"
        with_retries(
            lambda c=chunk, t=token: client.insert_arrow(
                qualified_table(spec), c, settings={"insert_deduplication_token": t}
            ),
            f"inserting Delta version {version} chunk {chunk_index} into {qualified_table(spec)}",
            log=log,
        )
        chunks += 1
        crash_point("during_clickhouse_insert")
    return chunks


def duplicate_key_count(client: Any, spec: PipelineSpec) -> int:
    """Keys (dedup key; join pipelines: sink.order_by) held by more than one ClickHouse row."""
    key = list(spec.sink.order_by) if spec.is_join else spec.sink_source.dedup_key
    key_expr = ", ".join(quote(k) for k in key)
    return int(
        client.query(
            f"SELECT count() FROM (SELECT {key_expr} FROM {qualified_table(spec)} GROUP BY {key_expr} HAVING count() > 1)"
        ).result_rows[0][0]
    )


def table_stats(dsn: str, spec: PipelineSpec) -> dict[str, int]:
    """Rows and duplicate keys in the ClickHouse table."""
    with open_client(dsn) as client:
        rows = client.query(f"SELECT count() FROM {qualified_table(spec)}").result_rows[0][0]
        return {"rows": int(rows), "duplicate_keys": duplicate_key_count(client, spec)}


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
