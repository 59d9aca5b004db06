"""A source's checkpoint folder: Spark's offsets, the stream's app id, locks, and what its batches report.

`<checkpoints>/<pipeline>/<source>/` holds
- `spark/`: Spark's own checkpoint (the offsets of every batch, its commit log);
- `riverhouse.json`: the stream's id, part of the app id each Delta commit is marked with;
- `run.lock`: one run per pipeline source at a time;
- `batches/<id>.json`: what each batch wrote (counts, versions, seconds), written by the batch
  body wherever it runs (in this process, or beside a Spark Connect server) and read by the run
  that started the query;
- `tables/<table>.json`: the last batch each Delta table received from this stream (a hint that
  spares reading the Delta log back; the log is the truth);
- `published.json`: the last batch a triggered run reported (its id, offsets and silver's version):
  where the next run's reports begin when batches land between runs (ingest/resident.py);
- `owner`: the run whose batch bodies may write (none after a clean stop); `writing/<run>.json`:
  the batch a run's body is writing. Under Spark Connect a run's query outlives a client that
  dies (the engine keeps it), so the next run makes itself the owner, and waits for the older
  body's batch in flight before its own query replaces the older one (ingest/stream.py).

The folder must be a local or mounted file system shared by the client and the engine
(locks are `flock`s; see settings.local_folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from riverhouse.platform.errors import PipelineError
from riverhouse.platform.state.settings import Settings

KEEP_BATCH_REPORTS = 500


def checkpoint_dir(settings: Settings, pipeline: str, source: str) -> Path:
    return Path(settings.checkpoints) / pipeline / source


def stream_app_id(checkpoint: Path, pipeline: str, source: str) -> str:
    """The app id this checkpoint's stream marks its Delta commits with.

    Batch ids restart at 0 when a checkpoint is deleted; a fresh id per checkpoint
    keeps a new stream's batches from being mistaken for an old stream's.
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    marker = checkpoint / "riverhouse.json"
    try:
        stream_id = json.loads(marker.read_text())["stream_id"]
    except (OSError, ValueError, KeyError):
        stream_id = uuid.uuid4().hex
        write_json(marker, {"stream_id": stream_id, "pipeline": pipeline, "source": source})
    return f"riverhouse:{pipeline}:{source}:{stream_id}"


def write_json(path: Path, value: Any) -> None:
    """Write `value` as JSON atomically (a reader sees the old file or the new one, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, sort_keys=True))
    tmp.replace(path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def pipeline_lock(
    checkpoint: Path,
    pipeline: str,
    wait_s: float = 0.0,
    name: str = "run.lock",
    log: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """One run per pipeline source at a time (a sensor run and a manual run must not overlap).

    `wait_s` > 0 waits that long for the holder to finish (backfills wait for streaming runs).
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    with open(checkpoint / name, "a+") as handle:
        deadline = time.monotonic() + wait_s
        announced = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                if time.monotonic() >= deadline:
                    raise PipelineError(
                        f"another run of pipeline {pipeline!r} is in progress (pid {holder}); wait for it to finish"
                    ) from None
                if log and not announced:
                    log(f"waiting for the run of pipeline {pipeline!r} in pid {holder} to finish")
                    announced = True
                time.sleep(0.5)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def sink_lock(settings: Settings, pipeline: str, log: Callable[[str], None] | None = None) -> Iterator[None]:
    """Serializes ClickHouse loads and partition replacements of one pipeline."""
    with pipeline_lock(Path(settings.checkpoints) / pipeline, pipeline, wait_s=600, name="sink.lock", log=log):
        yield


@contextmanager
def gold_lock(settings: Settings, pipeline: str, log: Callable[[str], None] | None = None) -> Iterator[None]:
    """One writer of a pipeline's gold table at a time (stream runs and backfills)."""
    with pipeline_lock(Path(settings.checkpoints) / pipeline, pipeline, wait_s=600, name="gold.lock", log=log):
        yield


PUBLISHED_FILE = "published.json"


def read_published(checkpoint: Path) -> dict[str, Any] | None:
    """The last batch a run reported: {"batch_id", "offsets", "silver_version", "at"}, or None."""
    mark = read_json(checkpoint / PUBLISHED_FILE)
    return mark if isinstance(mark, dict) else None


def write_published(checkpoint: Path, batch_id: int, offsets: Any, silver_version: int | None) -> None:
    write_json(
        checkpoint / PUBLISHED_FILE,
        {"batch_id": batch_id, "offsets": offsets, "silver_version": silver_version, "at": time.time()},
    )


class BatchChannel:
    """What a stream's batches tell the run that started the query, through files in the checkpoint.

    Under Spark Connect the batch body runs in a Python process beside the server, so nothing it
    holds in memory reaches the client; both sides see the checkpoint folder. Small JSON files,
    one per batch, written atomically.

    `run` names the run (a fresh token per run): a body starts a batch only while its run owns
    the checkpoint (`may_write`), and marks the batch it writes under its run's name, so a run
    can tell its own body's batch in flight from an older run's.
    """

    def __init__(self, checkpoint: Path, run: str = ""):
        self.root = checkpoint
        self.run = run
        self.batches = checkpoint / "batches"
        self.tables = checkpoint / "tables"
        self.owner_marker = checkpoint / "owner"
        self.writing = checkpoint / "writing"

    # -- written by the batch body
    def report(self, batch_id: int, metrics: dict[str, Any]) -> None:
        write_json(self.batches / f"{batch_id:012d}.json", metrics)
        stale = sorted(self.batches.glob("*.json"))[:-KEEP_BATCH_REPORTS]
        for path in stale:
            with contextlib.suppress(OSError):
                path.unlink()

    def table_progress(self, table: str) -> dict[str, Any] | None:
        return read_json(self.tables / f"{table}.json")

    def record_table(self, table: str, app_id: str, batch_id: int, version: int) -> None:
        write_json(self.tables / f"{table}.json", {"app_id": app_id, "batch_id": batch_id, "version": version})

    def begin(self, batch_id: int) -> None:
        """Mark this run's batch in flight. Called before `may_write`: a run that takes over and
        then finds no marker knows that any later batch of an older body will see it is not the owner."""
        write_json(self._marker(self.run), {"batch_id": batch_id, "pid": os.getpid(), "since": time.time()})

    def end(self) -> None:
        with contextlib.suppress(OSError):
            self._marker(self.run).unlink()

    def may_write(self) -> bool:
        """Does this body's run own the checkpoint? (No after a clean stop, once a newer run took over,
        or once the checkpoint is gone: a reset while the engine kept a query of it.)"""
        owner = read_json(self.owner_marker)
        return owner is not None and owner.get("run") == self.run

    # -- the run's side
    def take_over(self) -> None:
        """Make this run the owner: an older run's body (its query still on the engine) starts no new batch."""
        write_json(self.owner_marker, {"run": self.run, "pid": os.getpid(), "since": time.time()})

    def request_stop(self) -> None:
        """A clean stop: no body starts a new batch; the one in flight finishes."""
        write_json(self.owner_marker, {"run": None, "pid": os.getpid(), "since": time.time()})

    def in_flight(self, mine: bool) -> list[dict[str, Any]]:
        """The batches being written by this run's body (`mine`) or by older runs' bodies."""
        found = []
        for path in self.writing.glob("*.json"):
            if (path.stem == self.run) == mine and (marker := read_json(path)) is not None:
                found.append(marker)
        return found

    def wait_idle(self, timeout_s: float, mine: bool = True, poll_s: float = 0.05) -> bool:
        """Wait until no batch of this run (or, `mine=False`, of older runs) is being written;
        False if one still is after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight(mine):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def forget_others(self) -> None:
        """Drop older runs' markers once this run's query runs (theirs have ended: a killed engine or
        process leaves its marker behind), and the files of earlier releases (`stop`, `inflight`)."""
        for path in self.writing.glob("*.json"):
            if path.stem != self.run:
                with contextlib.suppress(OSError):
                    path.unlink()
        for legacy in ("stop", "inflight"):
            with contextlib.suppress(OSError):
                (self.root / legacy).unlink()

    def last_reported(self) -> int:
        """The newest batch id reported so far (-1 when none)."""
        names = sorted(self.batches.glob("*.json"))
        return int(names[-1].stem) if names else -1

    def reports_after(self, batch_id: int) -> list[dict[str, Any]]:
        """Reports of batches newer than `batch_id`, oldest first."""
        out = []
        for path in sorted(self.batches.glob("*.json")):
            if int(path.stem) > batch_id:
                report = read_json(path)
                if report is not None:
                    out.append(report)
        return out

    def _marker(self, run: str) -> Path:
        return self.writing / f"{run}.json"
