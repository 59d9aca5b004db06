"""`riverhouse engine start|stop|status|archive`: the warm Spark engine (a Spark Connect server)."""

from __future__ import annotations

import json
import os
import time
from typing import Annotated

import typer

from riverhouse.cli_support import HomeOption, err, fail, out, settings_for
from riverhouse.platform.errors import EngineUnavailable
from riverhouse.platform.runtime import engine
from riverhouse.platform.runtime.spark import REMOTE_ENV, JavaMissingError, SparkConfError, redact_remote
from riverhouse.platform.state.settings import Settings

engine_app = typer.Typer(
    help="The engine: a Spark Connect server that stays warm; every run of this home attaches to it.",
    no_args_is_help=True,
)


@engine_app.command("start")
def engine_start(
    memory: Annotated[
        str, typer.Option(help=f"The engine's driver memory (JVM heap; ${engine.MEMORY_ENV})")
    ] = engine.DEFAULT_MEMORY,
    master: Annotated[
        str | None,
        typer.Option(help="Spark master (default: $RIVERHOUSE_SPARK_MASTER, spark-defaults.conf, else local[2])"),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (default: a free one chosen at the first start, then kept)")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0 in a container)")] = "127.0.0.1",
    foreground: Annotated[
        bool,
        typer.Option(
            "--foreground", help="Run in this process (a container's main process): no state file, Ctrl-C stops it"
        ),
    ] = False,
    home: HomeOption = None,
) -> None:
    """Start the engine in the background and wait until a session works; state and logs in <home>/engine."""
    settings = settings_for(home)
    state_dir = settings.engine_state_dir
    try:
        if foreground:
            err.print(f"the engine runs in the foreground on {host}:{port or engine.CONNECT_PORT}", highlight=False)
            engine.run_foreground(state_dir, master, memory, host, port or engine.CONNECT_PORT)
        was_running = engine.status(state_dir)
        if not was_running:
            err.print("starting the engine (a Spark Connect server)...", highlight=False)
        started = time.monotonic()
        state = engine.start(state_dir, master=master, memory=memory, host=host, port=port)
    except (engine.EngineError, EngineUnavailable, JavaMissingError, SparkConfError) as exc:
        fail(str(exc))
    verb = "already running" if was_running else f"started in {time.monotonic() - started:.1f}s"
    out.print(f"engine {verb}: Spark Connect at [bold]{state.url}[/] (pid {state.pid})", highlight=False)
    _describe(state, settings)


def _describe(state: engine.EngineState, settings: Settings) -> None:
    used = engine.memory_used(state.pid) / 2**20
    out.print(
        f"  master {state.master}, driver memory {state.memory}, resident {used:,.0f} MiB (with its workers)\n"
        f"  runs of {settings.home} use it; elsewhere set {REMOTE_ENV}={state.url}\n"
        f"  [dim]logs in {settings.engine_state_dir / 'logs'}[/]",
        highlight=False,
    )


@engine_app.command("stop")
def engine_stop(home: HomeOption = None) -> None:
    """Stop the engine and the Python workers it started; runs of this home then use Spark in-process."""
    settings = settings_for(home)
    if engine.stop(settings.engine_state_dir):
        out.print("engine stopped")
    else:
        out.print("engine was not running")


@engine_app.command("status")
def engine_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON")] = False,
    home: HomeOption = None,
) -> None:
    """Where this home's runs get Spark: the configured or local engine, or in-process. Exit 1 when it is down."""
    settings = settings_for(home)
    configured = os.environ.get(REMOTE_ENV)
    state = engine.status(settings.engine_state_dir)
    if configured:
        try:
            engine.require_reachable(configured)
            answering = True
        except EngineUnavailable:
            answering = False
        report = {"engine": redact_remote(configured), "source": REMOTE_ENV, "running": answering}
    elif state:
        report = {"engine": state.url, "source": "local", "running": True, "pid": state.pid, "master": state.master}
        report |= {"memory": state.memory, "uptime_s": round(time.time() - state.started_at)}
        report["resident_bytes"] = engine.memory_used(state.pid)
    else:
        report = {"engine": None, "source": "local", "running": False}
    if as_json:
        out.print(json.dumps(report), highlight=False)
    elif configured:
        word = "answers" if report["running"] else "does NOT answer"
        out.print(f"runs use the engine {REMOTE_ENV} names: {report['engine']} ({word})", highlight=False)
    elif state:
        up = time.time() - state.started_at
        out.print(f"engine running: Spark Connect at {state.url} (pid {state.pid}, up {up:.0f}s)", highlight=False)
        _describe(state, settings)
    else:
        out.print(
            "engine is not running (start it with `riverhouse engine start`); runs of this home use Spark in-process",
            highlight=False,
        )
    if not report["running"]:
        raise typer.Exit(1)


@engine_app.command("archive")
def engine_archive() -> None:
    """Write the class-data archive engines start from (~6 s instead of ~9); `make install` runs it.

    Starts an engine in a scratch folder, runs a first batch's work on it (archive_training.py) and
    stops it: its JVM writes the classes it loaded (~55 s, ~230 MB in the jars folder). Run it again
    after changing the JDK or the jars.
    """
    err.print("writing the class-data archive: an engine is started, trained and stopped (~55 s)...", highlight=False)
    started = time.monotonic()
    try:
        made = engine.make_class_archive()
    except (engine.EngineError, EngineUnavailable, JavaMissingError, SparkConfError) as exc:
        fail(f"no class-data archive: {exc}")
    if made is None:
        fail("no class-data archive: the engine's JVM wrote none (see its log); engines start without one")
    out.print(f"class-data archive: {made} ({time.monotonic() - started:.0f}s)", highlight=False)
