"""Ports chosen for local services are different from each other and from the ones a service recorded.

A local broker once failed to format its storage because both of its listeners had got the same
port: the kernel gave the port one bind had just released to the next bind.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.runtime import processes


class _ReusingKernel:
    """Binds to port 0 the way that failure did: the last port released is handed out again first."""

    def __init__(self) -> None:
        self.bound: set[int] = set()
        self.released: list[int] = []
        self.fresh = itertools.count(41000)

    def socket(self, *_args: Any) -> _Socket:
        return _Socket(self)


class _Socket:
    def __init__(self, kernel: _ReusingKernel) -> None:
        self.kernel, self.port = kernel, 0

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.kernel.bound.discard(self.port)
        self.kernel.released.append(self.port)

    def bind(self, address: tuple[str, int]) -> None:
        free = [p for p in self.kernel.released if p not in self.kernel.bound]
        self.port = free[-1] if free else next(self.kernel.fresh)
        self.kernel.bound.add(self.port)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


@pytest.fixture
def reusing_kernel(monkeypatch: pytest.MonkeyPatch) -> _ReusingKernel:
    kernel = _ReusingKernel()
    monkeypatch.setattr(processes.socket, "socket", kernel.socket)
    return kernel


def test_ports_chosen_together_differ_even_when_the_kernel_reuses_a_released_port(reusing_kernel) -> None:
    ports = processes.free_ports(4)
    assert len(set(ports)) == 4
    assert not reusing_kernel.bound  # every socket was closed once the ports were chosen


def test_ports_a_service_recorded_are_not_chosen_again(reusing_kernel) -> None:
    first = processes.free_ports(2)
    assert set(processes.free_ports(2, taken=first)).isdisjoint(first)


def test_a_new_broker_gets_a_port_per_listener_and_a_secure_restart_keeps_the_first_ones(tmp_path, reusing_kernel):
    plain = local_kafka._broker_record(tmp_path, secure=False)["ports"]
    assert set(plain) == {"PLAINTEXT", "CONTROLLER"} and plain["PLAINTEXT"] != plain["CONTROLLER"]
    secure = local_kafka._broker_record(tmp_path, secure=True)["ports"]
    assert {k: secure[k] for k in plain} == plain  # the controller's port is written into the storage
    assert len(set(secure.values())) == 4
    assert json.loads((tmp_path / local_kafka.BROKER_FILE).read_text())["ports"] == secure


def test_real_sockets_give_different_ports_that_are_free_after_the_call() -> None:
    ports = processes.free_ports(16)
    assert len(set(ports)) == 16
    assert all(processes.port_free(port) for port in ports)
