"""`riverhouse registry start|stop|status`: the local schema registry (Apicurio Registry)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from riverhouse.cli_support import HomeOption, err, fail, out, settings_for
from riverhouse.platform.avro import local_registry
from riverhouse.platform.runtime.spark import JavaMissingError

registry_app = typer.Typer(
    help="The local schema registry (Apicurio Registry, Confluent-compatible API) for Avro sources.",
    no_args_is_help=True,
)


def registry_dir(home: Path | None) -> Path:
    return settings_for(home).home / "registry"


@registry_app.command("start")
def registry_start(home: HomeOption = None) -> None:
    """Start the local schema registry on 127.0.0.1 in the background; schemas and logs in <home>/registry."""
    state_dir = registry_dir(home)
    was_running = local_registry.status(state_dir)
    started = time.monotonic()
    if not was_running:
        err.print("starting the local schema registry (Apicurio Registry)...", highlight=False)
    try:
        state = local_registry.start(state_dir)
    except (local_registry.LocalRegistryError, JavaMissingError) as exc:
        fail(str(exc))
    verb = "already running" if was_running else f"started in {time.monotonic() - started:.1f}s"
    out.print(f"schema registry {verb}: [bold]{state.api}[/] (pid {state.pid})", highlight=False)
    out.print(
        f"  a source reads through it with `schema_registry: {{url: {state.api}}}`\n  [dim]data and logs in {state_dir}[/]",
        highlight=False,
    )


@registry_app.command("stop")
def registry_stop(home: HomeOption = None) -> None:
    """Stop the local schema registry (its schemas stay on disk for the next start)."""
    if local_registry.stop(registry_dir(home)):
        out.print("schema registry stopped")
    else:
        out.print("schema registry was not running")


@registry_app.command("status")
def registry_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON")] = False,
    home: HomeOption = None,
) -> None:
    """Print whether the local schema registry runs, and its URL. Exit 1 when it does not."""
    state_dir = registry_dir(home)
    state = local_registry.status(state_dir)
    report: dict[str, Any] = {"running": False, "url": None, "state_dir": str(state_dir)}
    if state:
        report |= {
            "running": True,
            "url": state.api,
            "pid": state.pid,
            "uptime_s": round(time.time() - state.started_at),
        }
    if as_json:
        print(json.dumps(report), flush=True)
    elif state:
        out.print(f"schema registry running: {state.api} (pid {state.pid}, up {report['uptime_s']}s)", highlight=False)
    else:
        out.print("schema registry is not running (start it with `riverhouse registry start`)", highlight=False)
    if not state:
        raise typer.Exit(1)
