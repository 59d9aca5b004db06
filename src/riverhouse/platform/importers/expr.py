"""GlassFlow's filter and transform expressions (expr-lang) as Spark SQL, with expr-lang's meaning.

Parsed with expr-lang's operator table (precedence and associativity), then written as
Spark SQL with every operation in parentheses, so neither language's precedence can change
the meaning. Rules where the two languages differ (docs/migrating.md, "Filters and
transforms"):

- A missing or null value is an ordinary value in expr-lang: `x == 'a'` is false and
  `x != 'a'` true when x is nil. So `==`/`!=` become null-safe `<=>`/`NOT (... <=> ...)`,
  `== nil` becomes `IS NULL`, and `in` is never null (`coalesce(x IN (...), FALSE)`).
- `a + b` of two strings is `concat(a, b)`; `**` is `power(a, b)`; `??` is `coalesce`.
- Comparing or adding values of different kinds (a string with a number) is refused with
  the reason: expr-lang finds them never equal, or stops on the event, while Spark would
  convert one side.
- GlassFlow's helper functions with the same meaning in Spark SQL are translated (upper,
  lower, toString, containsStr, hasPrefix, hasSuffix, replace, toInt, toFloat, len, abs,
  ceil, floor, round); the others are refused with the reason.

Anything else is refused with a reason (`Untranslatable`), never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOKEN_RE = re.compile(
    r"""\s*(?:
      (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op>\*\*|==|!=|<=|>=|&&|\|\||\?\?|[<>+\-*/%()!\[\],.?:{}^])
    | (?P<name>[A-Za-z_$][A-Za-z0-9_$]*)
    )""",
    re.VERBOSE,
)
# expr-lang's binary operators: precedence, right-associative.
BINARY = {
    "or": (10, False),
    "||": (10, False),
    "and": (15, False),
    "&&": (15, False),
    **{op: (20, False) for op in ("==", "!=", "<", ">", "<=", ">=", "in", "matches", "contains")},
    **{op: (20, False) for op in ("startsWith", "endsWith")},
    "+": (30, False),
    "-": (30, False),
    "*": (60, False),
    "/": (60, False),
    "%": (60, False),
    "**": (100, True),
    "^": (100, True),
    "??": (500, False),
}
UNARY = {"not": 50, "!": 50, "-": 90, "+": 90}
# GlassFlow helpers (glassflow-api transformer/json) that cannot be written in Spark SQL with their meaning.
UNTRANSLATED_HELPERS = {
    "parseQuery",
    "getQueryParam",
    "getNestedParam",
    "parseISO8601",
    "toDate",
    "urlDecode",
    "trim",
    "split",
    "join",
    "parseUserAgent",
    "waterfall",
    "extractPathType",
    "hasKeyPrefix",
    "hasAnyKey",
    "keys",
}
# Field types -> what expr-lang sees.
KINDS = {"string": "string", "boolean": "boolean", "timestamp": "time", "date": "time"}
KINDS |= {t: "number" for t in ("int", "long", "float", "double")}


class Untranslatable(ValueError):
    """The expression has no Spark SQL translation with the same meaning; the message says why."""


@dataclass(frozen=True)
class FieldRef:
    column: str  # the spec's column name
    type: str  # the spec's type
    epoch_unit: str | None = None  # a timestamp read from Unix seconds: expressions see the number


@dataclass(frozen=True)
class Sql:
    text: str
    kind: str  # number | string | boolean | time | array | map | null | any
    field: FieldRef | None = None  # set when the expression is a bare field


def kind_of(typ: str) -> str:
    if typ.startswith("array<"):
        return "array"
    if typ.startswith("map<"):
        return "map"
    return KINDS.get(typ, "any")


def translate_expr(expression: str, source: str, fields: dict[str, FieldRef]) -> Sql:
    """An expr-lang expression over GlassFlow field names -> Spark SQL over `source`'s columns."""
    return _Parser(expression, source, fields).parse()


class _Parser:
    def __init__(self, text: str, source: str, fields: dict[str, FieldRef]):
        self.text = text
        self.source = source
        self.fields = fields
        self.tokens: list[tuple[str, str]] = []
        pos, body = 0, text.strip()
        while pos < len(body):
            match = TOKEN_RE.match(body, pos)
            if match is None or match.end() == pos:
                raise Untranslatable(
                    f"cannot read {body[pos : pos + 20]!r}: not part of the expr-lang subset translated"
                )
            pos = match.end()
            kind = match.lastgroup or ""
            self.tokens.append((kind, match.group(kind)))
        self.pos = 0

    # -------------------------------------------------------------------- tokens
    def peek(self, offset: int = 0) -> tuple[str, str]:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else ("end", "")

    def take(self) -> tuple[str, str]:
        token = self.peek()
        self.pos += 1
        return token

    def expect(self, value: str) -> None:
        if self.take()[1] != value:
            raise Untranslatable(f"expected {value!r}")

    def parse(self) -> Sql:
        if not self.tokens:
            raise Untranslatable("the expression is empty")
        out = self.ternary()
        if self.peek()[0] != "end":
            raise Untranslatable(f"unexpected {self.peek()[1]!r}")
        return out

    # -------------------------------------------------------------------- grammar
    def ternary(self) -> Sql:
        cond = self.binary(0)
        if self.peek()[1] != "?":
            return cond
        self.take()
        then = self.ternary()
        self.expect(":")
        other = self.ternary()
        kind = then.kind if then.kind == other.kind else "any"
        return Sql(f"(CASE WHEN {cond.text} THEN {then.text} ELSE {other.text} END)", kind)

    def operator(self) -> str | None:
        kind, value = self.peek()
        if kind == "name" and value == "not" and self.peek(1) == ("name", "in"):
            return "not in"
        if value in BINARY and (kind == "op" or value in ("or", "and", "in", "matches", "contains")):
            return value
        if kind == "name" and value in ("startsWith", "endsWith"):
            return value
        return None

    def binary(self, floor: int) -> Sql:
        left = self.unary()
        while (op := self.operator()) is not None:
            precedence, right_assoc = BINARY["in" if op == "not in" else op]
            if precedence < floor:
                break
            self.take()
            if op == "not in":
                self.take()
            if op in ("in", "not in"):
                left = self.membership(left, negate=op == "not in")
                continue
            right = self.binary(precedence if right_assoc else precedence + 1)
            left = self.combine(op, left, right)
        return left

    def unary(self) -> Sql:
        kind, value = self.peek()
        if value in UNARY and (kind == "op" or value == "not"):
            self.take()
            operand = self.binary(UNARY[value])
            if value in ("not", "!"):
                return Sql(f"(NOT {operand.text})", "boolean")
            self.need(operand, "number", f"{value}{operand.text}")
            return Sql(f"(-{operand.text})" if value == "-" else operand.text, "number")
        return self.postfix(self.primary())

    def primary(self) -> Sql:
        kind, value = self.take()
        if kind == "number":
            return Sql(value, "number")
        if kind == "string":
            body = value[1:-1]
            if "\\" in body or "'" in body:
                raise Untranslatable(f"string {value}: quotes and escapes inside strings are not translated")
            return Sql(f"'{body}'", "string")
        if value == "(":
            inner = self.ternary()
            self.expect(")")
            return inner
        if kind == "name":
            if value in ("true", "false"):
                return Sql(value.upper(), "boolean")
            if value == "nil":
                return Sql("NULL", "null")
            if self.peek()[1] == "(":
                return self.call(value)
            return self.name(value)
        if value == "[":
            raise Untranslatable("an array literal outside `in [...]` is not translated")
        if value == "{":
            raise Untranslatable("a map literal ({...}) is not translated; build the value at the producer")
        raise Untranslatable(f"unexpected {value!r}")

    def name(self, first: str) -> Sql:
        """A field, written with dots for nested fields (`user.id`); a map field's `.key` reads a key."""
        parts = [first]
        while self.peek()[1] == "." and self.peek(1)[0] == "name":
            self.take()
            parts.append(self.take()[1])
        for n in range(len(parts), 0, -1):
            ref = self.fields.get(".".join(parts[:n]))
            if ref is None:
                continue
            out = Sql(f"{self.source}.{ref.column}", kind_of(ref.type), ref)
            if ref.epoch_unit == "seconds":  # what GlassFlow's expressions see: the message's number
                out = Sql(f"unix_seconds({self.source}.{ref.column})", "number")
            for key in parts[n:]:
                out = self.index(out, Sql(f"'{key}'", "string"))
            return out
        raise Untranslatable(f"`{'.'.join(parts)}` is not a field of the source's schema")

    def postfix(self, value: Sql) -> Sql:
        while self.peek()[1] in ("[", ".") and not (self.peek()[1] == "." and self.peek(1)[0] != "name"):
            if self.take()[1] == "[":
                key = self.ternary()
                self.expect("]")
            else:
                key = Sql(f"'{self.take()[1]}'", "string")
            value = self.index(value, key)
        return value

    def index(self, value: Sql, key: Sql) -> Sql:
        if value.kind != "map":
            raise Untranslatable(f"`{value.text}[...]`: indexing is translated for map fields only")
        element = value.field.type[len("map<string,") : -1] if value.field else "any"
        # A missing key is nil in expr-lang; try_element_at gives NULL (a plain [] may fail the run).
        return Sql(f"try_element_at({value.text}, {key.text})", kind_of(element))

    def membership(self, left: Sql, negate: bool) -> Sql:
        if self.peek()[1] == "[":
            self.take()
            items: list[Sql] = []
            while self.peek()[1] != "]":
                item = self.unary()
                if item.kind not in ("number", "string", "boolean"):
                    raise Untranslatable("`in [...]` is translated with literal lists only")
                self.compatible(left, item, "in")
                items.append(item)
                if self.peek()[1] == ",":
                    self.take()
            self.expect("]")
            test = f"coalesce({left.text} IN ({', '.join(i.text for i in items)}), FALSE)"
        else:
            right = self.unary()
            if right.kind == "array":
                test = f"coalesce(array_contains({right.text}, {left.text}), FALSE)"
            elif right.kind == "map":
                test = f"coalesce(array_contains(map_keys({right.text}), {left.text}), FALSE)"
            else:
                raise Untranslatable("`in` is translated with a list, an array field or a map field on its right")
        return Sql(f"(NOT {test})" if negate else test, "boolean")

    # -------------------------------------------------------------------- operators
    def need(self, value: Sql, kind: str, where: str) -> None:
        if value.kind not in (kind, "any"):
            raise Untranslatable(f"`{where}`: expects a {kind}, got a {value.kind}")

    def compatible(self, a: Sql, b: Sql, op: str) -> None:
        kinds = {a.kind, b.kind}
        if "any" in kinds or "null" in kinds or len(kinds) == 1 or kinds == {"time", "string"}:
            if kinds & {"array", "map"} and op not in ("==", "!="):
                raise Untranslatable(f"`{a.text} {op} {b.text}`: arrays and maps are not ordered")
            return
        raise Untranslatable(
            f"`{a.text} {op} {b.text}` compares a {a.kind} with a {b.kind}: expr-lang finds them never equal "
            "(or stops on the event), Spark would convert one side; compare values of one kind "
            "(toString(), toFloat())"
        )

    def combine(self, op: str, a: Sql, b: Sql) -> Sql:
        if op in ("or", "||", "and", "&&"):
            word = "OR" if op in ("or", "||") else "AND"
            return Sql(f"({a.text} {word} {b.text})", "boolean")
        if op in ("==", "!="):
            self.compatible(a, b, op)
            if b.kind == "null" or a.kind == "null":
                other = a if b.kind == "null" else b
                return Sql(f"({other.text} IS {'' if op == '==' else 'NOT '}NULL)", "boolean")
            same = f"({a.text} <=> {b.text})"  # null-safe: a missing value is an ordinary value
            return Sql(same if op == "==" else f"(NOT {same})", "boolean")
        if op in ("<", ">", "<=", ">="):
            self.compatible(a, b, op)
            return Sql(f"({a.text} {op} {b.text})", "boolean")
        if op in ("contains", "startsWith", "endsWith", "matches"):
            self.need(a, "string", f"{a.text} {op}")
            self.need(b, "string", f"{op} {b.text}")
            if op == "matches":
                return Sql(f"({a.text} RLIKE {b.text})", "boolean")
            return Sql(f"{op.lower()}({a.text}, {b.text})", "boolean")
        if op == "??":
            return Sql(f"coalesce({a.text}, {b.text})", a.kind if a.kind == b.kind else "any")
        if op == "+" and a.kind == b.kind == "string":
            return Sql(f"concat({a.text}, {b.text})", "string")
        if op == "+" and "string" in (a.kind, b.kind) and "any" not in (a.kind, b.kind):
            raise Untranslatable(
                f"`{a.text} + {b.text}` adds a {a.kind} and a {b.kind}: expr-lang stops on such an event; "
                "convert one side (toString(), toFloat())"
            )
        self.need(a, "number", f"{a.text} {op} {b.text}")
        self.need(b, "number", f"{a.text} {op} {b.text}")
        if op in ("**", "^"):
            return Sql(f"power({a.text}, {b.text})", "number")
        return Sql(f"({a.text} {op} {b.text})", "number")

    # -------------------------------------------------------------------- functions
    def call(self, name: str) -> Sql:
        self.expect("(")
        args: list[Sql] = []
        while self.peek()[1] != ")":
            args.append(self.ternary())
            if self.peek()[1] == ",":
                self.take()
            elif self.peek()[1] != ")":
                raise Untranslatable(f"{name}(): expected ',' or ')'")
        self.expect(")")
        return self.function(name, args)

    def function(self, name: str, args: list[Sql]) -> Sql:
        def arity(n: int) -> None:
            if len(args) != n:
                raise Untranslatable(f"{name}() takes {n} argument(s) here, got {len(args)}")

        def text(i: int) -> str:
            # GlassFlow's helpers read their input with cast.ToString: nil is "".
            return f"coalesce(CAST({args[i].text} AS STRING), '')"

        if name in ("upper", "lower"):
            arity(1)
            return Sql(f"{name}({text(0)})", "string")
        if name == "toString":
            arity(1)
            return Sql(text(0), "string")
        if name in ("containsStr", "hasPrefix", "hasSuffix"):
            arity(2)
            spark = {"containsStr": "contains", "hasPrefix": "startswith", "hasSuffix": "endswith"}[name]
            # An empty input is false in GlassFlow even for an empty argument.
            return Sql(f"({text(0)} <> '' AND {spark}({text(0)}, {text(1)}))", "boolean")
        if name == "replace":
            arity(3)
            return Sql(f"replace({text(0)}, {text(1)}, {text(2)})", "string")
        if name == "toFloat":
            arity(1)
            return Sql(f"coalesce(try_cast({text(0)} AS DOUBLE), 0.0)", "number")
        if name == "toInt":
            arity(1)
            whole = f"try_cast({text(0)} AS BIGINT)"
            floored = f"try_cast(floor(try_cast({text(0)} AS DOUBLE)) AS BIGINT)"
            return Sql(f"coalesce({whole}, {floored}, 0)", "number")
        if name == "len":
            arity(1)
            if args[0].kind == "string":
                return Sql(f"octet_length({args[0].text})", "number")  # Go's len counts bytes
            if args[0].kind in ("array", "map"):
                return Sql(f"size({args[0].text})", "number")
            raise Untranslatable("len() is translated for string, array and map fields")
        if name in ("abs", "ceil", "floor", "round"):
            arity(1)
            self.need(args[0], "number", f"{name}()")
            return Sql(f"{name}({args[0].text})", "number")
        if name in UNTRANSLATED_HELPERS:
            raise Untranslatable(
                f"{name}() is a GlassFlow helper function with no Spark SQL equivalent here: compute the value at "
                "the producer, or write the column yourself in query: with the functions in "
                "docs/pipeline-spec.md#what-a-query-may-use"
            )
        raise Untranslatable(
            f"{name}() has no Spark SQL translation here: write the column yourself in query: with the functions "
            "in docs/pipeline-spec.md#what-a-query-may-use"
        )
