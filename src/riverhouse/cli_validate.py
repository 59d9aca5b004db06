"""`riverhouse validate`: check pipeline specs, alone and together; --json for scripts and CI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from riverhouse.cli_support import err, out
from riverhouse.platform.spec import SpecError, check_together, load_spec
from riverhouse.platform.spec_base import printable
from riverhouse.platform.state.settings import dsn_database


def validate(
    files: Annotated[list[Path], typer.Argument(help="Pipeline spec files (YAML)")],
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object: valid (true when every file is), and per file, in order: valid, and its "
            "pipeline, sources and sinks, or its problems (field path, message, hint)",
        ),
    ] = False,
) -> None:
    """Check pipeline specs; print every problem with its field path and a hint. Exit 1 when one has a problem.

    Specs checked together must also fit together: distinct names, sink tables and sink topics.
    """
    loaded: list[tuple[str, Any]] = []
    problems: dict[int, SpecError] = {}  # by the file's position in `files`
    positions: list[int] = []  # of the loaded specs
    for position, path in enumerate(files):
        try:
            loaded.append((str(path), load_spec(path)))
            positions.append(position)
        except SpecError as exc:
            problems[position] = exc
    # A sink without `database:` lands in the DSN's database: compared as that one.
    accepted, clashes = check_together(loaded, dsn_database(os.environ.get("RIVERHOUSE_CLICKHOUSE_DSN", "")))
    fitting = {id(spec) for spec in accepted}
    # check_together refuses, in order, each spec that clashes with one before it: one error each.
    refused = [position for position, (_, spec) in zip(positions, loaded, strict=True) if id(spec) not in fitting]
    problems |= dict(zip(refused, clashes, strict=True))
    specs = {position: spec for position, (_, spec) in zip(positions, loaded, strict=True) if id(spec) in fitting}
    if as_json:
        print(json.dumps(_validation_report(files, specs, problems)))
    else:
        _print_validation(files, specs, problems)
    if problems:
        raise typer.Exit(1)


def _validation_report(files: list[Path], specs: dict[int, Any], problems: dict[int, SpecError]) -> dict[str, Any]:
    """What `validate --json` prints: per file, in the order given, its pipeline or its problems."""
    reports: list[dict[str, Any]] = []
    for position, path in enumerate(files):
        report: dict[str, Any] = {"file": printable(str(path)), "valid": position in specs}
        if position in specs:
            spec = specs[position]
            report["pipeline"] = spec.name
            report["sources"] = {name: source.topic for name, source in spec.sources.items()}
            if avro := {name: avro_fields(source) for name, source in spec.sources.items() if source.format == "avro"}:
                report["avro_fields"] = avro  # the fields an Avro source reads, resolved from its schema
            report["sinks"] = [
                {"kind": s.kind, "database": s.database, "table": s.table}
                if s.kind == "clickhouse"
                else {"kind": s.kind, "topic": s.topic}
                for s in spec.sinks
            ]
        else:
            # field: the path in the spec ("" for the file as a whole); hint: what to do, or null.
            report["problems"] = [
                {"field": where, "message": message, "hint": hint or None}
                for where, message, hint in problems[position].problems
            ]
        reports.append(report)
    return {"valid": not problems, "files": reports}


def _print_validation(files: list[Path], specs: dict[int, Any], problems: dict[int, SpecError]) -> None:
    # Problems on stderr, the valid specs on stdout; each in the order the files were given.
    for position in sorted(problems):
        exc = problems[position]
        err.print(f"[bold red]{escape(exc.source)}[/]: {len(exc.problems)} problem(s)", highlight=False)
        for where, message, hint in exc.problems:
            line = f"  [yellow]{escape(where or '<root>')}[/]: {escape(message)}"
            if hint:
                line += f"\n    [dim]hint: {escape(hint)}[/]"
            err.print(line, highlight=False)
    for position, spec in specs.items():
        out.print(
            f"[green]ok[/] {escape(str(files[position]))}: pipeline [bold]{spec.name}[/], sources "
            f"{', '.join(spec.sources)}, {'sinks' if len(spec.sinks) > 1 else 'sink'} {describe_sinks(spec)}",
            highlight=False,
        )
        for name, source in spec.sources.items():
            if source.format == "avro":
                where = f"registry {source.schema_registry.url}" if source.schema_registry else "avro_schema"
                fields = ", ".join(f"{f['name']} {f['type']}" for f in avro_fields(source))
                out.print(f"  {escape(name)}: Avro ({escape(where)}), fields {escape(fields)}", highlight=False)


def avro_fields(source: Any) -> list[dict[str, str]]:
    """An Avro source's fields as resolved (from its reader schema when the spec lists none)."""
    return [
        {"name": f.name, "type": f.type, **({"path": ".".join(f.segments)} if f.path else {})} for f in source.fields
    ]


def describe_sinks(spec: Any) -> str:
    """`orders`, `topic clean_orders`, ...: what a pipeline writes, in one line."""
    return ", ".join(s.table if s.kind == "clickhouse" else f"topic {s.topic}" for s in spec.sinks)
