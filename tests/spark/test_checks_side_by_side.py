"""Pipeline.run_checks: a step's checks run side by side on the pipeline's session."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.publish import CheckOutcome
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.state.settings import Settings
from tests.conftest import orders_spec_data

pytestmark = pytest.mark.spark


def pipeline(spark: Any, tmp_path: Path) -> Pipeline:
    settings = Settings.from_env(tmp_path / "home").with_(kafka_bootstrap=None)
    return Pipeline(parse_spec(orders_spec_data("orders")), settings, log=lambda m: None, spark=spark)


def test_checks_run_side_by_side_and_return_in_order(spark: Any, tmp_path: Path) -> None:
    """The first check runs on the caller's thread, the others on threads of their own, where the
    session answers queries; the results come back in the checks' order."""
    seen: dict[str, str] = {}
    both_running = threading.Barrier(2, timeout=30)

    def counting(name: str, rows: int) -> Any:
        def check() -> CheckOutcome:
            seen[name] = threading.current_thread().name
            both_running.wait()  # neither ends before the other started: side by side
            return CheckOutcome(spark.range(rows).count() == rows, {"rows": rows})

        return check

    outcomes = pipeline(spark, tmp_path).run_checks({"first": counting("first", 3), "second": counting("second", 5)})
    assert list(outcomes) == ["first", "second"]
    assert [o.metadata["rows"] for o in outcomes.values()] == [3, 5]
    assert all(o.passed for o in outcomes.values())
    assert seen["first"] == threading.current_thread().name
    assert seen["second"] != seen["first"]


def test_a_failing_check_is_raised_after_the_others_ended(spark: Any, tmp_path: Path) -> None:
    ended = threading.Event()

    def fails() -> CheckOutcome:
        raise RuntimeError("the suite could not run")

    def slow() -> CheckOutcome:
        time.sleep(0.5)
        ended.set()
        return CheckOutcome(True, {})

    with pytest.raises(RuntimeError, match="the suite could not run"):
        pipeline(spark, tmp_path).run_checks({"fails": fails, "slow": slow})
    assert ended.is_set()  # the step does not end while a check still queries the engine
