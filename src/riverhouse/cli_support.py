"""What every `riverhouse` command shares: the consoles, the --home option, settings and errors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

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
