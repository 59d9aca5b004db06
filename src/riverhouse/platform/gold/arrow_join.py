"""Local mode's join: the temporal lookups of `joins.evaluate`, computed with numpy on the driver.

`joins.evaluate` (Spark SQL) is the reference. For each driving event and each lookup it
picks the latest row (by event time, then Kafka partition and offset) with equal keys
whose event time is within the window of the driving event's (dimensions: no window),
then projects, filters and checks `require`. In local mode its cost was mostly moving
rows the driver already holds into the JVM and back (`createDataFrame`, `toArrow`),
plus a shuffle and sort for the "latest" pick.

Here the same pick is a sorted search: the lookup rows are sorted by (key, time,
partition, offset); for a driving event, the last row at or before `t + window` in its
key's run is the latest one not after the window, and it matches when it is not before
`t - window` either. This path takes only plans whose every output column is a plain
column and that have no WHERE, with keys of matching types (text or integers); anything
else goes to Spark. tests/spark/test_arrow_join.py checks the two give identical rows.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from riverhouse.platform.sql import JoinPlan, flat
from riverhouse.platform.state.tables import TS

PLAIN_COLUMN = re.compile(r"^`([A-Za-z0-9_]+)`$")
KEY_TYPES = (pa.string(), pa.int32(), pa.int64())
BIG = np.iinfo(np.int64).max


def _plain_projections(plan: JoinPlan) -> list[tuple[str, str]] | None:
    out = []
    for name, expr in plan.projections:
        match = PLAIN_COLUMN.match(expr)
        if match is None:
            return None
        out.append((name, match.group(1)))
    return out


# What `joins.evaluate` adds after the projections, in its order, as `toArrow()` types them.
META_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("_left_topic", pa.string()),
    ("_left_partition", pa.int32()),
    ("_left_offset", pa.int64()),
    ("_left_event_time", TS),
    ("_left_event_date", pa.date32()),
    ("_left_key", pa.string()),
    ("_matched", pa.bool_()),
    ("_late_match", pa.bool_()),
    ("_reason", pa.string()),
    ("_status", pa.string()),
]


def plain_gold_schema(spec: Any, plan: JoinPlan) -> pa.Schema | None:
    """The gold schema of a plan of plain columns, from the sources' field types (no Spark analysis).

    Spark's analysis of the query costs ~0.6 s per spec, 4 s in a fresh process; for these
    plans the answer is known. tests/spark/test_arrow_join.py checks it equals Spark's.
    """
    from riverhouse.platform.state.tables import field_arrow

    projections = _plain_projections(plan)
    if projections is None:
        return None
    types: dict[str, pa.DataType] = {}
    for alias, source in [(plan.driving_alias, plan.driving_source), *((s.alias, s.source) for s in plan.steps)]:
        for f in spec.sources[source].fields:
            types[flat(alias, f.name)] = field_arrow(f).type
    fields = [(name, types[column]) for name, column in projections] + META_COLUMNS
    return pa.schema([pa.field(name, typ, nullable=True) for name, typ in fields])


def _micros(column: Any) -> np.ndarray:
    return pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)


def _normal(column: Any) -> pa.Array:
    column = _chunk(column)
    return column.cast(pa.string()) if pa.types.is_large_string(column.type) else column


def _group_ids(left: list[Any], right: list[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """One integer per distinct key tuple, shared by both sides; -1 where a key part is null.

    None when a key pair's types differ (Spark would cast them; that stays Spark's job).
    """
    n_left = len(left[0])
    ids: np.ndarray | None = None
    valid = np.ones(n_left + len(right[0]), dtype=bool)
    for lcol, rcol in zip(left, right, strict=True):
        lcol, rcol = _normal(lcol), _normal(rcol)
        if lcol.type != rcol.type or lcol.type not in KEY_TYPES:
            return None
        encoded = pa.concat_arrays([lcol, rcol]).dictionary_encode()
        valid &= encoded.indices.is_valid().to_numpy(zero_copy_only=False)
        part = np.nan_to_num(encoded.indices.to_numpy(zero_copy_only=False), nan=0).astype(np.int64)
        ids = part if ids is None else np.unique(ids * (len(encoded.dictionary) + 1) + part, return_inverse=True)[1]
    assert ids is not None
    ids = np.where(valid, ids, -1)
    return ids[:n_left], ids[n_left:]


def _latest_within(
    left_ids: np.ndarray, left_t: np.ndarray, right: pa.Table, right_ids: np.ndarray, window_us: int | None
) -> np.ndarray:
    """Per left row: index of the matching right row, or -1."""
    if right.num_rows == 0 or len(left_ids) == 0:
        return np.full(len(left_ids), -1, dtype=np.int64)
    right_t = _micros(right.column("_event_time"))
    part = right.column("_partition").to_numpy(zero_copy_only=False).astype(np.int64)
    offset = right.column("_offset").to_numpy(zero_copy_only=False)
    upper = left_t + window_us if window_us is not None else np.full(len(left_t), BIG, dtype=np.int64)
    # Times as ranks, so (key, time) packs into one sortable integer.
    ranks = np.unique(np.concatenate([right_t, upper]), return_inverse=True)[1].astype(np.int64)
    span = int(ranks.max()) + 2
    right_code = np.where(right_ids >= 0, right_ids * span + ranks[: len(right_t)], -1)
    order = np.lexsort((offset, part, right_code))
    codes = right_code[order]
    query = left_ids * span + ranks[len(right_t) :]
    pos = np.searchsorted(codes, query, side="right") - 1
    found = order[np.clip(pos, 0, None)]
    ok = (pos >= 0) & (left_ids >= 0) & (right_ids[found] == left_ids)
    if window_us is not None:
        ok &= right_t[found] >= left_t - window_us
    return np.where(ok, found, -1)


def evaluate_arrow(spec: Any, plan: JoinPlan, driving: pa.Table, lookups: dict[str, pa.Table]) -> pa.Table | None:
    """`joins.evaluate(...).toArrow()` computed without Spark, or None when the plan needs Spark."""
    projections = _plain_projections(plan)
    if projections is None or plan.where is not None:
        return None
    sources = spec.sources
    driving_alias = plan.driving_alias
    left_key = sources[plan.driving_source].dedup_key
    if any(_normal(driving.column(c)).type not in KEY_TYPES for c in left_key):
        return None
    columns: dict[str, Any] = {
        flat(driving_alias, f.name): driving.column(f.name) for f in sources[plan.driving_source].fields
    }
    left_t = _micros(driving.column("_event_time"))
    left_kts = driving.column("_kafka_timestamp")
    count = driving.num_rows
    matched = pa.array(np.ones(count, dtype=bool))
    inner_ok = matched
    late: Any = pa.array(np.zeros(count, dtype=bool))
    for step in plan.steps:
        right = lookups[step.alias]
        ids = _group_ids(
            [columns[flat(k.base_alias, k.base_column)] for k in step.keys], [right.column(k.column) for k in step.keys]
        )
        if ids is None:
            return None
        window_us = int(step.window.total_seconds() * 1_000_000) if step.window is not None else None
        index = _latest_within(ids[0], left_t, right, ids[1], window_us)
        hit = index >= 0
        take = pa.array(index, mask=~hit)
        for f in sources[step.source].fields:
            columns[flat(step.alias, f.name)] = right.column(f.name).take(take)
        flag = pa.array(hit)
        matched = pc.and_(matched, flag)
        if step.kind == "inner":
            inner_ok = pc.and_(inner_ok, flag)
        right_kts = right.column("_kafka_timestamp").take(take)
        late = pc.or_kleene(late, pc.and_kleene(flag, pc.greater(right_kts, left_kts)))
    out: dict[str, Any] = {name: columns[column] for name, column in projections}
    key_text = [pc.cast(driving.column(c), pa.string()) for c in left_key]
    out.update(
        {
            "_left_topic": driving.column("_topic"),
            "_left_partition": driving.column("_partition"),
            "_left_offset": driving.column("_offset"),
            "_left_event_time": driving.column("_event_time"),
            "_left_event_date": driving.column("_event_date"),
            "_left_key": pc.binary_join_element_wise(*key_text, "\u0001", null_handling="skip"),
            "_matched": matched,
            "_late_match": late,
        }
    )
    reason = pa.nulls(count, pa.string())
    for name in reversed(plan.require):  # the first missing one names the row, as COALESCE does
        missing = pc.is_null(out[name])
        reason = pc.if_else(
            missing, pa.scalar(f"required field '{name}' is missing when the join window closed"), reason
        )
    status = pc.if_else(pc.invert(inner_ok), "unmatched", pc.if_else(pc.is_valid(reason), "rejected", "emitted"))
    out["_reason"] = pc.if_else(pc.equal(status, "rejected"), reason, pa.scalar(None, pa.string()))
    out["_status"] = status
    return pa.table({name: _chunk(value) for name, value in out.items()})


def _chunk(value: Any) -> pa.Array:
    return value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
