"""What an importer produced: the spec, where it came from, and what it could not carry over.

Shared by the GlassFlow and KaflowSQL importers, together with the few rules
both need (Go durations, identifiers from foreign names, the YAML text written).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import yaml

from riverhouse.platform.spec import IDENTIFIER_RE, MAX_WINDOW, PipelineSpec, SpecError, format_window, parse_spec
from riverhouse.platform.spec_base import ProblemsError

# Go's time.ParseDuration units: both projects are written in Go and read their
# windows, TTLs and delays with it ("1h30m", "168h", "500ms").
GO_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


class ImporterError(ProblemsError):
    """The input cannot be imported at all; `problems` holds (where, what, hint) triples."""


@dataclass(frozen=True)
class Unmapped:
    """A setting of the foreign config that the written spec does not carry, and why."""

    setting: str
    reason: str


@dataclass
class ImportResult:
    spec: dict[str, Any]
    origin: str  # e.g. "GlassFlow pipeline config v3"
    path: str
    unmapped: list[Unmapped] = field(default_factory=list)
    # Things that were carried over but behave differently; they do not fail --strict.
    notes: list[str] = field(default_factory=list)
    # Public files the spec names (certificates for kafka.security): absolute path -> text, written beside the spec.
    files: dict[str, str] = field(default_factory=dict)

    def drop(self, setting: str, reason: str) -> None:
        self.unmapped.append(Unmapped(setting, reason))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def validate(self) -> PipelineSpec:
        """The spec as `riverhouse validate` reads it; an importer bug surfaces here, not later."""
        try:
            return parse_spec(yaml.safe_load(self.to_yaml()), f"spec imported from {self.path}")
        except SpecError as exc:
            raise ImporterError(
                self.path,
                [(where, f"the imported spec is not valid: {message}", hint) for where, message, hint in exc.problems],
            ) from None

    def to_yaml(self) -> str:
        header = [
            f"# Imported from {self.origin} {self.path}",
            "# by `riverhouse import`. Review it before running: see docs/migrating.md.",
        ]
        if self.unmapped:
            header.append("# Not carried over:")
            header += [f"#   {u.setting}: {u.reason}" for u in self.unmapped]
        if self.notes:
            header.append("# Notes:")
            header += [f"#   {n}" for n in self.notes]
        body = yaml.dump(self.spec, Dumper=_SpecDumper, sort_keys=False, allow_unicode=True, width=110)
        return "\n".join(_one_line(h) for h in header) + "\n" + body


class _SpecDumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (SQL queries) as readable `|` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_SpecDumper.add_representer(str, _str)


def _one_line(text: str) -> str:
    return text.replace("\n", " ")


def parse_go_duration(value: Any, where: str) -> timedelta:
    """'1h', '1h30m', '168h', '500ms' -> timedelta; raises ValueError naming `where`."""
    text = str(value).strip()
    if text in ("0", ""):
        raise ValueError(f"{where}: duration {value!r} is empty or zero")
    pos, seconds = 0, 0.0
    for match in GO_DURATION_RE.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * GO_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"{where}: {value!r} is not a duration (write e.g. 30s, 15m, 1h, 1h30m)")
    return timedelta(seconds=seconds)


def spec_window(value: Any, where: str, result: ImportResult) -> str | None:
    """A foreign duration as a spec window (whole seconds, at most 7 days), or None with the reason recorded."""
    try:
        window = parse_go_duration(value, where)
    except ValueError as exc:
        result.drop(where, str(exc))
        return None
    whole = timedelta(seconds=max(1, round(window.total_seconds())))
    if whole > MAX_WINDOW:
        result.drop(where, f"{value} is longer than Riverhouse's maximum window of 7 days")
        return None
    if whole != window:
        result.note(f"{where}: {value} rounded to {format_window(whole)} (spec windows are whole seconds)")
    return format_window(whole)


def identifier(name: str, what: str, result: ImportResult) -> str:
    """A foreign name as a spec identifier ('user-events' -> 'user_events'), noting any change."""
    if IDENTIFIER_RE.fullmatch(name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not cleaned or cleaned[0].isdigit():
        cleaned = f"_{cleaned}"
    cleaned = cleaned[:63]
    result.note(f"{what} {name!r} renamed {cleaned!r} (spec names are SQL identifiers)")
    return cleaned


def secret_ref(pipeline: str, name: str) -> str:
    """Credentials never enter a spec: they become references to the pipeline's own variables
    (RIVERHOUSE_SECRET_<PIPELINE>__<NAME>, envrefs.py)."""
    from riverhouse.platform.envrefs import pipeline_prefix

    return "${env:" + pipeline_prefix(pipeline) + name + "}"
