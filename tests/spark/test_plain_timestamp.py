"""`riverhouse_plain_timestamp` (jvm/src/riverhouse/json/PlainTimestamp.java) against the parse's rules.

It reads only the plain ISO 8601 form and answers NULL for any other text, which the rules then
read: wherever it gives a value, the value must be the one the rules give (Spark's own cast), in
any session time zone, and the rules must still decide everything else.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import functions as F

from riverhouse.platform.ingest import parse
from riverhouse.platform.spec import parse_spec
from tests.conftest import orders_spec_data
from tests.spark.json_jar import NEEDS_JSON_JAR

pytestmark = NEEDS_JSON_JAR

# Each text with the UTC instant it names (as Spark's cast reads it), or None where the function
# must leave it to the rules (they may still read it, or refuse it).
NAMED = {
    "2026-01-02T03:04:05Z": "2026-01-02 03:04:05",
    "2026-01-02 03:04:05Z": "2026-01-02 03:04:05",
    "2026-01-02T03:04:05.678Z": "2026-01-02 03:04:05.678",
    "2026-01-02T03:04:05.1234567Z": "2026-01-02 03:04:05.123456",  # truncated to microseconds, as Spark does
    "2026-01-02T03:04:05.123456789+01:00": "2026-01-02 02:04:05.123456",
    "2026-01-02T00:30:00-05:30": "2026-01-02 06:00:00",
    "2026-01-02T03:04:05+18:00": "2026-01-01 09:04:05",
    "2026-01-02T03:04:05-00:00": "2026-01-02 03:04:05",
    "2024-02-29T23:59:59.999999Z": "2024-02-29 23:59:59.999999",  # a leap day
    "0001-01-01T00:00:00Z": "0001-01-01 00:00:00",
    "1969-12-31T23:59:59.5Z": "1969-12-31 23:59:59.5",  # before 1970, a fraction
    "2025-02-29T00:00:00Z": None,  # no such day: the rules' cast refuses it
    "2026-01-02T24:00:00Z": None,
    "2026-01-02T03:60:00Z": None,
    "2026-01-02T03:04:60Z": None,  # a leap second
    "2026-01-02T03:04:05+18:30": None,  # beyond 18 hours
    "2026-01-02T03:04:05+01:60": None,
    "2026-01-02T03:04:05.Z": None,
    "2026-01-02T03:04:05.1234567890Z": None,  # ten digits of fraction
    "2026-01-02T03:04:05": None,  # no zone: the session's, which the rules apply
    "2026-01-02T03:04:05 UTC": None,
    "2026-01-02T03:04:05 BST": None,  # an abbreviation: the rules refuse it
    "2026-01-02T03:04:05 Europe/London": None,
    "2026-01-02T03:04:05+0100": None,
    "2026-01-02T03:04:05+01": None,
    "2026-1-02T03:04:05Z": None,
    "2026-01-02t03:04:05Z": None,
    "2026-01-02T03:04:05z": None,
    " 2026-01-02T03:04:05Z": None,  # padding: Spark trims it, the rules read it
    "2026-01-02T03:04:05Z\n": None,
    "+2026-01-02T03:04:05Z": None,
    "12026-01-02T03:04:05Z": None,
    "2026-01-02T03:04:05ZZ": None,
    "2026-01-02T03:04:05\u00e9": None,
    "1767323045678": None,  # epoch digits: the rules' own path
    "03:04:05": None,
    "": None,
}


def _created_at() -> Any:
    return parse_spec(orders_spec_data("orders")).sources["orders"].field("created_at")


def _answers(spark: Any, texts: list[str]) -> list[Any]:
    rows = (
        spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
        .select(
            "i",
            F.unix_micros(F.call_function(parse.PLAIN_TIMESTAMP, F.col("t"))).alias("plain"),
            F.unix_micros(parse._typed(F.col("t"), _created_at(), False)).alias("rules"),
            F.unix_micros(parse._typed(F.col("t"), _created_at(), True)).alias("typed"),
        )
        .orderBy("i")
        .collect()
    )
    return [(r["plain"], r["rules"], r["typed"]) for r in rows]


def test_the_plain_form_reads_as_spark_reads_it_and_every_other_text_is_left_to_the_rules(spark: Any) -> None:
    texts = list(NAMED)
    answers = _answers(spark, texts)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    expected = {
        t: None if v is None else (datetime.fromisoformat(v).replace(tzinfo=UTC) - epoch) // timedelta(microseconds=1)
        for t, v in NAMED.items()
    }
    assert {t: plain for t, (plain, _, _) in zip(texts, answers, strict=True)} == expected
    for text, (plain, rules, typed) in zip(texts, answers, strict=True):
        assert typed == rules, text  # the parse's value is the rules' value, with or without the function
        if plain is not None:
            assert plain == rules, text
    # Texts it leaves alone that the rules still read (padding, no zone, a region) or refuse.
    left = [rules for (plain, rules, _) in answers if plain is None]
    assert sum(r is not None for r in left) >= 5 and sum(r is None for r in left) >= 15


def _random_text(rng: random.Random) -> str:
    def two(limit: int) -> str:
        return f"{rng.randrange(limit):02d}"

    fraction = "" if rng.random() < 0.3 else "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 10)))
    zone = rng.choice(["Z", "Z", f"{rng.choice('+-')}{two(20)}:{two(62)}", "", " UTC", "+0100", "z", "Z "])
    text = f"{rng.randrange(10000):04d}-{two(14)}-{two(33)}{rng.choice('T T')}{two(25)}:{two(61)}:{two(62)}{fraction}{zone}"
    if rng.random() < 0.15:  # a character changed, dropped or added anywhere
        at = rng.randrange(len(text))
        text = text[:at] + rng.choice(["", "0", "9", "-", ":", ".", "T", " ", "\x00", "\u00e9"]) + text[at + 1 :]
    return text


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_random_texts_get_the_rules_value_in_any_session_time_zone(spark: Any, zone: str) -> None:
    """3,000 texts near the plain form (seeded: fields in and out of range, fractions of 0-10
    digits, offsets, other zones, one character changed): wherever the function gives a value it
    is the rules' value, and the parse's value is the rules' value everywhere."""
    rng = random.Random(20261207)
    texts = [_random_text(rng) for _ in range(3000)]
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        answers = _answers(spark, texts)
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    differing = [
        (t, a) for t, a in zip(texts, answers, strict=True) if a[2] != a[1] or (a[0] is not None and a[0] != a[1])
    ]
    assert differing == [], differing[:5]
    read = sum(plain is not None for plain, _, _ in answers)
    refused_by_rules = sum(rules is None for _, rules, _ in answers)
    assert read > 300 and refused_by_rules > 1000, (read, refused_by_rules)  # both sides are reached
