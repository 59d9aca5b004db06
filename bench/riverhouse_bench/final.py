"""query_vs_final: ClickHouse's own dedup (ReplacingMergeTree + FINAL) against Riverhouse's clean table."""

from __future__ import annotations

import json
import statistics
import time
from datetime import date
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from riverhouse.platform.kafka.generator import orders
from riverhouse.platform.sink.clickhouse import create_table_sql, open_client, qualified_table, quote
from riverhouse_bench.common import (
    CLICKHOUSE_BATCH_ROWS,
    FINAL_QUERIES,
    RMT_INSERT_ROWS,
    generated_orders,
    orders_spec,
)

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench


def query_vs_final(bench: Bench, count: int, seed: int, clean_table: str) -> dict[str, Any]:
    """The raw events as Kafka carried them, in a ReplacingMergeTree (`FINAL`), vs Riverhouse's table.

    The ReplacingMergeTree gets every record produced to the topic (duplicates
    included), in produce order, in inserts of `RMT_INSERT_ROWS` as a Kafka sink
    would flush them, and is queried as a live table is: parts not merged yet.
    Each query's answer is checked against the generator's distinct events.
    """
    records, stats = orders(bench.orders_config(count, seed))
    raw = [json.loads(value) for _, value in records if value]
    events = stats.events
    table = pa.table(
        {
            "order_id": [e["order_id"] for e in raw],
            "user_id": [e["user_id"] for e in raw],
            "amount": pa.array([int(e["amount"]) for e in raw], pa.int32()),
        }
    )
    by_user: dict[str, int] = {}
    for e in events:
        by_user[e["user_id"]] = by_user.get(e["user_id"], 0) + int(e["amount"])
    top_users = sorted(by_user.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    expected = {
        "count_sum_uniq": (len(events), sum(int(e["amount"]) for e in events), len(events)),
        "count": (len(events),),
        "sum_amount": (sum(int(e["amount"]) for e in events),),
        "top_users": tuple(top_users),
    }
    return _versus_final(bench, table, quote(clean_table), expected)


def query_vs_final_at_scale(bench: Bench, distinct: int) -> dict[str, Any]:
    """The same comparison on `distinct` generated orders (+10% duplicates), built in ClickHouse directly.

    Kafka's retention and the pipeline's run time keep the main scenario at the bench's
    event count; here the clean table is made with the DDL Riverhouse's loader uses,
    holding what the pipeline would leave in it (one row per order), so only the
    tables' size differs. Expected answers come from the generator's arrays.
    """
    import numpy as np

    rng = np.random.default_rng(distinct)
    ids = np.arange(distinct)
    raw_ids = np.concatenate([ids, rng.choice(ids, size=distinct // 10)])
    raw_ids = raw_ids[rng.permutation(len(raw_ids))]
    users = ids % 5000
    amounts = (ids % 10).astype("int64")

    totals = np.bincount(users, weights=amounts, minlength=5000).astype("int64")
    top = sorted(((f"u{u:06d}", int(t)) for u, t in enumerate(totals)), key=lambda kv: (-kv[1], kv[0]))[:10]
    total = int(amounts.sum())
    expected = {
        "count_sum_uniq": (distinct, total, distinct),
        "count": (distinct,),
        "sum_amount": (total,),
        "top_users": tuple(top),
    }
    spec = orders_spec(f"bench_final_{distinct}", f"bench_final_{distinct}")
    clean = generated_orders(ids)
    clean = clean.append_column("_event_date", pa.array([date(2026, 1, 1)] * distinct, pa.date32()))
    with open_client(bench.settings.clickhouse_dsn) as client:
        client.command(f"DROP TABLE IF EXISTS {qualified_table(spec)}")
        client.command(create_table_sql(spec))
        for offset in range(0, distinct, CLICKHOUSE_BATCH_ROWS):
            client.insert_arrow(qualified_table(spec), clean.slice(offset, CLICKHOUSE_BATCH_ROWS))
    raw = generated_orders(raw_ids).select(["order_id", "user_id", "amount"])
    result = _versus_final(bench, raw, qualified_table(spec), expected)
    result["generated"] = (
        "straight into ClickHouse (the clean table with the loader's DDL, one row per "
        "order): Kafka's retention cannot hold this many events"
    )
    return result


def _versus_final(
    bench: Bench, raw: pa.Table, clean_table: str, expected: dict[str, tuple[Any, ...]]
) -> dict[str, Any]:
    """`raw` into a ReplacingMergeTree in `RMT_INSERT_ROWS` inserts; FINAL_QUERIES on it and on `clean_table`."""
    with open_client(bench.settings.clickhouse_dsn) as client:
        client.command("DROP TABLE IF EXISTS bench_rmt")
        client.command(
            "CREATE TABLE bench_rmt (order_id String, user_id String, amount Int32) "
            "ENGINE = ReplacingMergeTree ORDER BY order_id"
        )
        for offset in range(0, raw.num_rows, RMT_INSERT_ROWS):
            client.insert_arrow("bench_rmt", raw.slice(offset, RMT_INSERT_ROWS))
        parts = int(client.command("SELECT count() FROM system.parts WHERE active AND table = 'bench_rmt'"))

        def timed(sql: str, one_row: bool) -> tuple[float, tuple[Any, ...]]:
            times, answer = [], ()
            for _ in range(bench.cfg.query_runs):
                started = time.perf_counter()
                rows = client.query(sql).result_rows
                times.append(time.perf_counter() - started)
                answer = tuple(rows[0]) if one_row else tuple(tuple(r) for r in rows)
            return statistics.median(times), answer

        queries: dict[str, Any] = {}
        for name, template in FINAL_QUERIES.items():
            one_row = name != "top_users"
            final_s, final_answer = timed(template.format(t="bench_rmt FINAL"), one_row)
            clean_s, clean_answer = timed(template.format(t=clean_table), one_row)
            want = expected[name]
            queries[name] = {
                "sql": template.format(t="<table>"),
                "final_s": round(final_s, 5),
                "clean_s": round(clean_s, 5),
                "speedup": round(final_s / clean_s, 3) if clean_s else None,
                "final_exact": final_answer == want,
                "clean_exact": clean_answer == want,
            }
        client.command("DROP TABLE IF EXISTS bench_rmt")
    main = queries["count_sum_uniq"]
    return {
        "events": raw.num_rows,
        "seconds": main["final_s"] + main["clean_s"],
        "events_per_s": None,
        "final_s": main["final_s"],
        "clean_s": main["clean_s"],
        "speedup": main["speedup"],
        "final_exact": main["final_exact"],
        "clean_exact": main["clean_exact"],
        "exact": all(q["final_exact"] and q["clean_exact"] for q in queries.values()),
        "runs": bench.cfg.query_runs,
        "rmt_parts": parts,
        "rmt_insert_rows": RMT_INSERT_ROWS,
        "expected": list(expected["count_sum_uniq"]),
        "queries": queries,
    }
