"""`riverhouse deploy-config` and `riverhouse import glassflow|kaflowsql`: moving onto Riverhouse."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from riverhouse.cli_support import err, fail, out


def deploy_config(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder to write into (the DAGSTER_HOME of the deployment)")],
    max_concurrent_runs: Annotated[int, typer.Option(help="Runs in progress at once, all pipelines")] = 4,
    runs_per_pipeline: Annotated[int, typer.Option(help="Runs of one pipeline at a time")] = 1,
    clickhouse_slots: Annotated[
        int, typer.Option(help="ClickHouse loads at once (the clickhouse pool); 1 for embedded chDB")
    ] = 1,
    workspace: Annotated[
        str,
        typer.Option(help="grpc: load the code server at $RIVERHOUSE_CODE_SERVER_HOST/PORT; module: load in-process"),
    ] = "grpc",
) -> None:
    """Write dagster.yaml (PostgreSQL storage, run queue, ClickHouse pool) and workspace.yaml for production."""
    from riverhouse.deploy import DeployConfigError, DeployOptions, required_env, write_deploy_config

    options = DeployOptions(
        max_concurrent_runs=max_concurrent_runs,
        runs_per_pipeline=runs_per_pipeline,
        clickhouse_slots=clickhouse_slots,
        workspace=workspace,
    )
    try:
        paths = write_deploy_config(out_dir, options)
    except DeployConfigError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write into {out_dir}: {exc.strerror or exc}")
    for path in paths:
        out.print(f"wrote {path}", highlight=False)
    out.print(
        f"set DAGSTER_HOME={out_dir.resolve()} and {', '.join(required_env(options))} for the daemon, "
        "the webserver and the code server (docs/deployment.md)",
        highlight=False,
    )


import_app = typer.Typer(help="Import other tools' pipeline configs as Riverhouse specs.", no_args_is_help=True)
ImportOutput = Annotated[
    Path | None, typer.Option("-o", "--output", help="Spec file to write (default: print the spec on stdout)")
]
StrictOption = Annotated[
    bool, typer.Option("--strict", help="Exit 1 and write nothing when any setting could not be carried over")
]
ForceOption = Annotated[bool, typer.Option("--force", help="Overwrite the output file if it exists")]


@import_app.command("glassflow")
def import_glassflow_cmd(
    config: Annotated[Path, typer.Argument(help="GlassFlow pipeline config (JSON or YAML, v2 or v3)")],
    output: ImportOutput = None,
    strict: StrictOption = False,
    force: ForceOption = False,
) -> None:
    """Write a spec from a GlassFlow pipeline config; print what could not be mapped, and why."""
    from riverhouse.platform.importers.glassflow import import_glassflow

    _import(lambda: import_glassflow(config, output), output, strict, force)


@import_app.command("kaflowsql")
def import_kaflowsql_cmd(
    pipeline: Annotated[Path, typer.Argument(help="KaflowSQL pipeline (YAML)")],
    config: Annotated[
        Path | None,
        typer.Option(
            help="KaflowSQL's global config.yaml: its kafka.brokers, and Avro input (useAvro, schemaRegistry)"
        ),
    ] = None,
    output: ImportOutput = None,
    strict: StrictOption = False,
    force: ForceOption = False,
) -> None:
    """Write a SQL-pipeline spec from a KaflowSQL pipeline; print what could not be mapped, and why."""
    from riverhouse.platform.importers.kaflowsql import import_kaflowsql

    _import(lambda: import_kaflowsql(pipeline, config), output, strict, force)


def _import(run_import: Any, output: Path | None, strict: bool, force: bool) -> None:
    from riverhouse.platform.importers.report import ImporterError

    if output is not None and output.exists() and not force:
        fail(f"{output} exists; pass --force to overwrite it")
    try:
        result = run_import()
    except ImporterError as exc:
        fail(str(exc))  # fail() escapes it
    # Escaped: settings are written like `sources[0]` and `key [id]`, which rich would take for markup.
    for note in result.notes:
        err.print(f"[dim]note:[/] {escape(note)}", highlight=False)
    for item in result.unmapped:
        err.print(f"[yellow]not carried over:[/] {escape(item.setting)}: {escape(item.reason)}", highlight=False)
    if strict and result.unmapped:
        fail(f"{len(result.unmapped)} setting(s) could not be carried over (--strict): nothing written")
    if output is None:
        # Nothing to place files beside: the importer reported the certificates it could not write.
        assert not result.files
        print(result.to_yaml(), end="")
        return
    taken = [path for path in result.files if Path(path).exists()]
    if taken and not force:
        fail(f"{', '.join(taken)} exist(s); pass --force to overwrite")
    # The certificates first: a spec on disk always names files that exist (but the client key, see the note).
    for path, text in [*result.files.items(), (str(output), result.to_yaml())]:
        try:
            Path(path).write_text(text)
        except OSError as exc:
            fail(f"cannot write {path}: {exc.strerror or exc}")
    for path in result.files:
        err.print(f"[green]wrote[/] {escape(path)} (a certificate named in kafka.security)", highlight=False)
    err.print(
        f"[green]wrote[/] {escape(str(output))} from {result.origin} {escape(result.path)}: "
        f"{len(result.unmapped)} setting(s) not carried over; check it with `riverhouse validate {output}`",
        highlight=False,
    )
