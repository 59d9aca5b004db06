"""The composition root: the only place `dg.Definitions` is assembled.

Specs come from RIVERHOUSE_PIPELINES (default ./pipelines); paths and DSNs from
`Settings.from_env()`, read once when Dagster loads the code location.

A spec that fails to load (invalid, or clashing with another spec's name or sink table)
does not take the code location down: it becomes a placeholder asset in the
`spec_errors` group whose description names the file and every problem, and an error
line in the code server's log, while every other pipeline loads with its sensors.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import dagster as dg

from riverhouse.assets import build_pipeline_assets
from riverhouse.assets.orchestration import build_orchestration
from riverhouse.platform.runtime.interpreter_exit import skip_final_collection
from riverhouse.platform.spec import PipelineSpec, SpecError, load_spec_folder
from riverhouse.platform.state.settings import Settings, dsn_database
from riverhouse.resources import resources_from_settings

SPEC_ERRORS_GROUP = "spec_errors"
# A run worker (and the code server) loads this module: its exit skips the last full collection.
skip_final_collection()
logger = logging.getLogger("riverhouse.definitions")


def pipelines_dir() -> Path:
    return Path(os.environ.get("RIVERHOUSE_PIPELINES", "pipelines"))


def spec_error_asset(error: SpecError, taken: set[str]) -> dg.AssetSpec:
    """A visible stand-in for a spec that did not load: its key names the file, its description the problems."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", Path(error.source).stem) or "spec"
    unique, n = name, 2
    while unique in taken:
        unique, n = f"{name}_{n}", n + 1
    taken.add(unique)
    problems = "\n".join(
        f"- `{where or '<root>'}`: {message}" + (f" (hint: {hint})" if hint else "")
        for where, message, hint in error.problems
    )
    return dg.AssetSpec(
        key=dg.AssetKey([SPEC_ERRORS_GROUP, unique]),
        group_name=SPEC_ERRORS_GROUP,
        description=f"**This pipeline did not load.** `{error.source}` has {len(error.problems)} problem(s):\n\n"
        f"{problems}\n\nFix the file (`riverhouse validate {error.source}`) and reload the code location.",
        metadata={"spec_file": error.source, "problems": dg.MetadataValue.md(problems)},
        kinds={"error"},
    )


def build_definitions(specs: list[PipelineSpec] | None = None, settings: Settings | None = None) -> dg.Definitions:
    errors: list[SpecError] = []
    settings = settings or Settings.from_env()
    if specs is None:
        specs, errors = load_spec_folder(pipelines_dir(), dsn_database(settings.clickhouse_dsn))
    assets: list = []
    jobs: list = []
    sensors: list = []
    schedules: list = []
    for spec in specs:
        try:
            spec_assets = build_pipeline_assets(spec, settings)
            spec_jobs, spec_sensors, spec_schedules = build_orchestration(spec)
        except Exception as exc:  # one pipeline's failure must not hide the others
            errors.append(SpecError(f"pipeline {spec.name}", [("", f"{type(exc).__name__}: {exc}", "")]))
            continue
        assets.extend(spec_assets)
        jobs.extend(spec_jobs)
        sensors.extend(spec_sensors)
        schedules.extend(spec_schedules)
    taken: set[str] = set()
    for error in errors:
        logger.error("pipeline spec not loaded (the other pipelines are): %s", error)
        assets.append(spec_error_asset(error, taken))
    return dg.Definitions(
        assets=assets,
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources=resources_from_settings(settings),
        # Materializations launched from the UI run in one process too: one Spark session per
        # run, and the embedded ClickHouse (chDB) opened by one process at a time.
        executor=dg.in_process_executor,
    )


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions()
