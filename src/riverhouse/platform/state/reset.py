"""`riverhouse reset PIPELINE`: forget everything one pipeline has written, so it starts over from Kafka.

What the error messages that send users here need: a Delta table written by another spec
(tables.ensure_table), or a ClickHouse table loaded from a re-created silver table
(clickhouse.last_loaded_version), or a Kafka sink's topic produced from a re-created table
(sink/topic.py). Removed: the pipeline's Delta tables (bronze, quarantine, silver, gold, gold
quarantine), its Spark checkpoints (so its streams re-read Kafka from the spec's starting
offsets), its ClickHouse sink table and that table's ledger rows. A Kafka sink's topic keeps its
records (its consumers own them): its ledger gets a record saying the pipeline starts over, so
the next run produces every row again. Nothing of another pipeline is touched.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from riverhouse.platform.sink.clickhouse import LEDGER_TABLE, ledger_table, open_client, qualified_table, with_retries
from riverhouse.platform.sink.topic import reset_topic_sink
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import checkpoint_dir, pipeline_lock
from riverhouse.platform.state.settings import Settings
from riverhouse.platform.state.tables import TableLayout

LAYERS = ("bronze", "quarantine", "silver", "gold", "gold_quarantine")


class ResetError(RuntimeError):
    pass


@dataclass
class ResetPlan:
    """What a reset removes; shown to the user before they confirm."""

    folders: list[Path] = field(default_factory=list)
    clickhouse_table: str = ""
    ledger: str = ""
    topics: dict[str, str] = field(default_factory=dict)  # Kafka sink topic -> its ledger topic

    def describe(self) -> list[str]:
        lines = [f"delete {p}" for p in self.folders]
        if self.clickhouse_table:
            lines.append(f"drop ClickHouse table {self.clickhouse_table} and its rows in {self.ledger}")
        for topic, ledger in self.topics.items():
            lines.append(
                f"record in Kafka topic {ledger} that the pipeline starts over: topic {topic} keeps its records, and "
                "the next run produces every row to it again"
            )
        return lines


def plan_reset(spec: PipelineSpec, settings: Settings) -> ResetPlan:
    if "://" in settings.warehouse:
        raise ResetError(
            f"the warehouse {settings.warehouse} is not a local folder: delete the pipeline's tables under "
            f"<warehouse>/<layer>/{spec.name} with your storage tools, then run reset with a local warehouse "
            "or drop the ClickHouse table by hand"
        )
    layout = TableLayout(settings.warehouse, spec.name)
    folders = [Path(layout.path(layer, "_")).parent for layer in LAYERS]
    folders.append(Path(settings.checkpoints) / spec.name)
    clickhouse = spec.clickhouse_sink is not None
    return ResetPlan(
        folders=[p for p in folders if p.exists()],
        clickhouse_table=qualified_table(spec) if clickhouse else "",
        ledger=ledger_table(spec) if clickhouse else "",
        topics={sink.topic: sink.ledger for sink in spec.topic_sinks},
    )


def reset_pipeline(
    spec: PipelineSpec,
    settings: Settings,
    log: Callable[[str], None] = print,
    before_delete: Callable[[], None] | None = None,
) -> ResetPlan:
    """Remove what `plan_reset` lists; refuses while a run of the pipeline holds one of its locks.

    `before_delete` runs once the locks are held (Pipeline.reset: stop resident queries on the engine).
    """
    plan = plan_reset(spec, settings)
    with ExitStack() as locks:
        # The locks runs take: a running pipeline is never reset under its feet.
        for source in spec.sources:
            locks.enter_context(pipeline_lock(checkpoint_dir(settings, spec.name, source), spec.name))
        pipeline_root = Path(settings.checkpoints) / spec.name
        for name in ("gold.lock", "sink.lock"):
            locks.enter_context(pipeline_lock(pipeline_root, spec.name, name=name))
        if before_delete is not None:
            before_delete()
        plan = plan_reset(spec, settings)  # again: taking the locks may have created the checkpoint folders
        for sink in spec.topic_sinks:  # first: while the tables are there, the sink refuses a re-created one
            if reset_topic_sink(spec, sink, settings, log):
                log(
                    f"recorded in {sink.ledger} that pipeline {spec.name} starts over (topic {sink.topic} keeps its records)"
                )
        if plan.clickhouse_table:
            _reset_clickhouse(spec, settings, plan, log)
        for folder in plan.folders:
            try:
                shutil.rmtree(folder)
            except OSError as exc:
                raise ResetError(f"could not delete {folder}: {exc.strerror}; delete it by hand") from None
            log(f"deleted {folder}")
    return plan


def _reset_clickhouse(spec: PipelineSpec, settings: Settings, plan: ResetPlan, log: Callable[[str], None]) -> None:
    with open_client(settings.clickhouse_dsn, log=log) as client:
        with_retries(
            lambda: client.command(f"DROP TABLE IF EXISTS {plan.clickhouse_table}"),
            f"dropping {plan.clickhouse_table}",
            log=log,
        )
        if client.command(
            "SELECT count() FROM system.tables WHERE database = %(db)s AND name = %(t)s",
            parameters={"db": spec.sink.database or client.command("SELECT currentDatabase()"), "t": LEDGER_TABLE},
        ):
            with_retries(
                lambda: client.command(
                    f"DELETE FROM {plan.ledger} WHERE pipeline = %(p)s AND target = %(t)s",
                    parameters={"p": spec.name, "t": spec.sink.table},
                ),
                f"deleting {spec.name}'s rows from {plan.ledger}",
                log=log,
            )
        log(f"dropped ClickHouse table {plan.clickhouse_table} and its ledger rows")
