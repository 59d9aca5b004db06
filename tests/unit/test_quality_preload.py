"""Great Expectations is imported in the background before a triggered run's checks need it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_SCRIPT = """
import importlib.abc
import sys
import threading
from riverhouse.platform.pipeline import Pipeline  # what a Dagster step imports: GX is not among it
from riverhouse.platform.quality import expectations
assert "great_expectations" not in sys.modules, "imported before the preload"

gate = threading.Event()


class HoldGreatExpectations(importlib.abc.MetaPathFinder):
    # GX's import waits here until the test lets it go: a preload that waited for it would hang.
    def find_spec(self, name, path, target=None):
        if name == "great_expectations":
            gate.wait(30)
        return None


sys.meta_path.insert(0, HoldGreatExpectations())
expectations.preload()
assert not gate.is_set() and expectations._PRELOADING[0].is_alive(), "preload waited for the import"
assert "great_expectations" not in sys.modules
gate.set()
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


_DEFERRED_SCRIPT = """
import sys
import pyarrow as pa
from riverhouse.platform.quality import expectations

gx = expectations._gx()
rows = pa.table({"_status": ["ok"] * 99 + ["rejected"], "a": list(range(100)), "b": list(range(100))})
outcome = expectations.validate(
    rows,
    [
        gx.expectations.ExpectColumnValuesToBeInSet(column="_status", value_set=["ok"], mostly=0.95),
        gx.expectations.ExpectColumnPairValuesToBeEqual(column_A="a", column_B="b"),
        gx.expectations.ExpectColumnValuesToBeBetween(column="a", min_value=0, max_value=49),
    ],
    "deferred",
)
# The suite ran, and its outcome is GX's: 50 values of `a` lie above 49.
assert [o.success for o in outcome.outcomes] == [True, True, False], outcome.outcomes
assert outcome.outcomes[2].unexpected_count == 50, outcome.outcomes[2]
# scipy.stats and altair were found but not run: still lazy (their type changes once loaded).
assert all(type(sys.modules[m]).__name__ == "_LazyModule" for m in ("scipy.stats", "altair"))
assert sys.meta_path.count(expectations._DEFERRED_FINDER) == 0  # the finder was there for GX's import only
# First use runs the module: it works as if it had been imported at once.
from scipy import stats
assert abs(stats.norm.cdf(0.0) - 0.5) < 1e-12
assert type(sys.modules["scipy.stats"]).__name__ == "module"
print("ok")
"""


def test_great_expectations_defers_scipy_stats_and_altair_until_used() -> None:
    proc = subprocess.run([sys.executable, "-c", _DEFERRED_SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


_RACE_SCRIPT = """
import sys
import time
import sqlalchemy as db
from riverhouse.platform.pipeline import Pipeline  # noqa: F401 - what a Dagster step has imported
from riverhouse.platform.quality import expectations
assert "sqlalchemy.orm" not in sys.modules
expectations.preload()
thread = expectations._PRELOADING[0]
while thread.is_alive():
    db.select(1)  # what Dagster's event storage builds on the step's thread meanwhile
    time.sleep(0.001)  # the import goes on between statements (a spinning loop slowed it 10x)
assert "great_expectations" in sys.modules
print("ok")
"""


def test_statements_built_while_great_expectations_imports_do_not_meet_a_half_imported_orm() -> None:
    # A resident query's ingest step ended while GX was importing; Dagster's storage then built a
    # statement and the step failed on SQLAlchemy's half-initialised ORM (bench/analysis.md).
    proc = subprocess.run([sys.executable, "-c", _RACE_SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
