"""The class-data archive's training (runtime/archive_training.py) runs a first batch's work on an engine.

`make install` runs it on the engine that writes the archive, best effort: a training that broke
(a pyspark or Delta upgrade) would only leave the archive without those classes, silently. This
runs it on the shared test engine, from a process that is not a Spark Connect client yet (as
`riverhouse engine archive` is), and reads what it wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.runtime.engine import _CLIENT_ENV


def test_the_training_parses_deduplicates_and_appends_through_a_stream(
    test_engine: str | None, spark: Any, tmp_path: Path
) -> None:
    if not test_engine:
        pytest.skip("the training runs on an engine (Spark Connect)")
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV}
    code = "import sys; from pathlib import Path; from riverhouse.platform.runtime.archive_training import train; train(sys.argv[1], Path(sys.argv[2]))"
    done = subprocess.run(
        [sys.executable, "-c", code, test_engine, str(tmp_path / "training")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = spark.read.format("delta").load(str(tmp_path / "training" / "silver")).collect()
    # the first write: the last of 60 keys; the stream's batch: 30 more keys (its first 60 are known)
    expected = {f"k{j}": max(i for i in range(300) if i % 60 == j) for j in range(60)}
    expected |= {f"k{j}": max(i for i in range(300) if i % 90 == j) for j in range(60, 90)}
    assert {r["id"]: r["n"] for r in rows} == expected and len(rows) == 90
    commits = sorted((tmp_path / "training" / "silver" / "_delta_log").glob("*.json"))
    operations = [
        json.loads(line)["commitInfo"]["operation"]
        for c in commits
        for line in c.read_text().splitlines()
        if "commitInfo" in line
    ]
    assert operations == ["WRITE", "WRITE"]  # the stream's batch appended
    assert (tmp_path / "training" / "checkpoint" / "commits" / "0").is_file()  # the stream's batch committed
