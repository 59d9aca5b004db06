"""A small, safe subset of expr-lang (GlassFlow's filter and transform language) as Spark SQL.

Only what has the same meaning in both: field names, numbers, quoted strings,
true/false, comparisons, arithmetic, and/or/not and parentheses. Anything else
(function calls, nested fields, `in`, `matches`, `??`, ...) returns None, and the
importer reports the expression instead of guessing.
"""

from __future__ import annotations

import re

TOKEN_RE = re.compile(
    r"""\s*(?:
      (?P<number>\d+(?:\.\d+)?)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op>==|!=|<=|>=|&&|\|\||[<>+\-*/%()!])
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)
OPERATORS = {"==": "=", "!=": "<>", "&&": "AND", "||": "OR", "!": "NOT"}
WORDS = {"and": "AND", "or": "OR", "not": "NOT", "true": "TRUE", "false": "FALSE"}


def translate_expr(expression: str, source: str, fields: set[str]) -> str | None:
    """`amount > 10 and status == 'paid'` -> `orders.amount > 10 AND orders.status = 'paid'`, or None."""
    out: list[str] = []
    pos = 0
    text = expression.strip()
    while pos < len(text):
        match = TOKEN_RE.match(text, pos)
        if match is None or match.end() == pos:
            return None
        pos = match.end()
        kind = match.lastgroup
        token = match.group(kind or "")
        if kind == "number":
            out.append(token)
        elif kind == "string":
            body = token[1:-1]
            if "\\" in body or "'" in body:
                return None  # escapes differ between the two languages: report rather than guess
            out.append(f"'{body}'")
        elif kind == "op":
            out.append(OPERATORS.get(token, token))
        elif token in WORDS:
            out.append(WORDS[token])
        elif token in fields:
            # A following "(" would make it a function call, "." a nested field: both rejected below.
            nxt = text[pos:].lstrip()[:1]
            if nxt in ("(", ".", "["):
                return None
            out.append(f"{source}.{token}")
        else:
            return None
    if not out or out.count("(") != out.count(")"):
        return None
    return " ".join(out).replace("( ", "(").replace(" )", ")")
