"""A client whose engine stopped answering waits once, then fails fast (runtime/engine_retry.py).

A real Spark Connect client against a port nothing listens on: gRPC's UNAVAILABLE, as when the
engine was killed. The waits are recorded instead of slept.
"""

from __future__ import annotations

import pytest

from riverhouse.platform.runtime import engine_retry
from riverhouse.platform.runtime.processes import free_port

pytestmark = pytest.mark.unit


def _client(monkeypatch: pytest.MonkeyPatch, waits: list[float]):
    from pyspark.sql.connect.client.core import SparkConnectClient
    from pyspark.sql.connect.client.retries import Retrying

    client = SparkConnectClient(f"sc://127.0.0.1:{free_port('127.0.0.1')}")
    client.set_retry_policies([engine_retry.engine_retry_policy()])
    monkeypatch.setattr(client, "_retrying", lambda: Retrying(client.get_retry_policies(), sleep=waits.append))
    return client


def _unavailable(client) -> None:
    with pytest.raises(Exception, match="UNAVAILABLE"):
        client.get_configs("spark.sql.session.timeZone")


def test_the_first_call_retries_then_every_later_call_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    client = _client(monkeypatch, waits)
    _unavailable(client)
    assert len(waits) == engine_retry.ENGINE_RETRIES  # the hiccup allowance, spent once
    assert max(waits) <= engine_retry.ENGINE_MAX_BACKOFF_MS / 1000 + 0.5  # capped backoff (+ jitter)
    waits.clear()
    _unavailable(client)
    _unavailable(client)
    assert waits == []  # given up: no second 25 s wait for the same dead engine


def test_each_client_gets_its_own_allowance(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    _unavailable(_client(monkeypatch, waits))
    waits.clear()
    _unavailable(_client(monkeypatch, waits))  # a new client (a new run) waits again
    assert len(waits) == engine_retry.ENGINE_RETRIES
