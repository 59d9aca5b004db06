"""riverhouse.launcher.WarmRunLauncher: Dagster runs forked from a process that has imported what runs import.

Real Dagster runs (`dagster api execute_run` in the launched process, the instance's SQLite
storage), launched the way the daemon launches a sensor's or the UI's run. The jobs are a module
written into tmp_path, so a test can change it between two runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.dagster

JOBS = """
import json, os, sys, time
import dagster as dg

# What the process held when it imported this module: the launcher's process imports these once.
PRELOADED = all(m in sys.modules for m in ("great_expectations", "pyspark.sql.connect.session"))
VERSION = "{version}"


@dg.op
def record(context):
    with open(os.environ["LAUNCHER_TEST_OUT"], "a") as f:
        f.write(json.dumps({{"run": context.run_id, "pid": os.getpid(), "ppid": os.getppid(),
                             "preloaded": PRELOADED, "version": VERSION}}) + "\\n")


@dg.job(executor_def=dg.in_process_executor)
def record_job():
    record()


@dg.op
def nap():
    time.sleep(120)


@dg.job(executor_def=dg.in_process_executor)
def nap_job():
    nap()
"""


def _write_jobs(folder: Path, version: str) -> Path:
    path = folder / "launcher_jobs.py"
    path.write_text(textwrap.dedent(JOBS.format(version=version)))
    return path


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import dagster as dg

    home = tmp_path_factory.mktemp("dagster")
    (home / "dagster.yaml").write_text(
        "run_launcher: {module: riverhouse.launcher, class: WarmRunLauncher}\ntelemetry: {enabled: false}\n"
    )
    out = home / "records.jsonl"
    previous = os.environ.get("LAUNCHER_TEST_OUT")
    os.environ["LAUNCHER_TEST_OUT"] = str(out)  # the server (and so every run) inherits it
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        yield instance, out
    finally:
        instance.dispose()
        if previous is None:
            os.environ.pop("LAUNCHER_TEST_OUT", None)
        else:
            os.environ["LAUNCHER_TEST_OUT"] = previous


def _launch(instance: Any, jobs: Path, job: str) -> str:
    from dagster._core.definitions.reconstruct import ReconstructableJob

    recon = ReconstructableJob.for_file(str(jobs), job)
    run = instance.create_run_for_job(job_def=recon.get_definition(), job_code_origin=recon.get_python_origin())
    instance.launch_run(run.run_id, workspace=None)
    return run.run_id


def _wait(instance: Any, run_id: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run.is_finished:
            return run.status
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} still {instance.get_run_by_id(run_id).status} after {timeout_s} s")


def _records(out: Path) -> dict[str, dict[str, Any]]:
    return {r["run"]: r for r in map(json.loads, out.read_text().splitlines())} if out.exists() else {}


def _launched_how(instance: Any, run_id: str) -> str:
    return next(e.message for e in instance.all_logs(run_id) if "Run worker started" in (e.message or ""))


def test_runs_start_in_a_new_process_until_the_warm_one_is_ready_then_fork_from_it(warm: Any, tmp_path: Path) -> None:
    import dagster as dg

    instance, out = warm
    instance.run_launcher.dispose()  # cold, whichever of this module's tests ran before on this worker
    jobs = _write_jobs(tmp_path, "one")
    first = _launch(instance, jobs, "record_job")  # the launcher's first run starts its server
    assert _wait(instance, first) == dg.DagsterRunStatus.SUCCESS
    assert "a new process" in _launched_how(instance, first)
    launcher = instance.run_launcher
    assert launcher.warm(120), "the warm server did not become ready"
    second = _launch(instance, jobs, "record_job")
    assert _wait(instance, second) == dg.DagsterRunStatus.SUCCESS
    assert "forked" in _launched_how(instance, second)
    records = _records(out)
    assert records[first]["preloaded"] is False  # a new interpreter imports everything itself
    assert records[second]["preloaded"] is True  # the fork starts with GX and pyspark in memory
    assert records[second]["ppid"] == launcher._server.process.pid
    assert records[second]["pid"] != os.getpid()


def test_a_changed_job_module_is_the_next_runs_code(warm: Any, tmp_path: Path) -> None:
    import dagster as dg

    instance, out = warm
    assert instance.run_launcher.warm(120)
    jobs = _write_jobs(tmp_path, "before")
    before = _launch(instance, jobs, "record_job")
    assert _wait(instance, before) == dg.DagsterRunStatus.SUCCESS
    _write_jobs(tmp_path, "after")
    after = _launch(instance, jobs, "record_job")
    assert _wait(instance, after) == dg.DagsterRunStatus.SUCCESS
    records = _records(out)
    assert (records[before]["version"], records[after]["version"]) == ("before", "after")
    assert "forked" in _launched_how(instance, after)


def test_terminate_cancels_the_run_and_ends_its_process(warm: Any, tmp_path: Path) -> None:
    import dagster as dg

    from riverhouse.launcher import WORKER_TAG

    instance, _ = warm
    assert instance.run_launcher.warm(120)
    run_id = _launch(instance, _write_jobs(tmp_path, "nap"), "nap_job")
    deadline = time.monotonic() + 60
    while not any(e.step_key == "nap" for e in instance.all_logs(run_id)):  # the step has started
        assert time.monotonic() < deadline, "the nap step did not start"
        time.sleep(0.1)
    pid = int(instance.get_run_by_id(run_id).tags[WORKER_TAG].split(":")[0])
    assert instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run_id)).status.value == "RUNNING"
    assert instance.run_launcher.terminate(run_id)
    assert _wait(instance, run_id, 60) == dg.DagsterRunStatus.CANCELED
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline, f"run process {pid} still running after its cancellation"
        time.sleep(0.1)
    assert not instance.run_launcher.terminate(run_id)  # a finished run has nothing to terminate


def test_a_change_to_riverhouse_starts_the_warm_process_again(
    warm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    import riverhouse.launcher as launcher_module

    instance, _ = warm
    launcher = instance.run_launcher
    assert launcher.warm(120)
    old = launcher._server.process
    monkeypatch.setattr(launcher_module, "code_fingerprint", lambda: "riverhouse changed")
    run_id = _launch(instance, _write_jobs(tmp_path, "new code"), "record_job")
    assert _wait(instance, run_id) == dg.DagsterRunStatus.SUCCESS
    assert "a new process" in _launched_how(instance, run_id)  # not forked from the stale one
    assert old.poll() is not None  # the stale server was stopped
    assert launcher.warm(120) and launcher._server.process.pid != old.pid


def test_a_killed_warm_process_is_replaced_and_the_run_meanwhile_starts_as_a_new_process(
    warm: Any, tmp_path: Path
) -> None:
    import dagster as dg

    instance, out = warm
    launcher = instance.run_launcher
    assert launcher.warm(120)
    old = launcher._server.process
    os.kill(old.pid, signal.SIGKILL)
    old.wait()
    run_id = _launch(instance, _write_jobs(tmp_path, "after a crash"), "record_job")
    assert _wait(instance, run_id) == dg.DagsterRunStatus.SUCCESS
    assert "a new process" in _launched_how(instance, run_id)
    assert _records(out)[run_id]["version"] == "after a crash"
    assert launcher.warm(120) and launcher._server.process.pid != old.pid


def test_the_warm_process_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A daemon killed with SIGKILL leaves no warm process behind."""
    script = textwrap.dedent(
        """
        import sys
        from riverhouse.launcher import WarmServer
        server = WarmServer()
        assert server.ready(120)
        print(server.process.pid, flush=True)
        sys.stdin.read()
        """
    )
    host = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        server_pid = int(host.stdout.readline())
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
        deadline = time.monotonic() + 30
        while (
            Path(f"/proc/{server_pid}").exists()
            and "Z" not in Path(f"/proc/{server_pid}/stat").read_text().split(") ")[1][:1]
        ):
            assert time.monotonic() < deadline, "the warm server outlived its launcher's process"
            time.sleep(0.1)
    finally:
        if host.poll() is None:
            host.kill()
