"""Dagster assets and checks, built from pipeline specs."""

from riverhouse.assets.pipelines import build_pipeline_assets

__all__ = ["build_pipeline_assets"]
