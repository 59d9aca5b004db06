"""Spec SQL on Spark (issue 19 item 2): what the allow-list admits runs as Spark SQL; what Spark
itself would allow and the allow-list refuses (reflect, java_method, file relations) stays out.

Spark 4.2 has no setting that disables reflect()/java_method() (checked: they run in a plain
session), so the allow-list is the barrier for those; SQL on files is also turned off in every
Riverhouse session (`spark.sql.runSQLOnFiles=false`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from riverhouse.platform.sql import QueryError, compile_query, flat
from riverhouse.platform.state.settings import RESTRICTED_SPARK_CONF, Settings

pytestmark = pytest.mark.spark

FIELDS = {"orders": ["order_id", "user_id", "amount", "price", "created_at"], "users": ["user_id", "name"]}
WINDOWS = {"orders": timedelta(hours=1), "users": timedelta(hours=1)}
QUERY = (
    "SELECT o.order_id, upper(trim(u.name)) AS name, "
    "CASE WHEN o.amount > 10 THEN 'big' ELSE 'small' END AS size, "
    "round(o.amount * o.price, 2) AS total, coalesce(u.name, 'unknown') AS who, "
    "concat(o.user_id, '-', o.order_id) AS ref, CAST(o.amount AS BIGINT) + 1 AS next_amount, "
    "date_trunc('hour', o.created_at) AS hour, to_date(o.created_at) AS day, "
    "date_format(o.created_at, 'yyyy-MM') AS month, o.created_at + INTERVAL 1 HOUR AS later, "
    "substr(o.order_id, 1, 2) AS prefix, length(o.order_id) AS n, abs(o.price - 20) AS dist, "
    "if(o.amount % 2 = 0, 'even', 'odd') AS parity, nvl(u.name, 'x') AS nv, lpad(o.user_id, 4, '0') AS padded "
    "FROM orders o LEFT JOIN users u ON o.user_id = u.user_id "
    "WHERE o.amount BETWEEN 1 AND 1000 AND o.order_id LIKE 'o%' AND o.user_id IN ('u1', 'u2')"
)


def test_allowed_query_runs_on_spark_with_the_expected_values(spark: Any) -> None:
    plan = compile_query(QUERY, FIELDS, WINDOWS, set(), [])
    ts = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    rows = [
        {
            flat("o", "order_id"): "o1",
            flat("o", "user_id"): "u1",
            flat("o", "amount"): 12,
            flat("o", "price"): 2.345,
            flat("o", "created_at"): ts,
            flat("u", "user_id"): "u1",
            flat("u", "name"): " ana ",
        },
        {
            flat("o", "order_id"): "x2",
            flat("o", "user_id"): "u2",
            flat("o", "amount"): 3,
            flat("o", "price"): 1.0,
            flat("o", "created_at"): ts,
            flat("u", "user_id"): None,
            flat("u", "name"): None,
        },
    ]
    schema = (
        "o__order_id string, o__user_id string, o__amount int, o__price double, o__created_at timestamp, "
        "u__user_id string, u__name string"
    )
    spark.createDataFrame([tuple(r.values()) for r in rows], schema).createOrReplaceTempView("rh_allowlist_test")
    projections = ", ".join(f"{expr} AS `{name}`" for name, expr in plan.projections)
    out = spark.sql(f"SELECT {projections}, ({plan.where}) AS ok FROM rh_allowlist_test ORDER BY order_id").collect()
    first, second = out[0].asDict(), out[1].asDict()
    assert (first["name"], first["size"], first["total"], first["who"], first["ref"]) == (
        "ANA",
        "big",
        28.14,
        " ana ",
        "u1-o1",
    )
    assert (first["next_amount"], first["prefix"], first["n"], first["parity"], first["padded"]) == (
        13,
        "o1",
        2,
        "even",
        "00u1",
    )
    assert first["month"] == "2026-01" and first["ok"] is True
    assert (second["who"], second["size"], second["ok"]) == ("unknown", "small", False)


def test_spark_would_run_reflect_so_the_allow_list_must_refuse_it(spark: Any) -> None:
    # The fact that makes the allow-list necessary: Spark 4.2 runs reflect() with no setting to stop it.
    assert spark.sql("SELECT java_method('java.lang.Math', 'abs', -3) AS x").collect()[0]["x"] == "3"
    for query in (
        "SELECT o.order_id, reflect('java.lang.System','getenv','KAFKA_PASSWORD') AS leak FROM orders o",
        "SELECT o.order_id FROM orders o WHERE java_method('java.lang.System','exit',0) IS NULL",
    ):
        with pytest.raises(QueryError, match="is not allowed"):
            compile_query(query, FIELDS, WINDOWS, set(), [])


def test_riverhouse_sessions_cannot_read_files_through_sql(spark: Any, tmp_path: Any) -> None:
    from riverhouse.platform.runtime.spark import get_spark

    (tmp_path / "secret.txt").write_text("secret\n")
    session = get_spark("local[2]", conf=Settings.from_env(tmp_path).spark_conf)
    assert session.conf.get("spark.sql.runSQLOnFiles") == RESTRICTED_SPARK_CONF["spark.sql.runSQLOnFiles"]
    with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
        session.sql(f"SELECT * FROM text.`{tmp_path / 'secret.txt'}`").collect()


# One call of every function docs/pipeline-spec.md lists under "What a query may use".
DOCUMENTED_CALLS = [
    "upper(o.order_id)", "lower(o.order_id)", "length(o.order_id)", "char_length(o.order_id)",
    "substr(o.order_id, 1, 2)", "substring(o.order_id, 1, 2)", "trim(o.order_id)", "ltrim(o.order_id)",
    "rtrim(o.order_id)", "concat(o.order_id, 'x')", "concat_ws('-', o.order_id, 'x')", "initcap(o.order_id)",
    "lpad(o.order_id, 5, '0')", "rpad(o.order_id, 5, '0')", "left(o.order_id, 1)", "right(o.order_id, 1)",
    "reverse(o.order_id)", "replace(o.order_id, 'o', 'O')", "translate(o.order_id, 'o', 'O')",
    "regexp_replace(o.order_id, 'o', 'O')", "regexp_extract(o.order_id, '([0-9]+)', 1)", "instr(o.order_id, '1')",
    "locate('1', o.order_id)", "split_part(o.order_id, '1', 1)", "repeat(o.order_id, 2)",
    "startswith(o.order_id, 'o')", "endswith(o.order_id, '1')", "contains(o.order_id, 'o')", "md5(o.order_id)",
    "sha1(o.order_id)", "sha2(o.order_id, 256)", "crc32(o.order_id)", "hex(o.order_id)", "unhex('4142')",
    "base64(o.order_id)", "abs(o.price)", "round(o.price, 1)", "bround(o.price, 1)", "floor(o.price)",
    "ceil(o.price)", "sqrt(o.price)", "pow(o.price, 2)", "ln(o.price)", "log(10, o.price)", "exp(o.price)",
    "sign(o.price)", "pmod(o.amount, 5)", "greatest(o.price, 1)", "least(o.price, 1)", "try_add(o.amount, 1)",
    "try_subtract(o.amount, 1)", "try_multiply(o.amount, 2)", "try_divide(o.amount, 0)", "isnan(o.price)",
    "nanvl(o.price, 0)", "format_number(o.price, 2)", "year(o.created_at)", "quarter(o.created_at)",
    "month(o.created_at)", "day(o.created_at)", "dayofmonth(o.created_at)", "dayofweek(o.created_at)",
    "dayofyear(o.created_at)", "weekofyear(o.created_at)", "hour(o.created_at)", "minute(o.created_at)",
    "second(o.created_at)", "date_trunc('hour', o.created_at)", "trunc(to_date(o.created_at), 'MM')",
    "to_date(o.created_at)", "to_timestamp('2026-01-02 03:04:05')", "date_add(o.created_at, 1)",
    "date_sub(o.created_at, 1)", "add_months(o.created_at, 1)", "datediff(o.created_at, o.created_at)",
    "last_day(o.created_at)", "date_format(o.created_at, 'yyyy-MM')", "unix_timestamp(o.created_at)",
    "from_unixtime(o.amount)", "unix_millis(o.created_at)", "unix_seconds(o.created_at)",
    "timestamp_millis(o.amount)", "timestamp_seconds(o.amount)", "make_date(2026, 1, 2)",
    "to_utc_timestamp(o.created_at, 'Europe/Paris')", "from_utc_timestamp(o.created_at, 'Europe/Paris')",
    "date_part('YEAR', o.created_at)", "coalesce(u.name, 'x')", "nvl(u.name, 'x')", "nvl2(u.name, 1, 2)",
    "nullif(o.order_id, 'x')", "ifnull(u.name, 'x')",
]  # fmt: skip


def test_every_documented_function_runs_on_spark(spark: Any) -> None:
    select = ", ".join(f"{call} AS f{i}" for i, call in enumerate(DOCUMENTED_CALLS))
    plan = compile_query(
        f"SELECT o.order_id, {select} FROM orders o LEFT JOIN users u ON o.user_id = u.user_id",
        FIELDS,
        WINDOWS,
        set(),
        [],
    )
    ts = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    spark.createDataFrame(
        [("o12", "u1", 12, 2.5, ts, "u1", "ana")],
        "o__order_id string, o__user_id string, o__amount int, o__price double, o__created_at timestamp, "
        "u__user_id string, u__name string",
    ).createOrReplaceTempView("rh_documented_functions")
    projections = ", ".join(f"{expr} AS `{name}`" for name, expr in plan.projections)
    row = spark.sql(f"SELECT {projections} FROM rh_documented_functions").collect()[0].asDict()
    assert len(row) == len(DOCUMENTED_CALLS) + 1
    assert (row["f0"], row["f9"], row["f24"]) == ("O12", "o12x", "o12o12")
