"""The triggered_start scenario's daemon: creates runs and hands them to the instance's run launcher.

A long-lived process, as Dagster's daemon is when its sensor requests a run: it has loaded the
code location (`riverhouse.definitions`) and opened the instance (DAGSTER_HOME, whose
dagster.yaml names the run launcher) once. For each line on stdin (`{"job": ..., "tags": {...}}`)
it creates the run the way a sensor's request does (job snapshot, execution plan) and calls
`instance.launch_run`; it answers with the run's id once the launcher has returned.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    import dagster as dg
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    # The answers go on our own copy of stdout; everything else written to it (the runs the
    # launcher starts inherit it) goes to stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    repository = ReconstructableRepository.for_module("riverhouse.definitions", "defs", os.getcwd())
    with dg.DagsterInstance.get() as instance:
        print(json.dumps({"ready": type(instance.run_launcher).__name__}), file=answers)
        for line in sys.stdin:
            request = json.loads(line)
            recon_job = repository.get_reconstructable_job(request["job"])
            run = instance.create_run_for_job(
                job_def=recon_job.get_definition(),
                tags=request["tags"],
                job_code_origin=recon_job.get_python_origin(),
            )
            instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]
            print(json.dumps({"run_id": run.run_id}), file=answers)


if __name__ == "__main__":
    main()
