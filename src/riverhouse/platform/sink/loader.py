"""A pipeline's ClickHouse loads: one loader per pipeline at a time, with its metrics pushed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from functools import partial
from typing import Any

from riverhouse.platform.kafka.lag import pipeline_lag
from riverhouse.platform.runtime import metrics
from riverhouse.platform.sink.clickhouse import ClickHouseLoadError, open_client, sink_table_path
from riverhouse.platform.sink.versions import LoadResult, load_new_versions
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import sink_lock
from riverhouse.platform.state.settings import Settings


def load_sink(
    spec: PipelineSpec,
    settings: Settings,
    log: Callable[[str], None] | None = None,
    client: Any = None,
) -> LoadResult:
    """Load new Delta versions into ClickHouse, one loader per pipeline at a time."""
    began = time.monotonic()
    try:
        with sink_lock(settings, spec.name, log):
            result = load_new_versions(
                spec,
                settings.clickhouse_dsn,
                sink_table_path(spec, settings.warehouse),
                log=log,
                client=client,
            )
    except ClickHouseLoadError:
        metrics.observe_load_error(spec.name)
        metrics.push(spec, partial(pipeline_lag, spec, settings))
        raise
    metrics.observe_load(spec.name, result.rows_loaded, time.monotonic() - began, result.last_loaded_version)
    metrics.push(spec, partial(pipeline_lag, spec, settings))
    return result


class SinkLoader:
    """A run's ClickHouse loads, on one thread that owns the connection.

    Loading a batch while Spark is still finishing the run (its commit log, the next
    batch) is the same exactly-once load as loading after it: the loader reads only
    committed Delta versions and the ClickHouse ledger (continuous mode has always
    loaded alongside its queries). The connection is held for the run, as continuous
    mode holds it for its session (with embedded chDB, no other process can open the
    same path meanwhile).
    """

    def __init__(self, spec: PipelineSpec, settings: Settings, log: Callable[[str], None] | None):
        self.spec = spec
        self.settings = settings
        self.log = log
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="riverhouse-load")
        self._connecting: Future[Any] | None = None
        self._loads: list[Future[LoadResult]] = []
        self._client: Any = None
        self._connect_error: Exception | None = None
        self._connection = ExitStack()
        self._lock = threading.Lock()
        self._waiting = False  # a load is queued and has not started: a new request joins it

    def connect(self) -> None:
        """Open the connection now, in the background (it takes ~0.1 s with chDB)."""
        self._connecting = self._pool.submit(self._open)

    def load_soon(self) -> None:
        """Load whatever has committed by the time the loader thread gets to it."""
        with self._lock:
            if self._waiting:
                return
            self._waiting = True
        self._loads.append(self._pool.submit(self._load))

    def load_now(self) -> LoadResult:
        """Load whatever has committed, and wait for it."""
        return self._pool.submit(self._load).result()

    def finish(self, up_to: int | None) -> dict[str, Any]:
        """Wait for the loads under way, then load the rest unless they reached Delta version `up_to`.

        Raises the first error. Returns the run summary's load figures.
        """
        if self._connecting is not None:
            self._connecting.result()
        results = [load.result() for load in self._loads]
        if up_to is None or not results or results[-1].last_loaded_version != up_to:
            results.append(self.load_now())
        return {
            "clickhouse_rows_loaded": sum(r.rows_loaded for r in results),
            "delta_versions_loaded": sum(len(r.versions_loaded) for r in results),
            "last_loaded_version": results[-1].last_loaded_version,
            "load_seconds": round(sum(r.seconds for r in results), 3),
            "clickhouse_loads": len(results),
        }

    def close(self) -> None:
        """Let a load under way finish, then close the connection."""
        self._pool.submit(self._connection.close).result()
        self._pool.shutdown()

    def _open(self) -> Any:
        if self._connect_error is not None:  # retried once already (with backoff): say so again, fast
            raise self._connect_error
        if self._client is None:
            try:
                self._client = self._connection.enter_context(open_client(self.settings.clickhouse_dsn))
            except Exception as exc:
                self._connect_error = exc
                raise
        return self._client

    def _load(self) -> LoadResult:
        with self._lock:
            self._waiting = False
        return load_sink(self.spec, self.settings, self.log, client=self._open())
