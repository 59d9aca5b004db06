"""The composition root: the only place `dg.Definitions` is assembled.

Specs come from RIVERHOUSE_PIPELINES (default ./pipelines); paths and DSNs from
`Settings.from_env()`, read once when Dagster loads the code location.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from riverhouse.assets import build_pipeline_assets
from riverhouse.assets.orchestration import build_orchestration
from riverhouse.platform.settings import Settings
from riverhouse.platform.spec import PipelineSpec, load_specs
from riverhouse.resources import resources_from_settings


def pipelines_dir() -> Path:
    return Path(os.environ.get("RIVERHOUSE_PIPELINES", "pipelines"))


def build_definitions(specs: list[PipelineSpec] | None = None, settings: Settings | None = None) -> dg.Definitions:
    specs = load_specs(pipelines_dir()) if specs is None else specs
    settings = settings or Settings.from_env()
    assets: list = []
    checks: list = []
    jobs: list = []
    sensors: list = []
    schedules: list = []
    for spec in specs:
        spec_assets, spec_checks = build_pipeline_assets(spec)
        assets.extend(spec_assets)
        checks.extend(spec_checks)
        spec_jobs, spec_sensors, spec_schedules = build_orchestration(spec)
        jobs.extend(spec_jobs)
        sensors.extend(spec_sensors)
        schedules.extend(spec_schedules)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
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
