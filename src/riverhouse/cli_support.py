"""What every `riverhouse` command shares: the consoles, the --home option, settings and errors."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from riverhouse.platform.errors import EngineUnavailable
from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.runtime import engine
from riverhouse.platform.runtime.spark import REMOTE_ENV, JavaMissingError, SparkConfError, redact_remote
from riverhouse.platform.spec_base import SpecError
from riverhouse.platform.state.settings import Settings, SettingsError

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home",
        help="State folder (warehouse, checkpoints, ClickHouse, local Kafka). "
        "Default: $RIVERHOUSE_HOME or ./.riverhouse",
    ),
]


def fail(message: str, code: int = 1) -> None:
    # Messages quote user input (spec values, paths): escaped, or a '[/x]' in it breaks rich's markup.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def settings_for(home: Path | None) -> Settings:
    try:
        return Settings.from_env(home)
    except SettingsError as exc:
        fail(str(exc))
        raise AssertionError("unreachable") from None


BOOTSTRAP_HELP = (
    "Kafka bootstrap servers (default: RIVERHOUSE_KAFKA_BOOTSTRAP if set, else the --spec's, else the local Kafka)"
)
# Where the bootstrap servers of a command's Kafka come from (the hints differ).
FROM_OPTION = "--bootstrap"
FROM_ENV = "RIVERHOUSE_KAFKA_BOOTSTRAP"
FROM_SPEC = "the spec's kafka.bootstrap_servers"
FROM_LOCAL = "the local Kafka"
# One metadata request before a command starts its work: the local broker answers in milliseconds,
# a remote one (SASL_SSL included) within a second or two.
KAFKA_CHECK_TIMEOUT_S = 5.0


def load_spec_or_fail(path: Path) -> Any:
    """The pipeline spec in `path`, or its problems on stderr and exit 1."""
    from riverhouse.platform.spec import load_spec

    try:
        return load_spec(path)
    except SpecError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        err.print(f"[dim]run `riverhouse validate {escape(str(path))}` for hints[/]")
        raise typer.Exit(1) from None


def kafka_client_config(settings: Settings, spec: Any | None, bootstrap: str | None) -> tuple[dict[str, Any], str]:
    """librdkafka settings (the spec's connection, or plain bootstrap servers), and where the servers come from.

    The servers are looked up in the order a run uses (kafka/bootstrap.py): --bootstrap (as the operator's
    override), RIVERHOUSE_KAFKA_BOOTSTRAP, the spec's kafka.bootstrap_servers, the running local Kafka.
    """
    from riverhouse.platform.kafka import local_kafka

    source = FROM_OPTION if bootstrap else FROM_ENV if settings.kafka_bootstrap else FROM_LOCAL
    if spec is not None:
        from riverhouse.platform.kafka.bootstrap import resolve_bootstrap
        from riverhouse.platform.kafka.client import librdkafka_config

        if bootstrap:
            settings = settings.with_(kafka_bootstrap=bootstrap)
        if source == FROM_LOCAL and spec.kafka.bootstrap_servers != "local":
            source = FROM_SPEC
        try:
            return librdkafka_config(spec.kafka, resolve_bootstrap(spec, settings)), source
        except (SpecError, RuntimeError) as exc:  # a local Kafka that is not running; `${env:...}` unset
            fail(str(exc))
    address = bootstrap or settings.kafka_bootstrap
    if not address:
        state = local_kafka.status(settings.kafka_state_dir)
        if state is None:
            fail(
                "the local Kafka is not running: start it with `riverhouse kafka start`, "
                f"or name a broker with --bootstrap, --spec or {FROM_ENV}"
            )
        assert state is not None
        address = state.bootstrap
    return {"bootstrap.servers": address, "log_level": 0}, source


def require_kafka(config: dict[str, Any], source: str, settings: Settings) -> None:
    """Fail with what to do unless the Kafka of `config` answers a metadata request within seconds."""
    from riverhouse.platform.kafka import local_kafka
    from riverhouse.platform.kafka.client import KafkaSourceError, require_reachable

    try:
        require_reachable(config, KAFKA_CHECK_TIMEOUT_S)
    except KafkaSourceError as exc:
        state = local_kafka.status(settings.kafka_state_dir) if source == FROM_LOCAL else None
        hints = {
            FROM_OPTION: "check the address given with --bootstrap; to use the local Kafka instead, start it "
            "with `riverhouse kafka start` and leave out --bootstrap",
            FROM_ENV: f"{FROM_ENV} names it: point that variable at a running broker, or unset it and start the "
            "local Kafka with `riverhouse kafka start`",
            FROM_SPEC: f"{FROM_SPEC} names it: check it and kafka.security, or name another broker with "
            f"--bootstrap or {FROM_ENV}",
            FROM_LOCAL: (
                f"the local Kafka (pid {state.pid}) does not answer: see its logs in "
                f"{settings.kafka_state_dir / 'logs'}, or restart it with `riverhouse kafka stop` and "
                "`riverhouse kafka start`"
                if state
                else "the local Kafka stopped: start it with `riverhouse kafka start`"
            ),
        }
        hint = hints[source]
        fail(f"{exc}. {hint[0].upper()}{hint[1:]}")


EngineOption = Annotated[
    bool,
    typer.Option(
        "--engine/--no-engine",
        help=f"Start the local engine (a Spark Connect server) when {REMOTE_ENV} names none and it is not "
        "running; --no-engine: runs start Spark in their own process",
    ),
]


def start_local_engine(settings: Settings, wanted: bool, short_lived: bool = False) -> tuple[str, bool]:
    """Where runs get Spark, and whether this command started the engine (it then stops it).

    `short_lived`: the engine serves this command only (its JVM gets SHORT_LIVED_ENGINE_JAVA_OPTIONS).
    """
    if os.environ.get(REMOTE_ENV):
        return f"Spark Connect at {redact_remote(os.environ[REMOTE_ENV])} ({REMOTE_ENV})", False
    running = engine.status(settings.engine_state_dir)
    if running:
        return f"Spark Connect at {running.url} (the running local engine, pid {running.pid})", False
    if not wanted:
        return "Spark in each run's own process (no engine)", False
    err.print("starting the engine (a Spark Connect server)...", highlight=False)
    started = time.monotonic()
    try:
        options = engine.SHORT_LIVED_ENGINE_JAVA_OPTIONS if short_lived else ""
        state = engine.start(settings.engine_state_dir, java_options=options)
    except (engine.EngineError, JavaMissingError, SparkConfError) as exc:
        fail(str(exc))
        raise AssertionError("unreachable") from None
    took = time.monotonic() - started
    return f"Spark Connect at {state.url} (local engine started in {took:.0f}s, pid {state.pid})", True


def guarded(action: Any) -> Any:
    """Run `action`, turning the errors a user can hit into one clear message and exit 1."""
    from riverhouse.platform.kafka.client import KafkaSourceError
    from riverhouse.platform.pipeline import PipelineError
    from riverhouse.platform.runtime.metrics import MetricsError
    from riverhouse.platform.sink.clickhouse import ClickHouseLoadError
    from riverhouse.platform.sink.topic_ledger import TopicSinkError

    try:
        return action()
    except (
        PipelineError,
        ClickHouseLoadError,
        TopicSinkError,
        KafkaSourceError,
        JavaMissingError,
        MetricsError,
        SpecError,
        local_kafka.LocalKafkaError,
        EngineUnavailable,
        engine.EngineError,
        SparkConfError,
    ) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted", 130)


def print_summary(title: str, summary: dict[str, Any]) -> None:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, dict | list):
            continue
        table.add_row(key.replace("_", " "), f"{value:,}" if isinstance(value, int) else str(value))
    out.print(table)
