"""`riverhouse_from_json` (jvm/src/riverhouse/json/FromJsonBytes.java) against Spark's own `from_json`.

It is `from_json` with Jackson reading the record's bytes instead of a reader over them: for every
valid UTF-8 text, with the options and schemas the parse uses, its row must be `from_json`'s.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from riverhouse.platform.ingest import parse
from riverhouse.platform.runtime.jars import JSON_EXTENSION
from tests.spark.json_jar import NEEDS_JSON_JAR
from tests.spark.test_strict_check import TEXTS, _mutated

pytestmark = NEEDS_JSON_JAR

OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": parse.CORRUPT, "allowSingleQuotes": "false"}
SCHEMAS = {
    "orders": StructType(
        [
            StructField("order_id", StringType()),
            StructField("user_id", StringType()),
            StructField("amount", LongType()),
            StructField("price", DoubleType()),
            StructField("created_at", StringType()),
            StructField(parse.CORRUPT, StringType()),
        ]
    ),
    "nested": StructType(
        [
            StructField("a", StructType([StructField("b", ArrayType(DoubleType())), StructField("c", StringType())])),
            StructField("d", MapType(StringType(), StringType())),
            StructField("e", DecimalType(10, 2)),
            StructField("amount", StringType()),
            StructField(parse.CORRUPT, StringType()),
        ]
    ),
}
# Where the bytes path must hand the record to Spark's reader: Jackson's encoding detection would
# read a zero byte among the first four as UTF-16 or UTF-32, and would skip a UTF-8 byte order mark.
EDGES = [
    "\x00" + '{"order_id":"o1"}',
    '{\x00"order_id":"o1"}',
    '{"\x00":1,"order_id":"o1"}',
    '{"a\x00":1}',
    "\x00\x00\x00{",
    "\ufeff" + '{"order_id":"o1"}',
    "\ufeff\ufeff{}",
    "{}",
    "[]",
    "1",
    " ",
    "",
    '{"order_id":"😀 é ü 中","user_id":"\\ud83d\\ude00"}',
    '{"order_id":"' + "x" * 20000 + '","amount":3}',
    '{"amount":' + "9" * 30 + "}",
    '{"a":{"b":[1,2.5,"3",null,true]},"d":{"k":1,"l":"m"},"e":"12.5"}',
    '{"a":{"b":"not an array"},"e":1e3,"amount":{"x":1}}',
]


def _texts() -> list[str]:
    rng = random.Random(20261208)
    bases = [next(iter(TEXTS)), '{"a":{"b":[1,2,{"c":null}]},"d":{"k":"v"},"e":"1.5","amount":5}', "[1,2.5,-3e2]"]
    return [*TEXTS, *EDGES, *[_mutated(rng, rng.choice(bases)) for _ in range(3000)]]


def test_riverhouse_sessions_have_the_extension_and_the_parse_uses_it(spark: Any) -> None:
    assert JSON_EXTENSION in spark.conf.get("spark.sql.extensions").split(",")
    registered = {r[0] for r in spark.sql("SHOW FUNCTIONS LIKE 'riverhouse*'").collect()}
    assert {parse.FROM_JSON_BYTES, parse.JSON_SURE} <= registered, registered
    assert parse.has_json_functions(spark)
    column = parse._from_json(F.col("t"), SCHEMAS["orders"], OPTIONS, parse.has_json_functions(spark))
    assert parse.FROM_JSON_BYTES in str(column)


@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_every_text_gets_the_row_from_json_gives_it(spark: Any, schema: str) -> None:
    """~3,000 texts (seeded mutations of valid records, the strict check's hostile ones, the encoding
    edges): the two parses' rows, corrupt-record column included, are equal for every one."""
    texts = _texts()
    frame = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
    struct = SCHEMAS[schema]
    compared = frame.select(
        "i",
        F.from_json("t", struct, OPTIONS).alias("spark"),
        F.call_function(parse.FROM_JSON_BYTES, F.col("t"), F.lit(struct.json()), F.lit(_options())).alias("ours"),
    )
    # As JSON text: a map is not comparable in Spark SQL; NaN renders as NaN on both sides.
    same = F.to_json("spark").eqNullSafe(F.to_json("ours"))
    differing = compared.where(~same).limit(5).collect()
    assert differing == [], [(texts[r["i"]][:80], r["spark"], r["ours"]) for r in differing]
    kinds = compared.select(
        F.count_if(F.col("spark").isNull()).alias("null"),
        F.count_if(F.col(f"spark.{parse.CORRUPT}").isNotNull()).alias("corrupt"),
        F.count_if(F.col(f"spark.{parse.CORRUPT}").isNull()).alias("parsed"),
    ).first()
    # The texts reach every outcome: parsed rows, corrupt records, and NULL (blank text) only rarely.
    assert kinds["null"] < 10 and kinds["corrupt"] > 500 and kinds["parsed"] > 300, kinds


def test_arguments_must_be_literals_of_the_right_form(spark: Any) -> None:
    frame = spark.createDataFrame([("{}",)], "t string")
    with pytest.raises(Exception, match="options_json must be a string literal"):
        frame.select(
            F.call_function(parse.FROM_JSON_BYTES, F.col("t"), F.lit(SCHEMAS["orders"].json()), F.col("t"))
        ).collect()


def _options() -> str:
    import json

    return json.dumps(OPTIONS, sort_keys=True)
