"""Issue 27, item 1, Spark's side: a spec query's analyzed plan is checked before it runs, on a classic
SparkSession and through Spark Connect alike (the last test runs the module on the other kind).

The allow-list passed SQL that Spark ran as something else: sqlglot wrote a date unit's literal
text back unquoted, so `datediff('<payload>', ...)` reached Spark as a call of java_method. The
text check now refuses that input (tests/unit/test_hardening.py); these tests give the plan
check the SQL main generated for it, and more, and show that it is refused (and logged as an
allow-list bug) before anything runs, while every documented function still passes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.gold.evaluate import evaluate
from riverhouse.platform.gold.plan_guard import SpecQueryRefused, check_spec_query
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.sql import compile_query
from riverhouse.platform.state.tables import silver_schema, spark_schema
from tests.conftest import CONNECT_CLIENT_ENV, TEST_ENGINE
from tests.spark.test_gold_sql_allowlist import DOCUMENTED_CALLS, FIELDS, QUERY, WINDOWS

pytestmark = pytest.mark.spark
OTHER_KIND_RUN = "RIVERHOUSE_TEST_PLAN_GUARD_OTHER_KIND"  # set in the run on the other kind of session

VIEW_SCHEMA = (
    "o__order_id string, o__user_id string, o__amount int, o__price double, o__created_at timestamp, "
    "u__user_id string, u__name string"
)
# What main's compile_query generated for the issue's input (a datediff unit holding SQL): it passed the allow-list.
ISSUE_PROJECTION = (
    "DATEDIFF(DAY, `O__CREATED_AT`, `O__CREATED_AT`) + "
    'LENGTH(JAVA_METHOD(CONCAT(LOWER("JAVA.LANG."), INITCAP(LOWER("SYSTEM"))), LOWER("GETENV"), "HOME")) + '
    "DATEDIFF(DAY, `o__created_at`, `o__created_at`)"
)


@pytest.fixture(scope="module")
def session(spark: Any) -> Any:
    """The test session's Spark: a Spark Connect client of the shared engine by default, a classic
    in-process session with RIVERHOUSE_TEST_ENGINE=local; `test_the_same_checks_hold_on_the_other_kind`
    runs this module again on the other kind."""
    assert type(spark).__module__.startswith("pyspark.sql.connect") == TEST_ENGINE
    return spark


def view_of(session: Any, rows: list[tuple[Any, ...]] | None = None) -> Any:
    ts = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    frame = session.createDataFrame(
        rows if rows is not None else [("o12", "u1", 12, 2.5, ts, "u1", "ana")], VIEW_SCHEMA
    )
    name = f"rh_guard_test_{uuid.uuid4().hex[:8]}"
    frame.createOrReplaceTempView(name)
    return frame, name


def check(session: Any, select: str) -> None:
    frame, view = view_of(session)
    check_spec_query(session, f"SELECT {select} FROM `{view}`", view, frame, "guard_test", uuid.uuid4().hex)


def test_the_issues_query_is_refused_before_it_runs_and_logged_as_a_bug(
    session: Any, caplog: pytest.LogCaptureFixture
) -> None:
    spec = parse_spec(
        {
            "name": "guard_test",
            "sources": {
                "orders": {
                    "topic": "orders",
                    "fields": {"order_id": "string", "user_id": "string", "created_at": "timestamp"},
                    "key": ["order_id"],
                },
                "users": {"topic": "users", "fields": {"user_id": "string", "name": "string"}, "key": ["user_id"]},
            },
            "query": "SELECT o.order_id, u.name FROM orders o LEFT JOIN users u ON o.user_id = u.user_id",
            "sink": {"table": "out", "order_by": ["order_id"]},
        }
    )
    plan = dataclasses.replace(spec.plan, projections=(*spec.plan.projections, ("leak", ISSUE_PROJECTION)))

    def empty(source: str) -> Any:
        return session.createDataFrame([], spark_schema(silver_schema(spec.sources[source])))

    with caplog.at_level(logging.ERROR, logger="riverhouse.plan_guard"), pytest.raises(SpecQueryRefused) as info:
        evaluate(session, spec, plan, empty("orders"), {"u": empty("users")}, [])
    assert "calls java_method()" in str(info.value) and "Riverhouse bug" in str(info.value)
    assert "BUG in the spec SQL allow-list" in caplog.text and "guard_test" in caplog.text


@pytest.mark.parametrize(
    ("select", "finding"),
    [
        ("reflect('java.lang.System', 'getenv', 'HOME') AS x", "calls reflect()"),
        ("try_reflect('java.lang.System', 'getenv', 'HOME') AS x", "calls try_reflect()"),
        ("length(java_method('java.lang.System', 'getProperty', 'user.home')) AS x", "calls java_method()"),
        ("input_file_name() AS x", "calls input_file_name()"),
        ("current_user() AS x", "calls current_user()"),
        ("(SELECT max(id) FROM range(3)) AS x", "operator"),  # a relation that is not the view
        # Past Spark's default of 25 printed fields ("... N more fields"): the guard prints them all.
        (", ".join(f"`o__amount` + {i} AS c{i}" for i in range(40)) + ", reflect('java.lang.Math', 'abs', -1) AS x",
         "calls reflect()"),
    ],
)  # fmt: skip
def test_plans_that_call_java_or_read_files_or_the_environment_are_refused(
    own_spark: Any, select: str, finding: str
) -> None:
    session = own_spark  # the setting below must not reach other processes' sessions
    session.conf.set("spark.sql.debug.maxToStringFields", "25")  # Spark's default: the guard raises it
    with pytest.raises(SpecQueryRefused, match="refused before it ran") as info:
        check(session, select)
    assert finding in str(info.value)


def test_every_allowed_query_passes_the_plan_check(session: Any) -> None:
    select = ", ".join(f"{call} AS f{i}" for i, call in enumerate(DOCUMENTED_CALLS))
    for query in (QUERY, f"SELECT o.order_id, {select} FROM orders o LEFT JOIN users u ON o.user_id = u.user_id"):
        plan = compile_query(query, FIELDS, WINDOWS, set(), [])
        projections = ", ".join(f"{expr} AS `{name}`" for name, expr in plan.projections)
        where = f"COALESCE(({plan.where}), false)" if plan.where else "true"
        check(session, f"{projections}, {where} AS _where_ok")  # no SpecQueryRefused


def test_nothing_is_evaluated_while_the_plan_is_checked(session: Any) -> None:
    """EXPLAIN optimizes, and Spark's optimizer evaluates a projection over local rows: the guard
    explains the query over an empty view, so a refused call never runs, not even while checking."""
    frame, view = view_of(session)
    probe = "raise_error('the guard evaluated the query')"
    check_spec_query(session, f"SELECT {probe} AS x FROM `{view}`", view, frame, "guard_test", uuid.uuid4().hex)
    with pytest.raises(Exception, match="the guard evaluated the query"):
        session.sql(f"SELECT {probe} AS x FROM `{view}`").collect()  # the same query over the rows does run it


@pytest.mark.skipif(os.environ.get(OTHER_KIND_RUN) is not None, reason="this is the run on the other kind")
def test_the_same_checks_hold_on_the_other_kind_of_session(tmp_path: Path) -> None:
    """Every test above again, in a fresh process on the other kind of session: classic when this
    run is on Spark Connect, Spark Connect (an engine of its own) when this run is classic."""
    env = {k: v for k, v in os.environ.items() if k not in (*CONNECT_CLIENT_ENV, "RIVERHOUSE_SPARK_REMOTE")}
    env |= {"RIVERHOUSE_TEST_ENGINE": "local" if TEST_ENGINE else "connect", OTHER_KIND_RUN: "1"}
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-k", "not other_kind"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1500, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) >= 10 and "skipped" not in done.stdout, done.stdout[-2000:]
