"""Riverhouse's benchmarks: every scenario in one run, its results and docs/benchmarks.md.

Not part of the installed product: this package lives in the repository's bench/ folder
and runs with that folder on the path (`make bench`, or `python -m riverhouse_bench`
from bench/). It drives the product through its public entry points.

Modules: `common` (configuration, specs, generated data, machine facts), `harness` (the
run), the scenarios by family (`limits`, `pipelines`, `cluster`, `freshness`, `final`,
`state`), `metering` (CPU by process), `spark_metrics` (Spark's event log, silver's
Delta log), `results` (JSON, targets) and `report` + `sections` (the page).
"""
