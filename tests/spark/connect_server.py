"""A real Spark Connect server for tests, started from the installed pyspark and the pinned jars.

A small local stand-in until `riverhouse engine start` exists: the same command line the lead
verified (SparkConnectServer via spark-submit, Delta's extension and catalog), on a free loopback
port, stopped by its PID at the end of the test session.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from riverhouse.platform.runtime.jars import jars_root

START_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def spark_connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The `sc://` URL of a Spark Connect server of its own.

    A URL, not a session: pyspark picks classic or Connect functions per process (through
    SPARK_CONNECT_MODE_ENABLED), so a Connect session is used in a process of its own
    (see `run_through_connect`), never beside the classic `spark` fixture.
    """
    import pyspark

    home = Path(pyspark.__file__).parent
    connect_jar = home / "jars" / f"spark-connect_2.13-{pyspark.__version__}.jar"
    jars = sorted((jars_root() / "spark").glob("*.jar"))
    if not connect_jar.exists() or not jars:
        pytest.fail(f"Spark Connect needs {connect_jar} and the jars of {jars_root() / 'spark'} (make jars)")
    port = _free_port()
    log = tmp_path_factory.mktemp("spark-connect") / "server.log"
    every = [*map(str, jars), str(connect_jar)]
    command = [
        str(home / "bin" / "spark-submit"),
        *("--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]"),
        *("--jars", ",".join(every), "--driver-class-path", os.pathsep.join(every), "--driver-memory", "768m"),
        *(
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
        ),
        *("--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension"),
        *("--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog"),
        *("--conf", "spark.ui.enabled=false", "--conf", "spark.sql.session.timeZone=UTC"),
    ]
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable}
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Spark Connect server did not start; its log:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # spark-submit and its JVM: the group started above
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


REMOTE_VARIABLE = "RIVERHOUSE_TEST_SPARK_REMOTE"


def remote_url() -> str | None:
    """Set in the process `run_through_connect` starts: its tests use a Connect session."""
    return os.environ.get(REMOTE_VARIABLE) or None


def run_through_connect(test_file: str, url: str, deselect: str) -> subprocess.CompletedProcess[str]:
    """Run `test_file`'s tests (but `deselect`) again in a fresh Python process, on a Connect session at `url`."""
    env = {**os.environ, REMOTE_VARIABLE: url}
    command = [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-k", f"not {deselect}"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
