"""`riverhouse_repeated_key` (jvm/src/riverhouse/json/RepeatedKey.java) against the parse's SQL form.

Both name the first top-level key a record gives twice (NULL for none, or for text that is not a
JSON object); the function is the form the record rules take in whole-stage code.
"""

from __future__ import annotations

import random
from typing import Any

from pyspark.sql import functions as F

from riverhouse.platform.ingest import parse
from tests.spark.json_jar import NEEDS_JSON_JAR
from tests.spark.test_strict_check import TEXTS, _mutated

pytestmark = NEEDS_JSON_JAR

NAMED = {
    '{"a":1,"b":2,"a":3}': "a",
    '{"b":1,"a":2,"a":3,"b":4}': "b",  # the first key that appears again, not the first repeat
    '{"a":{"x":1,"x":2},"b":2}': None,  # repeated inside a nested object: not at the top level
    '{"a":[{"x":1},{"x":2}],"a":0}': "a",
    '{"caf\\u00e9":1,"café":2}': "café",  # the escaped and the plain spelling are one key
    '{"a":1,"A":2}': None,
    '{"a":1}{"a":2}': None,  # the keys of the first object only
    '["a","a"]': None,
    '{"a":1,"a":': None,  # broken: Spark's keys are NULL
    "": None,
}


def _both(spark: Any, texts: list[str]) -> list[tuple[Any, Any]]:
    rows = (
        spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
        .select(
            "i",
            parse._duplicate_key(F.col("t"), True).alias("function"),
            parse._duplicate_key(F.col("t"), False).alias("sql"),
        )
        .orderBy("i")
        .collect()
    )
    return [(r["function"], r["sql"]) for r in rows]


def test_the_function_names_the_key_the_sql_form_names(spark: Any) -> None:
    answers = _both(spark, list(NAMED))
    assert [sql for _, sql in answers] == list(NAMED.values())  # the SQL form, as the parse always read it
    assert [function for function, _ in answers] == list(NAMED.values())


def test_mutated_records_get_the_same_key_from_both(spark: Any) -> None:
    """3,000 records broken at random (seeded), a third of them made from ones with a key given again."""
    rng = random.Random(43)
    repeated = ['{"order_id":"o1","amount":1,"amount":2}', '{"a":1,"b":{"c":2},"b":3}', '{"b":1,"a":2,"a":3,"b":4}']
    texts = [_mutated(rng, rng.choice(repeated if i % 3 == 0 else list(TEXTS))) for i in range(3000)]
    answers = _both(spark, texts)
    differing = [(t, a) for t, a in zip(texts, answers, strict=True) if a[0] != a[1]]
    assert differing == [], differing[:5]
    assert sum(sql is not None for _, sql in answers) > 150  # repeated keys are among them


def _rules_in_whole_stage_code(spark: Any, fields: int) -> bool:
    from riverhouse.platform.spec import parse_spec
    from tests.conftest import orders_spec_data
    from tests.spark.test_parse import good, kafka_rows

    data = orders_spec_data("orders")
    data["sources"]["orders"]["fields"].update({f"extra_{i}": "string" for i in range(fields - 5)})
    src = parse_spec(data).sources["orders"]
    assert len(src.fields) == fields
    batch = kafka_rows(spark, [good()]).repartition(1)  # not a local relation the optimizer would fold
    frame = parse.parse_records(batch, src)
    if hasattr(frame, "_jdf"):  # an in-process session (RIVERHOUSE_TEST_ENGINE=local)
        plan = frame._jdf.queryExecution().executedPlan().toString()
    else:
        plan = frame._explain_string(mode="simple")
    [rules] = [line for line in plan.splitlines() if " AS _topic#" in line]
    return rules.lstrip(" +-:").startswith("*(")


def test_the_record_rules_run_in_whole_stage_code_unless_the_spec_is_too_wide_for_one_class(spark: Any) -> None:
    """Where the session's JVMs compile huge methods (the test engine, like every engine Riverhouse
    starts: runtime/huge_methods.py), a spec's rules run in whole-stage code; a spec wider than
    parse.WHOLE_STAGE_MAX_FIELDS keeps them out of it (their code outgrew one class at 36 fields)."""
    from riverhouse.platform.runtime.huge_methods import compiles_huge_methods

    assert compiles_huge_methods(spark)
    assert _rules_in_whole_stage_code(spark, 5)
    assert _rules_in_whole_stage_code(spark, parse.WHOLE_STAGE_MAX_FIELDS)
    assert not _rules_in_whole_stage_code(spark, parse.WHOLE_STAGE_MAX_FIELDS + 1)
