"""How a run stops its queries after one failed, without an engine: a batch whose body died (its
worker killed mid-batch) leaves its in-flight marker behind forever, so a stop must not wait for it.

The query here is a stand-in with the two calls a stop makes (`isActive`, `stop()`): the rules
under test are the run's, not Spark's. The crash tests (test_crash.py, test_join_crash.py) kill
real batch bodies on the engine.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from riverhouse.platform.ingest import stream as stream_module
from riverhouse.platform.ingest.stream import SourceStream, _stop_all, prepare_stream
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.state.settings import Settings
from tests.conftest import orders_spec_data


class Query:
    def __init__(self, active: bool) -> None:
        self.isActive = active
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1
        self.isActive = False


def _stream(tmp_path: Path, name: str) -> SourceStream:
    spec = parse_spec(orders_spec_data("t_stop", name=name))
    settings = Settings.from_env(tmp_path / "home").with_(kafka_bootstrap="127.0.0.1:9")
    return prepare_stream(spec, settings, "orders")


def test_the_failed_query_is_stopped_at_once_and_the_others_cleanly(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(stream_module, "STOP_WAIT_S", 60.0)
    failed, other = _stream(tmp_path, "failed_one"), _stream(tmp_path, "other_one")
    for stream in (failed, other):
        stream.channel.take_over()
    failed.channel.begin(2)  # its body was killed writing batch 2: the marker stays
    # The engine may still list the failed query as active when its failure reaches the run.
    queries = [Query(active=True), Query(active=True)]
    started = time.monotonic()
    _stop_all([(failed, queries[0]), (other, queries[1])], failed=failed)
    assert time.monotonic() - started < 5  # not the 60 s a clean stop may wait for a live batch
    assert queries[0].stopped == 1 and queries[1].stopped == 1
    assert not other.channel.may_write()  # the other one was asked to start no new batch first
    assert failed.channel.in_flight(mine=True)  # the dead body's marker is left for the next run


def test_a_clean_stop_waits_for_the_batch_in_flight_only_while_its_query_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(stream_module, "STOP_WAIT_S", 60.0)
    stream = _stream(tmp_path, "ended_one")
    stream.channel.take_over()
    stream.channel.begin(5)
    query = Query(active=False)  # it ended (failed) with its batch's marker still there
    started = time.monotonic()
    stream.stop(query)
    assert time.monotonic() - started < 5 and query.stopped == 1

    # A live query's batch in flight is waited for: it ends, then the query is stopped.
    live = _stream(tmp_path, "live_one")
    live.channel.take_over()
    live.channel.begin(7)
    monkeypatch.setattr(stream_module, "STOP_POLL_S", 0.2)
    query = Query(active=True)
    waited: list[float] = []

    def stop_after_the_batch() -> None:
        waited.append(time.monotonic() - started)
        query.isActive = False

    query.stop = stop_after_the_batch  # type: ignore[method-assign]
    started = time.monotonic()
    finish = threading.Timer(1.5, live.channel.end)
    finish.start()
    live.stop(query)
    finish.join()
    assert waited and waited[0] >= 1.4  # stopped only once the batch's marker was gone
