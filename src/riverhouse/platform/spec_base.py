"""What every part of a spec shares: identifier rules and the strict pydantic base model.

Every identifier that reaches SQL is validated with these rules, so later layers can quote it
without re-checking.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

# Every pattern is used with `fullmatch`: `re.match` with `$` accepts a trailing newline,
# which then reached DDL, paths and Dagster names.
IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# Kafka's own rule for topic names (kafka.common.internals.Topic): at most 249 of these characters.
TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
# Riverhouse's own columns (_topic, _event_date, _status, _left_*...) start with '_', so a
# field or output column may not: it would duplicate or shadow one of them.
SYSTEM_COLUMN_PREFIX = "_"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_identifier(value: str, what: str = "identifier") -> str:
    if not isinstance(value, str) or not IDENTIFIER_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a safe SQL identifier: use letters, digits and '_', "
            "starting with a letter or '_', at most 63 characters"
        )
    return value


def check_topic(value: str, what: str = "topic") -> str:
    if not isinstance(value, str) or not TOPIC_RE.fullmatch(value) or value in {".", ".."}:
        raise ValueError(f"{what} {value!r} is not a legal Kafka topic name (letters, digits, '.', '_', '-')")
    return value


def check_column_name(value: str, what: str = "field") -> str:
    check_identifier(value, what)
    if value.startswith(SYSTEM_COLUMN_PREFIX):
        raise ValueError(
            f"{what} {value!r} starts with '{SYSTEM_COLUMN_PREFIX}', which is reserved for Riverhouse's own "
            "columns (_topic, _offset, _event_date, ...): rename it"
        )
    return value


class NotUtf8Error(ValueError):
    """A config file that is not UTF-8 text; the message says where and what to do."""


def read_utf8(path: Path) -> str:
    """A config file's text. UTF-8, with or without a byte-order mark (editors on Windows write one);
    anything else raises NotUtf8Error naming the first bad byte's line and column. OSError passes through."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        bad = data[exc.start : exc.start + 1].hex()
        encoding = "UTF-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "another encoding (e.g. Latin-1)"
        raise NotUtf8Error(
            f"not UTF-8 text: byte 0x{bad} at line {line}, column {column}; the file looks like {encoding}: "
            "save it as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8 in > out`)"
        ) from None


def printable(text: str) -> str:
    """`text` with any surrogate escape (undecodable bytes) written as a backslash escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ProblemsError(Exception):
    """Input that cannot be used; `problems` holds (where, what, hint) triples, one line each."""

    def __init__(self, source: str, problems: list[tuple[str, str, str]]):
        # A file name that is not UTF-8 arrives with surrogate escapes, which no log handler, Dagster
        # snapshot or test report can encode: the bytes are shown escaped (\udcff) instead.
        source = printable(source)
        problems = [(printable(p), printable(m), printable(h)) for p, m, h in problems]
        self.source = source
        self.problems = problems
        lines = [f"{source}: {len(problems)} problem(s)"]
        for where, what, hint in problems:
            lines.append(f"  {where or '<root>'}: {what}" + (f" (hint: {hint})" if hint else ""))
        super().__init__("\n".join(lines))


class SpecError(ProblemsError):
    """A spec could not be loaded; `problems` holds (path, message, hint) triples."""
