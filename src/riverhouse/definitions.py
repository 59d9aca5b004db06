"""The composition root: the only place `dg.Definitions` is assembled.

Specs come from RIVERHOUSE_PIPELINES (default ./pipelines); paths and DSNs from
`Settings.from_env()`, read once when Dagster loads the code location.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from riverhouse.assets import build_pipeline_assets
from riverhouse.platform.settings import Settings
from riverhouse.platform.spec import PipelineSpec, load_specs
from riverhouse.resources import resources_from_settings


def pipelines_dir() -> Path:
    return Path(os.environ.get("RIVERHOUSE_PIPELINES", "pipelines"))


def pipeline_job(spec: PipelineSpec) -> dg.UnresolvedAssetJobDefinition:
    # In-process: one Spark session per run, and the embedded ClickHouse (chDB) can be
    # open in one process at a time.
    return dg.define_asset_job(
        name=f"{spec.name}_job",
        selection=dg.AssetSelection.groups(spec.name),
        executor_def=dg.in_process_executor,
        description=f"Ingest and load pipeline {spec.name}: Kafka -> Delta -> ClickHouse.",
    )


def build_definitions(specs: list[PipelineSpec] | None = None, settings: Settings | None = None) -> dg.Definitions:
    specs = load_specs(pipelines_dir()) if specs is None else specs
    settings = settings or Settings.from_env()
    assets: list = []
    checks: list = []
    jobs = []
    for spec in specs:
        spec_assets, spec_checks = build_pipeline_assets(spec)
        assets.extend(spec_assets)
        checks.extend(spec_checks)
        jobs.append(pipeline_job(spec))
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        resources=resources_from_settings(settings),
    )


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions()
