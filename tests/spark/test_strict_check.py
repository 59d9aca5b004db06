"""The one-pass strict check (jvm/src/riverhouse/json/StrictJson.java) against Spark's own strict parse.

The check only spares the variant parse: a record it is sure of must be one Spark's strict parse
accepts, and every record must get the same status, reason and values with it as without it.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from pyspark.sql import functions as F

from riverhouse.platform.ingest import parse
from riverhouse.platform.spec import parse_spec
from tests.conftest import orders_spec_data
from tests.spark.json_jar import NEEDS_JSON_JAR
from tests.spark.test_parse import good, kafka_rows

pytestmark = NEEDS_JSON_JAR

DEEP = '{"order_id":"o1","n":' + "[" * 70 + "1" + "]" * 70 + "}"
# Each text with what the check must answer: True only where it may skip Spark's strict parse.
TEXTS = {
    good().decode(): True,
    '{"a": {"b": [1, 2.5, -3e2, true, null, "x"]}, "c": {}}': True,
    "  [1, 2]  \n": True,
    '"just a string"': True,
    '{"order_id":"o1","order_id":"o2"}': False,  # a key twice
    '{"a":{"b":1,"b":2}}': False,  # a key twice, nested
    '{"a":[{"b":1},{"b":2,"b":3}]}': False,  # a key twice, in an array's object
    '{"a":1} {"a":2}': False,  # two records in one message
    '{"a":1} x': False,  # text after the record
    '{"a":1}}': False,
    '{"price": NaN}': False,  # not JSON (the variant's path reads it in its own way)
    '{"price": -Infinity}': False,
    '{"price": 1e999}': False,  # overflows a double
    '{"id": 123456789012345678901234567890}': False,  # beyond a long
    '{"user_id": "caf\\u00e9"}': False,  # an escape: the variant decides
    '{"user_id": "\\ud800"}': False,  # an unpaired surrogate, escaped
    "{'order_id': 'o1'}": False,  # single quotes
    '{"amount": 007}': False,  # leading zeros
    '{"a": 1, /* comment */ "b": 2}': False,
    '{"a": 1,}': False,  # a trailing comma
    "\ufeff" + good().decode(): False,  # a byte order mark
    DEEP: False,  # nesting deeper than the check follows
    "": False,
    "{": False,
}


def test_what_the_check_is_sure_of_spark_strict_parse_accepts(spark: Any) -> None:
    frame = spark.createDataFrame([(t,) for t in TEXTS], "t string")
    rows = frame.select(
        "t",
        parse._surely_strict(F.col("t"), parse.has_json_functions(spark)).alias("sure"),
        parse._strict_json(F.col("t")).isNotNull().alias("variant_accepts"),
    ).collect()
    answers = {r["t"]: (r["sure"], r["variant_accepts"]) for r in rows}
    assert {t: sure for t, (sure, _) in answers.items()} == TEXTS
    # Sure means Spark's strict parse accepts it too (the other way round is not asked).
    assert all(accepts for sure, accepts in answers.values() if sure)
    # And the refusals this check leaves to the variant are the variant's refusals as well.
    assert not any(answers[t][1] for t in ('{"a":{"b":1,"b":2}}', '{"a":1} {"a":2}', '{"user_id": "\\ud800"}'))


# Pieces a mutation puts into valid records: whitespace JSON does and does not allow, control
# characters, a byte order mark, comments, quotes, number forms, a key again, surrogates.
PIECES = [
    *("\ufeff", "\x00", "\x01", "\x0b", "\x0c", "\x7f", "\u00a0", "\u2028", " ", "\t", "\n", "\r"),
    *(",", ":", "{", "}", "[", "]", '"', "'", "/*x*/", "//c\n", "\\", "\\u00e9"),
    *("NaN", "Infinity", "-Infinity", "1e400", "1e-400", "9" * 25, "0001", "+1", ".5", "1.", "0x10", "1.5e"),
    *("tru", "nul", "true", "null", '""', "\U0001f600", "\\udc00", "é", '"a":1', '"order_id":"again"'),
]


def _mutated(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        at, roll = rng.randint(0, len(text)), rng.random()
        if roll < 0.55:
            text = text[:at] + rng.choice(PIECES) + text[at:]
        elif roll < 0.75:
            text = text[:at] + text[at + rng.randint(1, 3) :]
        elif roll < 0.85:
            text = text + rng.choice(PIECES)
        elif roll < 0.95:
            text = rng.choice(PIECES) + text
        else:
            text = text.replace('"amount":', '"amount":1,"amount":', 1)
    return text


def test_mutated_records_the_check_is_sure_of_are_ones_spark_strict_parse_accepts(spark: Any) -> None:
    """4,000 valid records, each broken at random in one to three places (seeded): wherever the
    check is sure, Spark's strict parse accepts the text too."""
    rng = random.Random(20261207)
    bases = [good().decode(), '{"a":{"b":[1,2,{"c":null}]},"d":true,"e":"x y","amount":5}', "[1,2.5,-3e2]"]
    texts = [_mutated(rng, rng.choice(bases)) for _ in range(4000)]
    frame = spark.createDataFrame([(t,) for t in texts], "t string")
    answers = frame.select(
        parse._surely_strict(F.col("t"), parse.has_json_functions(spark)).alias("sure"),
        parse._strict_json(F.col("t")).isNotNull().alias("accepts"),
    )
    counts = {(r["sure"], r["accepts"]): r["count"] for r in answers.groupBy("sure", "accepts").count().collect()}
    assert counts.get((True, False), 0) == 0, counts  # sure, yet Spark refuses: a record that would slip through
    # The mutations reach both sides: texts the check is sure of, and texts Spark refuses.
    assert counts.get((True, True), 0) > 400 and counts.get((False, False), 0) > 1000, counts


# A decimal field's value as a string with a comma, with spaces around the colon.
SPACED_COMMA = (
    b'{"order_id": "o1", "user_id": "u1", "amount": 2, "price" :\t "1,5", "created_at": "2026-01-02T03:04:05Z"}'
)


def _records() -> list[bytes]:
    nested = {"order_id": "o9", "user_id": "u1", "amount": 1, "price": 2.0, "created_at": "2026-01-02T03:04:05Z"}
    return [
        *[t.encode() for t in TEXTS],
        good(order_id=10000000.5),  # a number in a string field: its exact text comes from the variant
        good(order_id=12345678901234567.5),
        good(order_id=1.0),
        good(user_id={"x": 1}),  # JSON in a string field
        good(user_id="{not json"),
        good(user_id="caf\u00e9"),  # json.dumps escapes it: the variant's path
        good(price=float("nan")),
        good(price="12,5"),
        SPACED_COMMA,  # a decimal as a string with a comma, then one elsewhere
        good(price="1,234.50"),
        good(price="12.5"),
        good(user_id="a,b", price=3.25),
        good(created_at=1767323045678),
        json.dumps({**nested, "extra": {"deep": [{"k": 1}, {"k": 2}]}}).encode(),
        json.dumps({**nested, "extra": {"k": 1}}).encode()[:-1] + b',"extra": 2}',  # a key twice
        b'{"order_id": "o1", "amount": ',
        None,
    ]


def _parsed(spark: Any, src: Any) -> list[dict[str, Any]]:
    rows = parse.parse_records(kafka_rows(spark, _records()), src).orderBy("_offset").collect()
    return [r.asDict() for r in rows]


@pytest.mark.parametrize("price", ["double", "decimal(10,2)"])
def test_records_parse_the_same_with_and_without_the_check(
    spark: Any, monkeypatch: pytest.MonkeyPatch, price: str
) -> None:
    data = orders_spec_data("orders")
    data["sources"]["orders"]["fields"]["price"] = price
    src = parse_spec(data).sources["orders"]
    with_check = _parsed(spark, src)
    monkeypatch.setattr(parse, "has_json_functions", lambda spark: False)  # the variant for every record
    without = _parsed(spark, src)
    assert repr(with_check) == repr(without)  # repr: a NaN value equals itself
    statuses = [r["_status"] for r in with_check]
    assert statuses.count("ok") >= 8 and statuses.count("rejected") >= 20, statuses
    by_value = {r["_value"]: r for r in with_check}
    if price.startswith("decimal"):  # from_json would read "1,5" as 15: the comma rule quarantines it
        for value in (SPACED_COMMA, good(price="1,234.50"), good(price="12,5")):
            assert "a comma is neither a decimal point" in by_value[value]["_reason"], by_value[value]
        assert by_value[good(price="12.5")]["_status"] == "ok"  # a decimal's text without a comma
    assert by_value[good(user_id="a,b", price=3.25)]["_status"] == "ok"
