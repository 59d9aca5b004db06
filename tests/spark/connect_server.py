"""A real Spark Connect server for tests: the local engine (`riverhouse engine start`), in a folder of its own.

The plan guard must hold through Spark Connect as on a classic session; these helpers run a
test module's tests again in a fresh process whose session is a Connect client of that engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from riverhouse.platform.runtime import engine


@pytest.fixture(scope="session")
def spark_connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The `sc://` URL of a local engine started for the test session (stopped at its end).

    A URL, not a session: pyspark picks classic or Connect functions per process (through
    SPARK_CONNECT_MODE_ENABLED), so a Connect session is used in a process of its own
    (see `run_through_connect`), never beside the classic `spark` fixture.
    """
    state_dir = tmp_path_factory.mktemp("engine")
    state = engine.start(state_dir, master="local[2]", memory="1g")
    try:
        yield state.url
    finally:
        engine.stop(state_dir)


REMOTE_VARIABLE = "RIVERHOUSE_TEST_SPARK_REMOTE"


def remote_url() -> str | None:
    """Set in the process `run_through_connect` starts: its tests use a Connect session."""
    return os.environ.get(REMOTE_VARIABLE) or None


def run_through_connect(test_file: str, url: str, deselect: str) -> subprocess.CompletedProcess[str]:
    """Run `test_file`'s tests (but `deselect`) again in a fresh Python process, on a Connect session at `url`."""
    env = {**os.environ, REMOTE_VARIABLE: url}
    command = [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-k", f"not {deselect}"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
