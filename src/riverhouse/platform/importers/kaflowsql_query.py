"""A KaflowSQL query read for the import: what Riverhouse cannot stream, nested columns, and input types.

KaflowSQL declares no input fields: they are whatever the query names. So this module

- refuses what a Riverhouse pipeline cannot run, saying what the input is and what to do
  instead (`SELECT *`, `GROUP BY` and aggregates, subqueries, JSON `->`);
- turns nested references into spec fields with a path: `t.user.id` (a struct member) and
  `t.payload ->> 'id'` (a JSON key as text) read `user.id` and `payload.id`;
- turns DuckDB's `x = ANY(t.tags)` / `x <> ALL(t.tags)` into Spark's `array_contains`;
- infers each input column's type from how the query uses it (compared with a number or
  used in arithmetic: double; compared with a string: string; a condition on its own:
  boolean), across `a.x = b.y` comparisons, and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from riverhouse.platform.importers.report import ImporterError

NUMBER_OPS = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg, exp.IntDiv)
COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)
STRING_FUNCS = (exp.Upper, exp.Lower, exp.Length, exp.Substring, exp.Trim, exp.Concat, exp.Like, exp.ILike)
STRING_FUNCS += (exp.DPipe, exp.StartsWith, exp.EndsWith, exp.RegexpLike, exp.Replace)
NUMBER_FUNCS = (exp.Abs, exp.Round, exp.Floor, exp.Ceil, exp.Sqrt, exp.Ln, exp.Log, exp.Exp, exp.Sign)
AGGREGATE_HINT = (
    "Riverhouse emits one row per driving event and does not aggregate a stream: remove GROUP BY and the "
    "aggregates, load the rows, and aggregate in ClickHouse (a query or a materialized view over the sink table)"
)


@dataclass
class InputField:
    """A column of a source as the query uses it."""

    type: str = "string"
    path: tuple[str, ...] | None = None  # where it sits in the record, when nested
    why: str = ""  # how the type was found ("": nothing said; string by default)


def refuse_unsupported(select: exp.Select, source: str) -> None:
    """Raise ImporterError naming the construct and what to do, for what a pipeline cannot run."""

    def fail(what: str, hint: str) -> None:
        raise ImporterError(source, [("query", what, hint)])

    for item in select.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            fail(
                f"`SELECT {item.sql()}`: KaflowSQL passes every field through, but its pipelines declare no input "
                "fields, so the import takes each source's fields from the columns the query names",
                "list the columns you want: SELECT t.a, t.b, ...",
            )
    group = select.args.get("group")
    if group is not None:
        fail(f"`{group.sql(dialect='duckdb', comments=False)[:80]}` (aggregation)", AGGREGATE_HINT)
    for agg in select.find_all(exp.AggFunc):
        fail(f"aggregate function `{agg.sql(dialect='duckdb', comments=False)[:80]}`", AGGREGATE_HINT)
    for node in select.find_all(exp.Window):
        fail(
            f"window function `{node.sql(dialect='duckdb', comments=False)[:80]}`",
            "compute it in ClickHouse over the sink table",
        )
    for node in select.find_all(exp.Subquery, exp.Exists):
        fail(
            f"subquery `{node.sql(dialect='duckdb', comments=False)[:80]}`",
            "Riverhouse joins streams with JOIN ... ON a.key = b.key: rewrite it as a LEFT JOIN",
        )
    for node in select.find_all(exp.JSONExtract):
        fail(
            f"`{node.sql(dialect='duckdb', comments=False)[:80]}` (-> returns JSON)",
            "use ->> 'key' (the value as text), which the import reads as a nested field",
        )


def _literal_kind(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Neg):
        node = node.this
    if isinstance(node, exp.Literal):
        return "string" if node.is_string else "double"
    if isinstance(node, exp.Boolean):
        return "boolean"
    return None


def rewrite_nested(select: exp.Select, aliases: dict[str, str], driving_alias: str, source: str) -> dict:
    """Nested references -> flat columns; returns {(alias, column): path}. Also rewrites ANY/ALL."""
    paths: dict[tuple[str, str], tuple[str, ...]] = {}

    def flat(alias: str, path: list[str]) -> exp.Column:
        name = re.sub(r"[^A-Za-z0-9_]", "_", "_".join(path)).lstrip("_") or "field"
        name = name if name[0].isalpha() else f"f_{name}"
        paths[(alias, name)] = tuple(path)
        return exp.column(name, table=alias)

    def replace(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            parts = [p.name for p in node.parts]
            if len(parts) >= 3 or (len(parts) == 2 and parts[0] not in aliases):
                if parts[0] in aliases:
                    return flat(parts[0], parts[1:])
                if len(aliases) > 1:
                    raise ImporterError(
                        source,
                        [("query", f"`{node.sql()}`: a nested column needs its table's alias", "write t.a.b")],
                    )
                return flat(driving_alias, parts)
        if isinstance(node, exp.JSONExtractScalar) and isinstance(node.this, exp.Column):
            keys = node.expression.expressions if isinstance(node.expression, exp.JSONPath) else []
            names = [k.this for k in keys if isinstance(k, exp.JSONPathKey)]
            if keys and isinstance(keys[0], exp.JSONPathRoot) and len(names) == len(keys) - 1 and names:
                inner = node.this
                alias = inner.table or driving_alias
                base = [p.name for p in inner.parts][1:] if inner.table else [inner.name]
                return flat(alias, [*base, *names])
            raise ImporterError(
                source,
                [
                    (
                        "query",
                        f"`{node.sql(dialect='duckdb', comments=False)}`: only ->> 'key' chains are read as nested fields",
                        "",
                    )
                ],
            )
        if isinstance(node, COMPARISONS) and isinstance(node.expression, exp.Anonymous | exp.Any | exp.All):
            call = node.expression
            name = (
                "ANY" if isinstance(call, exp.Any) else "ALL" if isinstance(call, exp.All) else str(call.name).upper()
            )
            args = [call.this] if isinstance(call, exp.Any | exp.All) else list(call.expressions)
            args = [a.this if isinstance(a, exp.Paren) else a for a in args]
            if name in ("ANY", "ALL") and len(args) == 1 and isinstance(args[0], exp.Column):
                contains = exp.ArrayContains(this=args[0].copy(), expression=node.this.copy())
                if (name, type(node)) == ("ANY", exp.EQ):
                    return contains
                if (name, type(node)) == ("ALL", exp.NEQ):
                    return exp.Not(this=contains)
            if name in ("ANY", "ALL"):
                raise ImporterError(
                    source,
                    [
                        (
                            "query",
                            f"`{node.sql(dialect='duckdb', comments=False)}`: a match against an array is read as "
                            "`x = ANY(t.array_column)` or `x <> ALL(t.array_column)`",
                            "for a list of values write x IN (...)",
                        )
                    ],
                )
        return node

    select.transform(replace, copy=False)
    return paths


def infer_types(select: exp.Select, resolve: dict[int, tuple[str, str]]) -> dict[tuple[str, str], InputField]:
    """Input types from use. `resolve`: id(Column node) -> (alias, column) for every column of the query."""
    found: dict[tuple[str, str], tuple[str, str]] = {}
    links: list[tuple[tuple[str, str], tuple[str, str]]] = []
    arrays: list[tuple[tuple[str, str], exp.Expression]] = []

    def unwrap(node: exp.Expression) -> exp.Expression:
        while isinstance(node, exp.Paren):
            node = node.this
        return node

    def learn(key: tuple[str, str], typ: str, why: str) -> None:
        found.setdefault(key, (typ, why))

    for col in select.find_all(exp.Column):
        key = resolve.get(id(col))
        if key is None:
            continue
        parent = col.parent
        while isinstance(parent, exp.Paren):
            parent = parent.parent
        if isinstance(parent, COMPARISONS):
            other = unwrap(parent.expression if unwrap(parent.this) is col else parent.this)
            kind = _literal_kind(other)
            if kind is not None:
                learn(key, kind, f"compared with {other.sql(dialect='duckdb', comments=False)}")
            elif isinstance(other, exp.Column) and id(other) in resolve:
                links.append((key, resolve[id(other)]))
        elif isinstance(parent, NUMBER_OPS + NUMBER_FUNCS):
            learn(key, "double", f"used in `{parent.sql(dialect='duckdb', comments=False)[:40]}`")
        elif isinstance(parent, exp.Between) and parent.this is col:
            kind = _literal_kind(parent.args["low"])
            if kind is not None:
                learn(key, kind, "compared with BETWEEN bounds")
        elif isinstance(parent, exp.In) and parent.this is col:
            kinds = {_literal_kind(e) for e in parent.expressions}
            if len(kinds) == 1 and None not in kinds:
                learn(key, kinds.pop() or "string", "compared with an IN list")
        elif isinstance(parent, exp.Not | exp.And | exp.Or) or (isinstance(parent, exp.If) and parent.this is col):
            learn(key, "boolean", "used as a condition")
        elif isinstance(parent, STRING_FUNCS):
            learn(key, "string", f"used in `{parent.sql(dialect='duckdb', comments=False)[:40]}`")
        elif isinstance(parent, exp.ArrayContains) and parent.this is col:
            arrays.append((key, unwrap(parent.expression)))
    # a.x = b.y: one type for both sides (join keys included), repeated until nothing changes.
    changed = True
    while changed:
        changed = False
        for a, b in links:
            for x, y in ((a, b), (b, a)):
                if x in found and y not in found:
                    found[y] = (found[x][0], f"compared with {x[0]}.{x[1]} ({found[x][1]})")
                    changed = True
    for key, needle in arrays:
        element = _literal_kind(needle)
        if element is None and isinstance(needle, exp.Column) and id(needle) in resolve:
            element = found.get(resolve[id(needle)], ("", ""))[0] or None
        found[key] = (f"array<{element or 'string'}>", "matched with = ANY(...)")
    return {key: InputField(typ, None, why) for key, (typ, why) in found.items()}
