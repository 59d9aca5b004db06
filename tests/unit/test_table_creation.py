"""`ensure_delta_table` on tables that exist: their columns come from the Delta log, without Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from riverhouse.platform.state.tables import ensure_delta_table

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([pa.field("order_id", pa.string()), pa.field("amount", pa.int64())])


class NoSpark:
    """Any use of Spark fails the test: an existing table needs none."""

    def __getattr__(self, name: str) -> None:
        raise AssertionError(f"Spark was asked for {name!r}")


def test_existing_tables_are_checked_from_their_log_and_a_missing_column_is_named(tmp_path: Path) -> None:
    full, narrow = str(tmp_path / "full"), str(tmp_path / "narrow")
    write_deltalake(full, pa.table({"order_id": ["a"], "amount": [1]}, schema=SCHEMA))
    write_deltalake(narrow, pa.table({"order_id": ["a"]}))
    ensure_delta_table(NoSpark(), full, SCHEMA, [])  # exists with every column: nothing to do
    with pytest.raises(RuntimeError, match=r"lacks column\(s\) amount: it was written by another spec"):
        ensure_delta_table(NoSpark(), narrow, SCHEMA, [])
