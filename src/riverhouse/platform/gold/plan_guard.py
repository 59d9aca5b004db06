"""Spark's side of the spec SQL check: the analyzed plan of a spec's query, inspected before it runs.

The allow-list (riverhouse.platform.sql) checks sqlglot's reading of the spec's SQL; Spark
runs its own reading of the text sqlglot generates. Where the two readings differ, the
allow-list can be passed by SQL that Spark runs as something else (issue 27: a date unit
written back unquoted let `java_method` through). So before a spec's query runs, Spark
analyzes it and this module reads the analyzed plan: any call of Java by reflection
(`reflect`, `java_method`, `try_reflect`), any Java invocation (`static_invoke`/`invoke`) of
a class outside Spark's own short list, anything that reads files or the environment
(`input_file_name`, `current_user`, ...), and any operator other than the projection over
the query's view is refused. A query that the allow-list passed and this check refuses is a
bug in the allow-list: it is logged as one, and the run stops before the query runs.

Works on a classic SparkSession and through Spark Connect alike (no `_jdf`/`_jvm`): the plan
comes from `EXPLAIN EXTENDED`, run as SQL. EXPLAIN also optimizes the plan, and Spark's
optimizer evaluates a projection over local rows (ConvertToLocalRelation), so the query is
explained over an empty view of the same schema: the same text over the same columns
analyzes to the same expressions, and no row is there to evaluate them on. The verdict is
kept per query text and schema, so a pipeline pays for it once per process.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from typing import Any

from riverhouse.platform.sql import ENVIRONMENT_CALLS, INVOKE_CALLS, JAVA_CALLS

logger = logging.getLogger("riverhouse.plan_guard")

# Classes whose static methods Spark's own SQL functions invoke (as printed: simple names).
SPARK_INVOKE_CLASSES = frozenset(
    {
        *("UrlCodec", "ExpressionImplUtils", "Encode", "Base64", "CharVarcharCodegenUtils", "DateTimeUtils"),
        *("StringUtils", "UTF8String", "CollationSupport", "IntervalUtils", "ToCharacterBuilder"),
    }
)
# Operators the analyzed plan of `SELECT <expressions> FROM <view>` consists of (the view, empty
# while checked, is a LocalRelation through Spark Connect and a LogicalRDD in a classic session).
PLAN_OPERATORS = frozenset({"Project", "Filter", "SubqueryAlias", "View", "LocalRelation", "LogicalRDD"})
MAX_TO_STRING_FIELDS = "spark.sql.debug.maxToStringFields"
WANTED_FIELDS = 100_000

_CALL_RE = re.compile(r"\b(" + "|".join((*JAVA_CALLS, *ENVIRONMENT_CALLS)) + r")\(", re.I)
_INVOKE_RE = re.compile(r"\b(" + "|".join(INVOKE_CALLS) + r")\(\s*([A-Za-z_$][A-Za-z0-9_$]*)")
_NODE_RE = re.compile(r"^[\s:|]*[+:]- ([A-Za-z]+)")  # a tree line below the first: "   +- SubqueryAlias v"
_TRUNCATED_RE = re.compile(r"\.\.\. \d+ more fields|\[truncated", re.I)
_VERDICTS: dict[tuple[str, str], str | None] = {}
_LOCK = threading.Lock()


class SpecQueryRefused(RuntimeError):
    """Spark's analyzed plan of a spec's query calls Java, reads files or the environment."""


def problems_in_plan(analyzed: str, view: str) -> list[str]:
    """What the analyzed plan (EXPLAIN's "Analyzed Logical Plan" section) of a query of `view` may not do."""
    found: list[str] = []
    if _TRUNCATED_RE.search(analyzed):
        found.append(f"the plan is printed truncated, so it cannot be checked (raise {MAX_TO_STRING_FIELDS})")
    for match in _CALL_RE.finditer(analyzed):
        found.append(f"calls {match.group(1).lower()}(): {_around(analyzed, match.start())}")
    for match in _INVOKE_RE.finditer(analyzed):
        if match.group(2) not in SPARK_INVOKE_CLASSES:
            found.append(f"invokes Java class {match.group(2)}: {_around(analyzed, match.start())}")
    lines = analyzed.splitlines()  # the output schema, then the tree: its first node, then "+- " lines
    nodes = [(lines[1].split(" ", 1)[0], lines[1])] if len(lines) > 1 else []
    nodes += [(m.group(1), line) for line in lines[2:] if (m := _NODE_RE.match(line))]
    for node, line in nodes:
        names_view = f"SubqueryAlias {view}" in line or f"View (`{view}`" in line
        if node not in PLAN_OPERATORS or (node in ("SubqueryAlias", "View") and not names_view):
            found.append(f"has a {node} operator, not only a projection of its view: `{line.strip()[:120]}`")
    return found


def _around(text: str, at: int) -> str:
    return "`" + text[max(0, at - 20) : at + 100].replace("\n", " ") + "`"


def analyzed_section(explained: str) -> str | None:
    """The "Analyzed Logical Plan" section of EXPLAIN EXTENDED's text; None when analysis failed."""
    start = explained.find("== Analyzed Logical Plan ==\n")
    end = explained.rfind("\n== Optimized Logical Plan ==")  # the last: a literal could print a fake header
    if start < 0 or end < start:
        return None
    section = explained[start + len("== Analyzed Logical Plan ==\n") : end]
    if section.lstrip().startswith("org.apache.spark.sql.AnalysisException"):
        return None
    return section


def check_spec_query(spark: Any, query: str, view: str, frame: Any, pipeline: str, identity: str) -> None:
    """Refuse (SpecQueryRefused) the spec query `query`, which reads the temp view `view` of the
    DataFrame `frame`, if Spark's analyzed plan of it calls Java, reads files or the environment.
    Nothing of it runs here.

    `identity` fixes the view's columns (the spec, as JSON): with the query text it keys the
    verdict, so later batches ask Spark nothing. A query that fails to analyze is let through:
    it cannot run either, and Spark's own error (raised when the query is planned) says why.
    """
    key = (query.replace(f"`{view}`", "`<view>`"), identity)
    with _LOCK:
        known = key in _VERDICTS
        verdict = _VERDICTS.get(key)
    if not known:
        verdict = _verdict(spark, query, view, frame.schema)
        with _LOCK:
            _VERDICTS[key] = verdict
    if verdict is not None:
        logger.error(
            "BUG in the spec SQL allow-list (riverhouse.platform.sql): pipeline %s's query passed it, but "
            "Spark's analyzed plan of it %s. The query was refused before it ran; please report this.",
            pipeline,
            verdict,
        )
        raise SpecQueryRefused(
            f"pipeline {pipeline}: Spark's analyzed plan of the spec's query {verdict}; refused before it ran. "
            "The spec passed `riverhouse validate`, so this is a Riverhouse bug (logged as such): please report it"
        )


def _verdict(spark: Any, query: str, view: str, schema: Any) -> str | None:
    _show_every_field(spark)
    probe = f"rh_plan_guard_{uuid.uuid4().hex[:12]}"
    spark.createDataFrame([], schema).createOrReplaceTempView(probe)
    try:
        explained = spark.sql("EXPLAIN EXTENDED " + query.replace(f"`{view}`", f"`{probe}`")).collect()[0][0]
    finally:
        spark.catalog.dropTempView(probe)
    analyzed = analyzed_section(str(explained))
    if analyzed is None:
        return None
    found = problems_in_plan(analyzed, probe)
    return "; ".join(found) if found else None


def _show_every_field(spark: Any) -> None:
    """Plans printed in full in this session: Spark's default ends a long SELECT with "... N more fields"."""
    try:
        current = int(spark.conf.get(MAX_TO_STRING_FIELDS, "25"))
    except ValueError:
        current = 25
    if current < WANTED_FIELDS:
        spark.conf.set(MAX_TO_STRING_FIELDS, str(WANTED_FIELDS))
