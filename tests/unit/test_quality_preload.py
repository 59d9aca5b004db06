"""Great Expectations is imported in the background before a triggered run's checks need it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_SCRIPT = """
import sys
import time
from riverhouse.platform.pipeline import Pipeline  # what a Dagster step imports: GX is not among it
from riverhouse.platform.quality import expectations
assert "great_expectations" not in sys.modules, "imported before the preload"
started = time.monotonic()
expectations.preload()
assert time.monotonic() - started < 0.5, "preload waited for the import"  # it takes seconds
expectations.preload()  # once per process
assert len(expectations._PRELOADING) == 1
expectations._PRELOADING[0].join(120)
assert "great_expectations" in sys.modules
gx = expectations._gx()  # the checks' own import finds it done
assert gx.expectations.ExpectColumnValuesToNotBeNull(column="x").column == "x"
print("ok")
"""


def test_preload_imports_great_expectations_once_in_the_background() -> None:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
