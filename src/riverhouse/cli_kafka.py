"""`riverhouse kafka start|stop|status`: the local Apache Kafka broker."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from riverhouse.cli_support import HomeOption, err, fail, out, settings_for
from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.runtime.spark import JavaMissingError
from riverhouse.platform.state.settings import Settings

kafka_app = typer.Typer(
    help="The local Kafka: a single-node Apache Kafka broker (KRaft) for development and demos.",
    no_args_is_help=True,
)


@kafka_app.command("start")
def kafka_start(
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="Also open a SASL_SSL listener (SCRAM-SHA-512) and an SSL listener requiring client "
            "certificates, with a throwaway CA under <home>/kafka/secure",
        ),
    ] = False,
    heap: Annotated[str, typer.Option(help="The broker JVM's maximum heap (-Xmx)")] = local_kafka.DEFAULT_HEAP,
    home: HomeOption = None,
) -> None:
    """Start the local Apache Kafka broker (KRaft, one node) in the background; data in <home>/kafka."""
    settings = settings_for(home)
    was_running = local_kafka.status(settings.kafka_state_dir)
    started = time.monotonic()
    if not was_running:
        err.print("starting the local Kafka broker (Apache Kafka, KRaft)...", highlight=False)
    try:
        state = local_kafka.start(settings.kafka_state_dir, secure=secure, heap=heap)
    except (local_kafka.LocalKafkaError, JavaMissingError) as exc:
        fail(str(exc))
    verb = "already running" if was_running else f"started in {time.monotonic() - started:.1f}s"
    out.print(f"local Kafka {verb}: bootstrap [bold]{state.bootstrap}[/] (pid {state.pid})", highlight=False)
    _print_listeners(state, settings)


def _print_listeners(state: local_kafka.LocalKafkaState, settings: Settings) -> None:
    out.print(f"[dim]data and logs in {settings.kafka_state_dir}[/]", highlight=False)
    if state.secure:
        secure = settings.kafka_state_dir / "secure"
        out.print(
            f"  SASL_SSL {state.listeners['SASL_SSL']}  (SCRAM-SHA-512, user and password in "
            f"{secure / 'credentials.json'}, CA {secure / 'ca.pem'})\n"
            f"  SSL      {state.listeners['SSL']}  (client certificate required: {secure / 'client.pem'}, "
            f"key {secure / 'client.key'})",
            highlight=False,
        )


@kafka_app.command("stop")
def kafka_stop(home: HomeOption = None) -> None:
    """Stop the local Kafka broker (topics and offsets stay on disk for the next start)."""
    settings = settings_for(home)
    if local_kafka.stop(settings.kafka_state_dir):
        out.print("local Kafka stopped")
    else:
        out.print("local Kafka was not running")


@kafka_app.command("status")
def kafka_status(home: HomeOption = None) -> None:
    """Print whether the local Kafka runs, and its addresses. Exit 1 when it does not."""
    settings = settings_for(home)
    state = local_kafka.status(settings.kafka_state_dir)
    if state is None:
        out.print("local Kafka is not running (start it with `riverhouse kafka start`)")
        raise typer.Exit(1)
    out.print(
        f"local Kafka running: bootstrap {state.bootstrap} (pid {state.pid}, up {time.time() - state.started_at:.0f}s)",
        highlight=False,
    )
    _print_listeners(state, settings)
