"""Whole spec files that took `riverhouse validate` and the Dagster code location down on main (issue 27)."""

from __future__ import annotations

from tests.conftest import REPO

HOSTILE_FILES: dict[str, bytes] = {
    "huge_window.yaml": (REPO / "pipelines" / "orders_dedup.yaml").read_bytes().replace(b"window: 1h", b"window: 99999999999999999d"),
    "deep_query.yaml": (REPO / "pipelines" / "orders_sql.yaml").read_bytes().replace(b"SELECT ", b"SELECT " + b"(" * 3000 + b"1" + b")" * 3000 + b" AS deep, ", 1),
    "deep_yaml.yaml": b"name: deep\ndescription: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "not_utf8.yaml": b"name: orders\ndescription: caf\xe9 \xff\n",
    "bad_date.yaml": b"name: orders\ndescription: 2026-02-30\n",  # a date PyYAML builds, and fails to
    "control_char.yaml": b"name: orders\ndescription: a\xc2\x80b\n",  # UTF-8, but not a character YAML allows
}  # fmt: skip
