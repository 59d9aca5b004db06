"""A Delta table's transaction log, read on the driver: versions, commits, the files a commit added.

delta-spark writes every table. Between Spark jobs the driver needs a few facts — the latest
version, which batch a commit came from, which files it added — and the log answers each in
milliseconds. Asking Delta through Spark costs a job each (`DESCRIBE HISTORY`,
`DeltaTable.history`), and in Delta 4.4 any write with `txnAppId`/`txnVersion` rebuilds the
snapshot's whole state first (three Spark jobs, ~0.5 s per write on two cores; see
bench/analysis.md). So Riverhouse marks its own commits (`MARK_*` keys in the commit's
`userMetadata`) and reads the marks back from here.

Only the parts of the protocol Riverhouse's tables use are read: JSON commits, `_last_checkpoint`,
and a single-file checkpoint for the table's metadata once old commits are cleaned up. A table
with deletion vectors or column mapping is refused where rows are read (`added_files`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow.fs as pafs

# Riverhouse's marks in a commit's userMetadata (JSON).
MARK_APP = "riverhouse.app"
MARK_BATCH = "riverhouse.batch_id"
# A backfill's commit (its window): the loader leaves it to the partition swap.
MARK_REBUILD = "riverhouse.rebuild"
# The newest event time a silver table holds (microseconds since the epoch), kept in every
# ingest commit: gold's watermark reads it here instead of scanning silver.
MARK_MAX_EVENT_TIME = "riverhouse.max_event_micros"
# How far back to look for a stream's newest commit when no hint says where it is.
SCAN_BACK_LIMIT = 500


class DeltaLogError(RuntimeError):
    pass


@dataclass(frozen=True)
class AddedFile:
    path: str  # absolute path or URI of the data file
    partition_values: dict[str, str | None]
    size: int
    records: int | None  # from the file's statistics when Delta collected them
    data_change: bool


@dataclass
class Commit:
    version: int
    info: dict[str, Any] = field(default_factory=dict)
    adds: list[dict[str, Any]] = field(default_factory=list)
    removes: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] | None = None
    txns: dict[str, int] = field(default_factory=dict)  # Delta app transactions (appId -> version)

    @property
    def user_metadata(self) -> dict[str, Any]:
        raw = self.info.get("userMetadata")
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def batch_of(self, app_id: str) -> int | None:
        """The batch id this commit holds for `app_id` (Riverhouse's mark, or a Delta app transaction)."""
        meta = self.user_metadata
        if meta.get(MARK_APP) == app_id and meta.get(MARK_BATCH) is not None:
            return int(meta[MARK_BATCH])
        return self.txns.get(app_id)


def filesystem(table_path: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system for the table's location and the path within it."""
    if "://" not in table_path:
        return pafs.LocalFileSystem(), os.path.abspath(table_path)
    if table_path.startswith("file://"):
        return pafs.LocalFileSystem(), table_path[len("file://") :]
    from riverhouse.platform.state.storage import object_store

    return object_store(table_path)


class DeltaLog:
    """Reads one table's `_delta_log`. Cheap to make; remembers the newest version it has seen."""

    def __init__(self, table_path: str):
        self.table_path = table_path.rstrip("/")
        self.fs, self.root = filesystem(self.table_path)
        self.log_dir = f"{self.root}/_delta_log"
        self._known: int | None = None

    def _commit_file(self, version: int) -> str:
        return f"{self.log_dir}/{version:020d}.json"

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def _read_text(self, path: str) -> str | None:
        try:
            with self.fs.open_input_stream(path) as stream:
                return stream.read().decode("utf-8")
        except (FileNotFoundError, OSError):
            return None

    def _last_checkpoint(self) -> int | None:
        text = self._read_text(f"{self.log_dir}/_last_checkpoint")
        if not text:
            return None
        try:
            return int(json.loads(text)["version"])
        except (ValueError, KeyError, TypeError):
            return None

    def exists(self) -> bool:
        return self.latest_version() is not None

    def latest_version(self) -> int | None:
        """The newest committed version, or None when there is no table here.

        Starts from the newest version known (this object's last answer, `_last_checkpoint`, or
        0) and probes the following commit files: Delta's versions are contiguous.
        """
        start = self._known
        if start is None:
            checkpoint = self._last_checkpoint()
            if checkpoint is not None:
                start = checkpoint
            elif self._exists(self._commit_file(0)):
                start = 0
            else:
                return None
        version = start
        while self._exists(self._commit_file(version + 1)):
            version += 1
        self._known = version
        return version

    def commit(self, version: int) -> Commit:
        text = self._read_text(self._commit_file(version))
        if text is None:
            raise DeltaLogError(
                f"Delta table {self.table_path}: commit {version} is not in the log (cleaned up by log "
                "retention?); Riverhouse needs commits it has not processed yet to stay in the log"
            )
        commit = Commit(version)
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                commit.info = action["commitInfo"]
            elif "add" in action:
                commit.adds.append(action["add"])
            elif "remove" in action:
                commit.removes.append(action["remove"])
            elif "metaData" in action:
                commit.metadata = action["metaData"]
            elif "txn" in action:
                commit.txns[action["txn"]["appId"]] = int(action["txn"]["version"])
        return commit

    def commits_back(self, newest: int, oldest: int = 0) -> Iterator[Commit]:
        """Commits newest..oldest (those still in the log), newest first."""
        for version in range(newest, oldest - 1, -1):
            if not self._exists(self._commit_file(version)):
                return
            yield self.commit(version)

    def table_id(self) -> str:
        """The table's id (its metadata), which changes when the table is re-created."""
        return str(self.metadata()["id"])

    def schema(self) -> Any:
        """The table's schema as a Spark StructType (parsed from the log; no session needed)."""
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.metadata()["schemaString"]))

    def metadata(self) -> dict[str, Any]:
        """The table's metaData action: from version 0, or the checkpoint once old commits are gone.

        Riverhouse never changes a table's metadata after creating it, so the first is the current.
        """
        if self._exists(self._commit_file(0)):
            metadata = self.commit(0).metadata
            if metadata is not None:
                return metadata
        checkpoint = self._last_checkpoint()
        if checkpoint is not None:
            import pyarrow.parquet as pq

            path = f"{self.log_dir}/{checkpoint:020d}.checkpoint.parquet"
            with self.fs.open_input_file(path) as handle:
                rows = pq.read_table(handle, columns=["metaData"]).column("metaData").to_pylist()
            for row in rows:
                if row and row.get("id"):
                    return row
        raise DeltaLogError(f"Delta table {self.table_path}: no metadata found in its log")

    def find_batch(self, app_id: str, batch_id: int, after: int = -1) -> int | None:
        """The version at which `app_id` committed batch `batch_id` or a later one; None if it has not.

        Looks at the commits after version `after` (a hint: the stream's last known commit), or,
        without one, back from the newest until the stream's newest commit (at most
        SCAN_BACK_LIMIT commits).
        """
        latest = self.latest_version()
        if latest is None:
            return None
        oldest = after + 1 if after >= 0 else max(0, latest - SCAN_BACK_LIMIT)
        for commit in self.commits_back(latest, oldest):
            found = commit.batch_of(app_id)
            if found is not None:
                return commit.version if found >= batch_id else None
        return None

    def latest_mark(self, key: str, depth: int = 50, newest: int | None = None) -> dict[str, Any] | None:
        """The userMetadata of the newest of `depth` commits (up to version `newest`) that holds `key`."""
        latest = self.latest_version() if newest is None else newest
        if latest is None:
            return None
        for commit in self.commits_back(latest, max(0, latest - depth + 1)):
            meta = commit.user_metadata
            if key in meta:
                return meta
        return None

    def added_files(self, commit: Commit) -> list[AddedFile]:
        """The data files a commit added as data changes (compaction's rewrites excluded), in path order."""
        out = []
        for add in commit.adds:
            if add.get("deletionVector"):
                raise DeltaLogError(
                    f"Delta table {self.table_path} version {commit.version} has deletion vectors, which "
                    "Riverhouse's tables never enable; it was written by another tool"
                )
            stats = add.get("stats")
            records = None
            if stats:
                try:
                    records = int(json.loads(stats).get("numRecords"))
                except (ValueError, TypeError):
                    records = None
            out.append(
                AddedFile(
                    path=self._data_path(add["path"]),
                    partition_values=dict(add.get("partitionValues") or {}),
                    size=int(add.get("size", 0)),
                    records=records,
                    data_change=bool(add.get("dataChange", True)),
                )
            )
        return sorted((f for f in out if f.data_change), key=lambda f: f.path)

    def event_times_in(self, commit: Commit, column: str, date_column: str) -> list[tuple[datetime, datetime]]:
        """[earliest, latest] `column` value of each data file `commit` added (its statistics).

        What an orchestrator needs to say which time partitions a run wrote to, from the log
        alone. A file without statistics spans its `date_column` day (its partition value).
        """
        out: list[tuple[datetime, datetime]] = []
        for add in commit.adds:
            if not add.get("dataChange", True):
                continue
            stats = json.loads(add.get("stats") or "{}")
            lo = _stat_time(stats.get("minValues", {}).get(column))
            hi = _stat_time(stats.get("maxValues", {}).get(column))
            if lo is None or hi is None:
                day = (add.get("partitionValues") or {}).get(date_column)
                if not day:
                    continue
                lo = datetime.fromisoformat(day).replace(tzinfo=UTC)
                hi = lo + timedelta(days=1) - timedelta(microseconds=1)
            out.append((lo, hi))
        return out

    def _data_path(self, relative: str) -> str:
        from urllib.parse import unquote

        if "://" in relative:
            return relative
        return f"{self.root}/{unquote(relative)}"


def _stat_time(value: Any) -> datetime | None:
    """A timestamp from Delta's file statistics ("2026-01-01T00:00:00.000Z"), in UTC."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


_FILE_INDEX: dict[str, Any] = {}


@dataclass(frozen=True)
class Overlap:
    """The data files `overlapping` chose, and the rows they hold by the log's statistics
    (`numRecords`; None when a chosen file has none)."""

    paths: list[str]
    records: int | None


def overlapping(
    table_path: str,
    column: str,
    lo: Any,
    hi: Any | None,
    date_column: str,
    version: int | None = None,
    key_range: tuple[str, Any, Any] | None = None,
) -> Overlap:
    """Data files of the table (at `version`, default its latest) whose `column` statistics overlap [lo, hi].

    `hi` None: no upper bound. `key_range` (column, lowest, highest): also only the files whose
    statistics of that column overlap [lowest, highest] (an integer column, or a string column of
    valid UTF-8: Delta's string statistics are bounds in UTF-8 byte order, as Spark's min and
    max, and pyarrow's comparison, are; a truncated maximum is written above every value it
    stands for).

    What Delta's own planner does before a scan (partition values, then min/max statistics),
    done on the driver from the log with delta-rs, which keeps the table's state between calls
    and reads only the commits since (`update_incremental`). Reading the table through Spark
    instead rebuilds its snapshot state (a Spark job over the whole log) for every version it
    reads, the largest fixed cost of a micro-batch that looks up silver (bench/analysis.md).
    A file without statistics is kept (it may hold anything).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    table = _table_at(table_path, version)
    adds = pa.table(table.get_add_actions(flatten=True))  # delta-rs hands out arro3 tables
    if adds.num_rows == 0:
        return Overlap([], 0)
    day = adds.column(f"partition.{date_column}")
    keep = pc.greater_equal(day, lo.date())
    if hi is not None:
        keep = pc.and_(keep, pc.less_equal(day, hi.date()))
    for name, lowest, highest in [(column, lo, hi), *([key_range] if key_range is not None else [])]:
        if f"min.{name}" in adds.column_names:
            keep = pc.and_(keep, _stats_overlap(adds, name, lowest, highest))
    chosen = adds.filter(keep)
    root = table.table_uri.rstrip("/")
    paths = [path if "://" in path else f"{root}/{path}" for path in chosen.column("path").to_pylist()]
    return Overlap(paths, records_of(chosen))


def records_of(adds: Any) -> int | None:
    """The rows of a table of add actions by their `num_records` statistics; None when one has none."""
    if "num_records" not in adds.column_names:
        return None if adds.num_rows else 0
    counts = adds.column("num_records")
    return None if counts.null_count else sum(counts.to_pylist())


def _stats_overlap(adds: Any, name: str, lowest: Any, highest: Any | None) -> Any:
    """Which add actions' min/max statistics of `name` overlap [lowest, highest] (`highest` None: no
    upper bound); a file without them is kept. string_view statistics are compared as strings
    (pyarrow cannot compare string_view with a Python value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def stat(which: str) -> Any:
        column = adds.column(f"{which}.{name}")
        return column.cast(pa.string()) if pa.types.is_string_view(column.type) else column

    keep = pc.fill_null(pc.greater_equal(stat("max"), lowest), True)
    if highest is not None:
        keep = pc.and_(keep, pc.fill_null(pc.less_equal(stat("min"), highest), True))
    return keep


def table_root(table_path: str) -> str:
    """The table's folder as the URI its data files are named under (`overlapping`'s paths).

    From the state `overlapping` keeps (no second look at the log); loaded if there is none."""
    table = _FILE_INDEX.get(table_path) or _table_at(table_path, None)
    return table.table_uri.rstrip("/")


def _table_at(table_path: str, version: int | None) -> Any:
    """delta-rs's state of the table: the cached latest (brought up to date), or `version` when older."""
    from deltalake import DeltaTable

    from riverhouse.platform.state.storage import storage_options

    table = _FILE_INDEX.get(table_path)
    if table is None:
        table = DeltaTable(table_path, storage_options=storage_options() or None)
        _FILE_INDEX[table_path] = table
    else:
        table.update_incremental()
    if version is None or table.version() == version:
        return table
    return DeltaTable(table_path, version=version, storage_options=storage_options() or None)
