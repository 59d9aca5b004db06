"""Join pipelines as a plan: a driving stream, lookups, projections, a filter.

Both spec forms compile here: `join:` (a temporal join of two sources) is turned
into the equivalent SELECT, and `query:` (KaflowSQL-style SQL) is parsed with
sqlglot. Validation happens up front, with errors that name the clause:
unknown source or column, a JOIN without equality keys, or a clause a stream
cannot answer (aggregation, DISTINCT, ORDER BY, ...).

Column references are rewritten from `alias.column` to the flat name
`alias__column` that the Spark executor uses.

Spec SQL is untrusted: every node of the parsed query must be in an allow-list of
constructs (ALLOWED_CONSTRUCTS) and every function in an allow-list of functions
(ALLOWED_FUNCTIONS, ALLOWED_SPARK_FUNCTIONS). Spark itself cannot be told to refuse
`reflect`/`java_method` (Spark 4.2 has no such setting), so this check is what keeps a
spec from calling Java; the SQL generated for Spark is parsed and checked again
(`check_generated`), Riverhouse's sessions turn off SQL on files
(settings.RESTRICTED_SPARK_CONF), and gold/plan_guard.py checks Spark's analyzed plan of the
query before it runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

import sqlglot
from sqlglot import exp

from riverhouse.platform.spec_base import IDENTIFIER_RE, check_column_name

FLAT_SEP = "__"


def _classes(*names: str) -> frozenset[type[exp.Expression]]:
    """sqlglot expression classes by name (a name this sqlglot version lacks is skipped)."""
    return frozenset(getattr(exp, n) for n in names if isinstance(getattr(exp, n, None), type))


# Constructs a query may use: one SELECT with FROM/JOIN/WHERE over named sources, and
# expressions (operators, comparisons, CASE/IF, casts, literals, intervals).
ALLOWED_CONSTRUCTS = _classes(
    *("Select", "From", "Join", "Table", "TableAlias", "Identifier", "Column", "Alias", "Where"),
    *("Literal", "Null", "Boolean", "Paren", "Neg", "Not", "And", "Or"),
    *("EQ", "NEQ", "GT", "GTE", "LT", "LTE", "NullSafeEQ", "NullSafeNEQ", "Is", "In", "Between", "Like", "ILike"),
    *("Add", "Sub", "Mul", "Div", "Mod", "IntDiv", "DPipe", "Case", "If", "Cast", "TryCast", "DataType"),
    *("DataTypeParam", "Interval", "RegexpLike", "AtTimeZone", "FromTimeZone"),
)
# Functions, as sqlglot models them: string, number, date/time, null handling, hashes.
# No aggregates, window functions, generators, or anything that reaches outside the row.
ALLOWED_FUNCTIONS = _classes(
    *("Upper", "Lower", "Length", "Substring", "Trim", "Concat", "ConcatWs", "Initcap", "Pad", "Left", "Right"),
    *("Reverse", "Replace", "RegexpReplace", "RegexpExtract", "StrPosition", "SplitPart", "MD5", "SHA", "SHA2"),
    *("Abs", "Round", "Floor", "Ceil", "Sqrt", "Pow", "Ln", "Log", "Exp", "Sign", "Greatest", "Least"),
    *("Coalesce", "Nullif", "Year", "Month", "Day", "DayOfMonth", "DayOfWeek", "DayOfYear", "Quarter", "Hour"),
    *("Minute", "Second", "TimestampTrunc", "DateTrunc", "TsOrDsToDate", "TsOrDsAdd", "DateAdd", "DateSub"),
    *("DateDiff", "TimeToStr", "StrToTime", "StrToDate", "TimeStrToTime", "StrToUnix", "UnixToStr", "UnixToTime"),
    *("AddMonths", "LastDay", "WeekOfYear", "ToChar", "Hex", "Unhex", "Nvl2", "ToBase64", "Contains", "EndsWith"),
    *("StartsWith", "IsNan", "Nanvl", "Repeat", "Translate", "SafeAdd", "SafeDivide", "SafeMultiply"),
    *("SafeSubtract", "UnixMillis", "UnixSeconds"),
    # Arrays and maps (fields of type array<T>, map<string,T>): row-local, and never failing on a missing element.
    *("ArrayContains", "ArraySize", "MapKeys"),
)
# Spark functions sqlglot does not model (parsed as anonymous calls), by name.
ALLOWED_SPARK_FUNCTIONS = frozenset(
    {
        *("nvl2", "ltrim", "rtrim", "btrim", "translate", "char_length", "character_length", "octet_length"),
        *("try_add", "try_subtract", "try_multiply", "try_divide", "isnan", "nanvl", "bround", "pmod"),
        *("make_date", "timestamp_millis", "timestamp_seconds", "unix_millis", "unix_seconds", "to_utc_timestamp"),
        *("from_utc_timestamp", "date_part", "dayofweek", "weekday", "left", "right", "lpad", "rpad", "startswith"),
        *("endswith", "contains", "instr", "locate", "repeat", "format_number", "sha1", "crc32", "base64"),
    }
)


# Words a date function's unit slot may hold. sqlglot builds the unit of DATE_ADD, DATEDIFF,
# DATE_TRUNC... as a `Var` from the text of a string literal, and its Spark generator writes a
# Var back unquoted: `date_add('day) , java_method(...', ...)` became SQL that called Java
# (issue 27). So a unit is checked against these words, never skipped.
ALLOWED_UNITS = frozenset(
    {
        *("YEAR", "YEARS", "YYYY", "YY", "QUARTER", "QUARTERS", "MONTH", "MONTHS", "MON", "MM"),
        *("WEEK", "WEEKS", "DAY", "DAYS", "DD", "DAYOFYEAR", "DOY", "DAYOFWEEK", "DOW", "DAYOFWEEK_ISO"),
        *("DOW_ISO", "HOUR", "HOURS", "MINUTE", "MINUTES", "SECOND", "SECONDS", "MILLISECOND"),
        *("MILLISECONDS", "MICROSECOND", "MICROSECONDS"),
    }
)
# What gold/plan_guard.py refuses in Spark's analyzed plan of a spec's query: calls of Java by
# reflection, Java invocations, and what reads files or the environment. Spark prints a string
# literal's text unquoted in a plan, so a literal that reads like one of these calls is refused
# here too: the two checks then agree, and a plan-check refusal is always a text-check bug.
JAVA_CALLS = ("reflect", "java_method", "try_reflect")
INVOKE_CALLS = ("static_invoke", "invoke")
ENVIRONMENT_CALLS = (
    *("input_file_name", "input_file_block_start", "input_file_block_length", "read_files"),
    *("current_user", "session_user", "user"),
)
FORBIDDEN_CALL_RE = re.compile(r"\b(" + "|".join((*JAVA_CALLS, *INVOKE_CALLS, *ENVIRONMENT_CALLS)) + r")\s*\(", re.I)
# Parentheses nested deeper than this are refused before sqlglot parses the query: its parser
# recurses about 20 Python frames per level and ended in a RecursionError near 50 levels.
MAX_NESTING = 24
MAX_QUERY_CHARS = 20_000


class QueryError(ValueError):
    pass


@dataclass(frozen=True)
class JoinKey:
    base_alias: str
    base_column: str
    column: str  # column of the joined source


@dataclass(frozen=True)
class JoinStep:
    source: str
    alias: str
    kind: str  # left | inner
    keys: tuple[JoinKey, ...]
    window: timedelta | None  # None: a dimension (latest row per key, never expires)


@dataclass(frozen=True)
class JoinPlan:
    driving_source: str
    driving_alias: str
    steps: tuple[JoinStep, ...]
    projections: tuple[tuple[str, str], ...]  # (output name, Spark SQL over flat columns)
    where: str | None
    require: tuple[str, ...]

    @property
    def output_names(self) -> list[str]:
        return [name for name, _ in self.projections]

    @property
    def close_after(self) -> timedelta:
        """How long after a driving event its result is final: the longest stream window."""
        windows = [s.window for s in self.steps if s.window is not None]
        return max(windows) if windows else timedelta(0)

    @property
    def stream_sources(self) -> list[str]:
        return [self.driving_source, *(s.source for s in self.steps if s.window is not None)]


def flat(alias: str, column: str) -> str:
    return f"{alias}{FLAT_SEP}{column}"


UNSUPPORTED = [
    (exp.Exists, "subqueries and lambdas (EXISTS); to test an array field use array_contains(array, value)"),
    (
        exp.Group,
        "GROUP BY: a pipeline emits one row per driving event and does not aggregate a stream; load the rows "
        "and aggregate in ClickHouse (a query or a materialized view over the sink table)",
    ),
    (exp.Having, "HAVING"),
    (exp.Order, "ORDER BY (a stream has no order; ClickHouse orders by sink.order_by)"),
    (exp.Limit, "LIMIT"),
    (exp.Distinct, "DISTINCT (use dedup on the source instead)"),
    (exp.Window, "window functions (OVER ...)"),
    (exp.AggFunc, "aggregate functions over a stream without a window"),
    (exp.Subquery, "subqueries"),
    (exp.Union, "UNION"),
    (exp.Star, "SELECT * (list the columns you want)"),
]


def compile_query(
    query: str,
    fields: dict[str, list[str]],
    windows: dict[str, timedelta],
    dimensions: set[str],
    require: list[str],
) -> JoinPlan:
    """Parse and validate a SELECT over named sources. `fields`: source -> its field names."""
    check_shape(query)
    try:
        return _compile(query, fields, windows, dimensions, require)
    except RecursionError:  # CASE or NOT nested without parentheses: the file's error, not a crash
        raise QueryError("query: the SQL is nested too deeply to check; write it flatter") from None


def check_shape(query: str) -> None:
    """Refuse a query too long or nested too deeply to parse safely (sqlglot's tokenizer does not recurse)."""
    if len(query) > MAX_QUERY_CHARS:
        raise QueryError(f"query: {len(query):,} characters, more than the maximum of {MAX_QUERY_CHARS:,}")
    try:
        tokens = sqlglot.tokenize(query, read="spark")
    except sqlglot.errors.TokenError as exc:
        raise QueryError(f"query: cannot parse SQL: {str(exc).splitlines()[0][:200]}") from None
    depth = 0
    for token in tokens:
        depth += {sqlglot.TokenType.L_PAREN: 1, sqlglot.TokenType.R_PAREN: -1}.get(token.token_type, 0)
        if depth > MAX_NESTING:
            raise QueryError(
                f"query: parentheses nested more than {MAX_NESTING} deep (line {token.line}); write it flatter"
            )


def _compile(
    query: str,
    fields: dict[str, list[str]],
    windows: dict[str, timedelta],
    dimensions: set[str],
    require: list[str],
) -> JoinPlan:
    try:
        statements = sqlglot.parse(query, read="spark")
    except sqlglot.errors.ParseError as exc:
        raise QueryError(f"query: cannot parse SQL: {str(exc).splitlines()[0][:200]}") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise QueryError("query: write exactly one SELECT statement")
    select: exp.Select = statements[0]
    for node_type, label in UNSUPPORTED:
        node = select.find(node_type)
        if node is not None:
            raise QueryError(f"query: unsupported clause: {label}, in `{node.sql(dialect='spark')[:80]}`")
    check_allowed(select)

    from_clause = select.args.get("from_") or select.args.get("from")
    if from_clause is None or not isinstance(from_clause.this, exp.Table):
        raise QueryError("query: FROM must name one source")
    aliases: dict[str, str] = {}

    def add_table(table: exp.Table, where: str) -> str:
        if table.args.get("db") is not None or table.args.get("catalog") is not None:
            raise QueryError(
                f"query: {where} `{table.sql(dialect='spark')}`: name a source without a qualifier "
                f"(sources: {', '.join(fields)})"
            )
        if not isinstance(table.this, exp.Identifier):
            raise QueryError(f"query: {where} must name a source, got `{table.sql(dialect='spark')[:80]}`")
        source = table.name
        if table.alias and not IDENTIFIER_RE.fullmatch(table.alias):
            raise QueryError(f"query: {where}: alias {table.alias!r} is not a safe identifier")
        if source not in fields:
            raise QueryError(f"query: {where} names unknown source {source!r} (sources: {', '.join(fields)})")
        alias = table.alias_or_name
        if alias in aliases:
            raise QueryError(f"query: alias {alias!r} is used twice; give each source its own alias")
        aliases[alias] = source
        return alias

    driving_alias = add_table(from_clause.this, "FROM")
    driving = aliases[driving_alias]
    if driving in dimensions:
        raise QueryError(f"query: FROM {driving!r} is a dimension; the FROM source must be a stream")

    def resolve(column: exp.Column, clause: str, allowed: set[str] | None = None) -> tuple[str, str]:
        if column.args.get("db") is not None or column.args.get("catalog") is not None:
            raise QueryError(f"query: {clause}: write <alias>.<column>, got `{column.sql()}`")
        name = column.name
        if column.table:
            alias = column.table
            if alias not in aliases or (allowed is not None and alias not in allowed):
                raise QueryError(f"query: {clause}: unknown table or alias {alias!r} in `{column.sql()}`")
        else:
            owners = [a for a, s in aliases.items() if name in fields[s] and (allowed is None or a in allowed)]
            if not owners:
                raise QueryError(f"query: {clause}: unknown column {name!r}")
            if len(owners) > 1:
                raise QueryError(f"query: {clause}: column {name!r} is ambiguous ({', '.join(owners)}); qualify it")
            alias = owners[0]
        if name not in fields[aliases[alias]]:
            raise QueryError(
                f"query: {clause}: unknown column {name!r} of {aliases[alias]!r} "
                f"(fields: {', '.join(fields[aliases[alias]])})"
            )
        return alias, name

    steps: list[JoinStep] = []
    for join in select.args.get("joins") or []:
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        if side in ("RIGHT", "FULL") or kind in ("CROSS", "OUTER", "SEMI", "ANTI"):
            raise QueryError(
                f"query: unsupported clause: {' '.join(filter(None, [side, kind]))} JOIN (use JOIN or LEFT JOIN)"
            )
        if not isinstance(join.this, exp.Table):
            raise QueryError("query: JOIN must name a source")
        earlier = set(aliases)
        alias = add_table(join.this, "JOIN")
        on = join.args.get("on")
        label = f"JOIN {aliases[alias]}"
        if on is None or isinstance(on, exp.Boolean):
            raise QueryError(f"query: {label} has no ON clause with equality keys")
        keys: list[JoinKey] = []
        for cond in on.flatten() if isinstance(on, exp.And) else [on]:
            if not isinstance(cond, exp.EQ) or not all(isinstance(s, exp.Column) for s in (cond.this, cond.expression)):
                raise QueryError(
                    f"query: {label} ON: only `a.x = b.y` equality keys joined with AND are supported, got `{cond.sql()}`"
                )
            left = resolve(cond.this, f"{label} ON", earlier | {alias})
            right = resolve(cond.expression, f"{label} ON", earlier | {alias})
            if left[0] == alias and right[0] != alias:
                left, right = right, left
            if right[0] != alias or left[0] == alias:
                raise QueryError(f"query: {label} ON `{cond.sql()}` must compare {alias!r} with an earlier source")
            keys.append(JoinKey(left[0], left[1], right[1]))
        source = aliases[alias]
        window = None if source in dimensions else windows[source]
        steps.append(JoinStep(source, alias, "left" if side == "LEFT" else "inner", tuple(keys), window))

    def rewrite(node: exp.Expression, clause: str) -> str:
        def flatten_column(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column):
                alias, name = resolve(n, clause)
                return exp.column(flat(alias, name), quoted=True)
            return n

        return node.copy().transform(flatten_column).sql(dialect="spark")

    projections: list[tuple[str, str]] = []
    for item in select.expressions:
        if isinstance(item, exp.Alias):
            name, body = item.alias, item.this
        elif isinstance(item, exp.Column):
            name, body = item.name, item
        else:
            raise QueryError(f"query: SELECT `{item.sql()}` needs a name: add AS <name>")
        try:
            check_column_name(name, "output column")
        except ValueError as exc:
            raise QueryError(f"query: {exc}") from None
        projections.append((name, rewrite(body, f"SELECT {name}")))
    names = [n for n, _ in projections]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise QueryError(f"query: output column(s) named twice: {', '.join(dupes)}")
    for name in require:
        if name not in names:
            raise QueryError(f"require: {name!r} is not an output column of the query ({', '.join(names)})")
    where = select.args.get("where")
    where_sql = rewrite(where.this, "WHERE") if where is not None else None
    unused = set(dimensions) - set(aliases.values())
    if unused:
        raise QueryError(f"dimensions: {', '.join(sorted(unused))} not used in the query")
    columns = {flat(alias, name) for alias, source in aliases.items() for name in fields[source]}
    for name, expression in projections:
        check_generated(expression, f"SELECT {name}", columns)
    if where_sql is not None:
        check_generated(where_sql, "WHERE", columns)
    return JoinPlan(driving, driving_alias, tuple(steps), tuple(projections), where_sql, tuple(require))


def check_generated(expression: str, clause: str, columns: set[str]) -> None:
    """The allow-list again, on the text actually sent to Spark: it must read back as one expression
    over the flat columns, with nothing outside the allow-lists.

    The check above looks at sqlglot's tree of the user's SQL; Spark runs the text sqlglot
    generates from it, and the two can differ (a unit written back unquoted was one such
    difference). A difference found here is refused, not run.
    """
    try:
        statements = sqlglot.parse(f"SELECT {expression}", read="spark")
    except sqlglot.errors.SqlglotError:
        statements = []
    select = statements[0] if len(statements) == 1 else None
    if (
        not isinstance(select, exp.Select)
        or len(select.expressions) != 1
        or select.args.get("from_")
        or select.args.get("from")
    ):
        raise QueryError(
            f"query: {clause}: the SQL generated for Spark does not read back as one expression "
            f"(`{expression[:80]}`); simplify the expression"
        )
    for node_type, label in UNSUPPORTED:
        if select.find(node_type) is not None:
            raise QueryError(f"query: {clause}: unsupported clause in the SQL generated for Spark: {label}")
    check_allowed(select)
    for column in select.find_all(exp.Column):
        if column.table or column.name not in columns or not column.this.quoted:
            raise QueryError(
                f"query: {clause}: the SQL generated for Spark names `{column.sql(dialect='spark')[:80]}`, "
                "which is not a column of the sources"
            )


def check_allowed(select: exp.Select) -> None:
    """Refuse any construct or function outside the allow-lists, naming it."""
    for node in select.walk():
        if isinstance(node, exp.Select) and node is not select:
            raise QueryError(f"query: unsupported clause: subqueries, in `{node.sql(dialect='spark')[:80]}`")
        if isinstance(node, exp.Bracket):
            if node.args.get("safe"):
                continue  # try_element_at(map_or_array, key): NULL when the key or index is missing
            raise QueryError(
                f"query: `{node.sql(dialect='spark')[:80]}`: write try_element_at(x, key), which gives NULL for a "
                "missing key or index (x[key] and element_at fail the run on an array index out of range)"
            )
        # A unit keyword (INTERVAL 1 HOUR, date_trunc('hour', ...), EXTRACT(YEAR FROM ...)), written
        # back unquoted: only the known words, or a literal's text would become SQL.
        if isinstance(node, exp.Var) and isinstance(node.parent, (exp.Func, exp.Interval)):
            if str(node.name).upper() in ALLOWED_UNITS:
                continue
            raise QueryError(
                f"query: {str(node.name)[:40]!r} is not a date/time unit: use one of YEAR, QUARTER, MONTH, "
                "WEEK, DAY, HOUR, MINUTE, SECOND, MILLISECOND, MICROSECOND"
            )
        if isinstance(node, exp.Literal) and node.is_string and FORBIDDEN_CALL_RE.search(str(node.this)):
            raise QueryError(
                f"query: the string {str(node.this)[:60]!r} reads like a call of "
                f"{FORBIDDEN_CALL_RE.search(str(node.this)).group(1)}(), which spec SQL may not use: Spark prints "  # type: ignore[union-attr]
                "literals unquoted in its plan, where Riverhouse checks for such calls; reword the string"
            )
        if isinstance(node, exp.Anonymous):
            name = str(node.name).lower()
            if name not in ALLOWED_SPARK_FUNCTIONS:
                raise QueryError(
                    f"query: function {name}() is not allowed (spec SQL may use the string, number, date and "
                    "null functions listed in docs/pipeline-spec.md#what-a-query-may-use)"
                )
            continue
        if isinstance(node, exp.Func) and type(node) not in ALLOWED_CONSTRUCTS:
            if type(node) not in ALLOWED_FUNCTIONS:
                raise QueryError(
                    f"query: function {node.sql_name().lower()}() is not allowed (spec SQL may use the string, "
                    "number, date and null functions listed in docs/pipeline-spec.md#what-a-query-may-use)"
                )
            continue
        if type(node) not in ALLOWED_CONSTRUCTS:
            raise QueryError(
                f"query: `{node.sql(dialect='spark')[:80]}` ({type(node).__name__}) is not allowed in spec SQL: "
                "use columns, literals, operators, CASE, casts and the functions in docs/pipeline-spec.md"
            )


def temporal_join_query(
    left: str, right: str, kind: str, left_keys: list[str], right_keys: list[str], select: dict[str, str]
) -> str:
    """The SELECT equivalent of a `join:` block (so both forms share one executor)."""
    on = " AND ".join(f"`{left}`.`{lk}` = `{right}`.`{rk}`" for lk, rk in zip(left_keys, right_keys, strict=True))
    columns = []
    for out, ref in select.items():
        source, _, column = ref.partition(".")
        columns.append(f"`{source}`.`{column}` AS `{out}`")
    join = "LEFT JOIN" if kind == "left" else "JOIN"
    return f"SELECT {', '.join(columns)} FROM `{left}` {join} `{right}` ON {on}"
