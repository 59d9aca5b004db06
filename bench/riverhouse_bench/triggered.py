"""triggered_start (issue 26): from a trigger to the first batch in silver and to the rows in ClickHouse.

Each run is what a lag-sensor tick launches: the pipeline's stream job (`<name>_job`, every
asset of the pipeline, tags `riverhouse/mode=stream`, the live partition), run by Dagster with
the in-process executor against a Dagster instance of its own (DAGSTER_HOME under the bench's
home). Before each run `triggered_events` new orders are produced. From the run's event log
and silver's Delta log:

- launch_s: trigger -> the run's RUN_START (the run's creation and launch: a process started or
  forked, its imports, the code location loaded);
- ingest_step_s: trigger -> the ingest step's STEP_START (Dagster's whole launch);
- first_batch_s: trigger -> silver's first commit after the trigger that added data files
  (the commit's timestamp in the Delta log);
  engine_s = first_batch_s - ingest_step_s: the Spark session (or attaching to the engine),
  the streaming query's start and the first batch;
- covered_s: trigger -> the last silver commit before the ingest step succeeded: silver holds
  every record of the run (with a resident query it may be at or before the trigger: <= 0);
- clickhouse_s: trigger -> the ClickHouse asset's materialization (the load has returned, so
  the rows are visible); run_s: trigger -> RUN_SUCCESS.

Cold first: `triggered_cold_runs` runs with no engine, each `dagster job execute` in a new
process that starts its own Spark. Then warm: the engine RIVERHOUSE_SPARK_REMOTE=sc://host:port
names, or else one the bench starts for the runs' home with `riverhouse engine start` (timed:
`engine_start_s`) and stops after. Three series there, each one unmeasured run first, then
`triggered_runs` measured (the first two alternated run by run, so both meet the engine at the
same age):
- warm: what a sensor's request does under the run launcher `riverhouse ui` configures. A
  daemon-like process (`submit_runs`) creates the run and hands it to `WarmRunLauncher`
  (riverhouse/launcher.py), which forks it from a process that has imported Dagster, GX and
  pyspark. The trigger is the moment the bench writes the request to that process;
- spawned: the same runs, each `dagster job execute` in a new process (the cost of Dagster's
  default launcher: a new interpreter per run). The trigger is the moment the process starts;
- resident: through the launcher, with `orchestration.resident_query` (ingest/resident.py): the
  runs attach to a query kept running on the engine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from riverhouse_bench.common import orders_spec
from riverhouse_bench.freshness import percentiles

if TYPE_CHECKING:
    from riverhouse_bench.harness import Bench

REMOTE_VARIABLE = "RIVERHOUSE_SPARK_REMOTE"
RUN_TAG = "riverhouse/bench_run"
# DagsterEventType values (a run's start and success keep their old "PIPELINE_" names).
RUN_START, RUN_SUCCESS, STEP_START, STEP_SUCCESS = "PIPELINE_START", "PIPELINE_SUCCESS", "STEP_START", "STEP_SUCCESS"
STEP_FAILURE = "STEP_FAILURE"
MATERIALIZATION, CHECK = "ASSET_MATERIALIZATION", "ASSET_CHECK_EVALUATION"
FIGURES = ("launch_s", "ingest_step_s", "first_batch_s", "engine_s", "covered_s", "clickhouse_s", "run_s")


def run_timeline(
    triggered_at: float, events: list[dict[str, Any]], silver_commits: list[tuple[int, float]], spec_name: str
) -> dict[str, Any]:
    """One run's figures from its Dagster events and silver's commits (epoch seconds).

    `events`: {"type": DagsterEventType value, "at", "step": step key or None, "asset": "a/b/c" or None,
    "metadata": {...}} in the run's order; `silver_commits`: (version, commit time) of silver.
    """

    def first(kind: str, step: str | None = None, asset: str | None = None) -> dict[str, Any] | None:
        for event in events:
            if event["type"] != kind:
                continue
            if step is not None and not (event.get("step") or "").startswith(step):
                continue
            if asset is not None and event.get("asset") != asset:
                continue
            return event
        return None

    def after(event: dict[str, Any] | None) -> float | None:
        return round(event["at"] - triggered_at, 3) if event else None

    started = first(RUN_START)
    ingest = first(STEP_START, step=f"ingest_{spec_name}_")
    ingested = first(STEP_SUCCESS, step=f"ingest_{spec_name}_")
    loaded = first(MATERIALIZATION, asset=f"clickhouse/{spec_name}/{spec_name}")
    succeeded = first(RUN_SUCCESS)
    commit = next((at for _, at in sorted(silver_commits) if at >= triggered_at), None)
    covered = max((at for _, at in silver_commits if ingested and at <= ingested["at"]), default=None)
    out: dict[str, Any] = {
        "launch_s": after(started),
        "ingest_step_s": after(ingest),
        "first_batch_s": round(commit - triggered_at, 3) if commit is not None else None,
        "covered_s": round(covered - triggered_at, 3) if covered is not None else None,
        "clickhouse_s": after(loaded),
        "run_s": after(succeeded),
        "success": succeeded is not None,
        # The load's own materialization carries `rows_loaded`; the run also records one per day
        # partition its events fell in (publish.py), without it.
        "rows_loaded": sum(
            int(e["metadata"].get("rows_loaded") or 0)
            for e in events
            if e["type"] == MATERIALIZATION and e.get("asset") == f"clickhouse/{spec_name}/{spec_name}"
        ),
        "checks_failed": [
            e["metadata"].get("check") for e in events if e["type"] == CHECK and not e["metadata"].get("passed")
        ],
        # A failed step's own error (the run process's stderr ends with the tail of a traceback).
        "step_errors": [f"{e['step']}: {e['metadata'].get('error')}" for e in events if e["type"] == STEP_FAILURE],
    }
    out["engine_s"] = (
        round(out["first_batch_s"] - out["ingest_step_s"], 3)
        if out["first_batch_s"] is not None and out["ingest_step_s"] is not None
        else None
    )
    return out


def data_commits(log_dir: Path) -> list[tuple[int, float]]:
    """(version, commit time) of each commit of a Delta table that added data files, from its JSON log.

    Read as the Delta protocol writes it (`<version>.json`, one action per line), so any engine's
    commits count; a table's creation or a metadata change adds no file and is not a batch.
    """
    out = []
    for commit in sorted(log_dir.glob("*.json")) if log_dir.exists() else []:
        if not commit.stem.isdigit():
            continue
        added, timestamp = False, None
        for line in commit.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            added = added or "add" in action
            timestamp = (action.get("commitInfo") or {}).get("timestamp", timestamp)
        if added and timestamp is not None:
            out.append((int(commit.stem), timestamp / 1000))
    return out


def spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 (nearest rank) and max of each figure over the runs."""
    out: dict[str, Any] = {}
    for name in FIGURES:
        values = [r[name] for r in runs if isinstance(r.get(name), int | float)]
        out[name] = {**percentiles(values), "max": max(values)} if values else None
    return out


def engine_reachable(remote: str) -> str | None:
    """None when something answers at the engine's address; else what is wrong, and what to do."""
    parts = urlsplit(remote)
    if parts.scheme != "sc" or not parts.hostname:
        return f"{REMOTE_VARIABLE}={remote!r} is not a Spark Connect address (sc://host:port)"
    try:
        with socket.create_connection((parts.hostname, parts.port or 15002), timeout=3):
            return None
    except OSError as exc:
        return f"no engine answers at {remote} ({exc}): start it with `riverhouse engine start`"


class TriggeredRuns:
    """A pipelines folder, a Dagster home and the environment the run processes get."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.home = bench.home / "triggered"
        self.dagster_home = self.home / "dagster"
        self.specs = self.home / "pipelines"
        for folder in (self.dagster_home, self.specs):
            folder.mkdir(parents=True, exist_ok=True)
        # The launcher the warm-launcher series' daemon hands its runs to (`dagster job execute`
        # runs the job itself, whatever the instance names).
        (self.dagster_home / "dagster.yaml").write_text(
            "run_launcher: {module: riverhouse.launcher, class: WarmRunLauncher}\ntelemetry: {enabled: false}\n"
        )
        self.produced: dict[str, int] = {}

    def add_pipeline(self, name: str, resident: bool = False) -> Any:
        import yaml

        spec = orders_spec(name, name)
        if resident:
            orchestration = spec.orchestration.model_copy(update={"resident_query": True})
            spec = spec.model_copy(update={"orchestration": orchestration})
        (self.specs / f"{name}.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json", by_alias=True)))
        return spec

    def env(self, remote: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RIVERHOUSE_", "DAGSTER_"))}
        env.update(
            RIVERHOUSE_HOME=str(self.home / "riverhouse"),
            RIVERHOUSE_PIPELINES=str(self.specs),
            RIVERHOUSE_KAFKA_BOOTSTRAP=self.bench.state.bootstrap,
            DAGSTER_HOME=str(self.dagster_home),
        )
        if remote:
            env[REMOTE_VARIABLE] = remote
        return env

    def trigger(
        self, spec: Any, key: str, remote: str | None, seed: int, daemon: Daemon | None = None
    ) -> dict[str, Any]:
        """Produce new orders, run the stream job, read back its timeline.

        Without `daemon`, the run is `dagster job execute` in a new process (what Dagster's default
        launcher does: a new interpreter per run); with it, the daemon hands the run to the
        instance's run launcher (riverhouse.launcher.WarmRunLauncher)."""
        from riverhouse.assets.orchestration import job_name
        from riverhouse.assets.pipelines import MODE_TAG, live_partition_key

        stats = self.bench.produce_orders(spec.name, self.bench.cfg.triggered_events, seed=seed)
        self.produced[spec.name] = self.produced.get(spec.name, 0) + stats.unique
        tags = {"dagster/partition": live_partition_key(spec), MODE_TAG: "stream", RUN_TAG: key}
        triggered_at = time.time()
        if daemon is not None:
            failure = daemon.launch(job_name(spec), tags)
        else:
            command = [sys.executable, "-m", "dagster", "job", "execute", "-m", "riverhouse.definitions"]
            ran = subprocess.run(
                [*command, "-j", job_name(spec), "--tags", json.dumps(tags)],
                capture_output=True,
                text=True,
                env=self.env(remote),
                cwd=self.home,
                timeout=1800,
            )
            failure = (ran.stderr or ran.stdout).strip()[-800:] if ran.returncode != 0 else ""
        exited = time.time()
        run = run_timeline(triggered_at, self.events(key), self.silver_commits(spec), spec.name)
        run.update(key=key, process_s=round(exited - triggered_at, 3), expected_rows=stats.unique)
        if failure or not run["success"]:
            run["error"] = "; ".join(run["step_errors"]) or failure or "the run did not succeed"
        return run

    def events(self, key: str) -> list[dict[str, Any]]:
        import dagster as dg

        with dg.DagsterInstance.from_config(str(self.dagster_home)) as instance:
            runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_TAG: key}), limit=1)
            if not runs:
                return []
            out = []
            for entry in instance.all_logs(runs[0].run_id):
                event = entry.dagster_event
                if event is None:
                    continue
                metadata: dict[str, Any] = {}
                if event.event_type_value == MATERIALIZATION:
                    materialization = event.step_materialization_data.materialization
                    metadata = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
                if event.event_type_value == CHECK:
                    check = event.event_specific_data
                    metadata = {"check": check.check_name, "passed": bool(check.passed)}
                if event.event_type_value == STEP_FAILURE and event.event_specific_data.error is not None:
                    metadata = {"error": event.event_specific_data.error.message.strip()[:800]}
                out.append(
                    {
                        "type": event.event_type_value,
                        "at": entry.timestamp,
                        "step": event.step_key,
                        "asset": "/".join(event.asset_key.path) if event.asset_key else None,
                        "metadata": metadata,
                    }
                )
            return out

    def engine(self, command: str) -> subprocess.CompletedProcess[str]:
        """`riverhouse engine <command>` for the runs' home (the CLI, as a user starts the engine)."""
        ran = self.riverhouse(f"engine {command}", None, check=command != "stop")
        return ran

    def riverhouse(self, command: str, remote: str | None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`riverhouse <command>` for the runs' home (the CLI, as a user runs it)."""
        home = str(self.home / "riverhouse")
        ran = subprocess.run(
            [sys.executable, "-m", "riverhouse.cli", *command.split(), "--home", home],
            capture_output=True,
            text=True,
            env=self.env(remote),
            timeout=600,
        )
        if ran.returncode != 0 and check:
            raise RuntimeError(f"riverhouse {command} failed: {(ran.stderr or ran.stdout).strip()[-800:]}")
        return ran

    def silver_commits(self, spec: Any) -> list[tuple[int, float]]:
        from riverhouse.platform.state.tables import TableLayout

        path = TableLayout(str(self.home / "riverhouse" / "warehouse"), spec.name).silver("orders")
        return data_commits(Path(path) / "_delta_log")

    def silver_rows(self, spec: Any) -> int:
        from riverhouse.platform.quality.checks import delta_row_count
        from riverhouse.platform.state.tables import TableLayout

        return delta_row_count(TableLayout(str(self.home / "riverhouse" / "warehouse"), spec.name).silver("orders"))

    def series(
        self,
        name: str,
        count: int,
        remote: str | None,
        warmup: bool,
        seed: int,
        resident: bool = False,
        launcher: bool = False,
    ) -> dict[str, Any]:
        """`count` measured runs of a pipeline of its own (after one unmeasured run when `warmup`);
        `launcher`: launched by a daemon through WarmRunLauncher instead of a process each."""
        return self.alternated([(name, seed, launcher)], count, remote, warmup, resident)[name]

    def alternated(
        self,
        arms: list[tuple[str, int, bool]],
        count: int,
        remote: str | None,
        warmup: bool,
        resident: bool = False,
    ) -> dict[str, dict[str, Any]]:
        """Series of `count` runs for each arm (pipeline name, seed, launched through the launcher),
        their runs alternated (ABAB, then BABA) so that each arm meets the engine at the same age:
        an engine's JIT keeps warming through its first dozens of runs (bench/analysis.md)."""
        specs = {name: self.add_pipeline(name, resident) for name, _, _ in arms}
        daemons = {name: Daemon(self, remote) if launcher else None for name, _, launcher in arms}
        first: dict[str, Any] = {}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in arms}
        try:
            for name, seed, _ in arms if warmup else []:
                first[name] = self.trigger(specs[name], f"{name}-warmup", remote, seed, daemons[name])
            for i in range(count):
                for name, seed, _ in arms if i % 2 == 0 else arms[::-1]:
                    runs[name].append(self.trigger(specs[name], f"{name}-{i + 1}", remote, seed + 1 + i, daemons[name]))
        finally:
            for daemon in daemons.values():
                if daemon is not None:
                    daemon.close()
        out = {}
        for name, _, _ in arms:
            spec = specs[name]
            every = [*(r for r in [first.get(name)] if r), *runs[name]]
            loaded = sum(r["rows_loaded"] for r in every)
            exact = (
                all(r["success"] and not r["checks_failed"] for r in every)
                and loaded == self.produced[spec.name]
                and self.silver_rows(spec) == self.produced[spec.name]
            )
            if resident:  # its query must not outlive the bench on the engine
                self.riverhouse(f"reset {name} --yes", remote)
            out[name] = {
                "runs": len(runs[name]),
                "spread": spread(runs[name]),
                "per_run": runs[name],
                "warmup_run": first.get(name),
                "rows_loaded": loaded,
                "expected_rows": self.produced[spec.name],
                "exact": exact,
                "errors": [r["error"] for r in every if r.get("error")][:3],
            }
        return out


class Daemon:
    """`riverhouse_bench.submit_runs` for one series: what Dagster's daemon does when a sensor asks
    for a run (create it, hand it to the instance's run launcher), in a process that lives as long
    as the series, with the runs' environment."""

    def __init__(self, runs: TriggeredRuns, remote: str | None) -> None:
        env = runs.env(remote)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parent.parent), env.get("PYTHONPATH")) if p)
        self.dagster_home = runs.dagster_home
        self.log = (runs.home / "daemon.log").open("a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "riverhouse_bench.submit_runs"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            cwd=runs.home,
        )
        ready = self.process.stdout.readline() if self.process.stdout else ""
        if not ready:
            raise RuntimeError(f"the bench's daemon did not start: see {runs.home / 'daemon.log'}")
        self.launcher = json.loads(ready)["ready"]

    def launch(self, job: str, tags: dict[str, str]) -> str:
        """Launch a run of `job` and wait until it has ended: '' or what went wrong."""
        import dagster as dg

        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"job": job, "tags": tags}) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline()
        if not reply:
            return "the bench's daemon exited"
        run_id = json.loads(reply)["run_id"]
        with dg.DagsterInstance.from_config(str(self.dagster_home)) as instance:
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                run = instance.get_run_by_id(run_id)
                if run is not None and run.is_finished:
                    return ""
                time.sleep(0.2)
        return f"run {run_id} had not ended after 30 minutes"

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def warm_series(runs: TriggeredRuns, count: int, remote: str) -> dict[str, Any]:
    """The series against a warm engine: runs launched by Riverhouse's run launcher (the one
    `riverhouse ui` configures), the same runs in a new process each, and a resident query's."""
    pair = runs.alternated([("bench_trig_warm", 200, True), ("bench_trig_spawn", 400, False)], count, remote, True)
    return {
        "warm": pair["bench_trig_warm"],
        "spawned": pair["bench_trig_spawn"],
        "resident": runs.series("bench_trig_res", count, remote, True, 300, resident=True, launcher=True),
    }


def triggered_start(bench: Bench) -> dict[str, Any]:
    """Cold runs (no engine: each run starts Spark), then warm runs against RIVERHOUSE_SPARK_REMOTE."""
    cfg = bench.cfg
    runs = TriggeredRuns(bench)
    remote = os.environ.get(REMOTE_VARIABLE)
    out: dict[str, Any] = {"events_per_run": cfg.triggered_events, "engine": remote}
    out["cold"] = (
        runs.series("bench_trig_cold", cfg.triggered_cold_runs, None, False, 100) if cfg.triggered_cold_runs else None
    )
    if remote is not None:
        if problem := engine_reachable(remote):
            out.update(warm=None, warm_skipped=problem)
        else:
            out.update(warm_series(runs, cfg.triggered_runs, remote))
    else:
        # No engine named: the runs' home gets its own local engine, started as a user would.
        started = time.monotonic()
        runs.engine("start")
        out["engine_start_s"] = round(time.monotonic() - started, 3)
        try:
            status = json.loads(runs.engine("status --json").stdout)
            out["engine"] = status["engine"]
            out.update(warm_series(runs, cfg.triggered_runs, status["engine"]))
        finally:
            runs.engine("stop")
    series = [s for s in (out["cold"], out.get("warm"), out.get("spawned"), out.get("resident")) if s]

    def figure(which: str, name: str, stat: str) -> float | None:
        return (((out.get(which) or {}).get("spread") or {}).get(name) or {}).get(stat)

    out.update(
        events=cfg.triggered_events * sum(s["runs"] for s in series),
        # The targets' figures are the warm runs'; the cold ones stand beside them.
        p50_first_batch_s=figure("warm", "first_batch_s", "p50"),
        p95_first_batch_s=figure("warm", "first_batch_s", "p95"),
        p50_clickhouse_s=figure("warm", "clickhouse_s", "p50"),
        spawned_p50_first_batch_s=figure("spawned", "first_batch_s", "p50"),
        spawned_p50_clickhouse_s=figure("spawned", "clickhouse_s", "p50"),
        resident_p50_covered_s=figure("resident", "covered_s", "p50"),
        resident_p95_covered_s=figure("resident", "covered_s", "p95"),
        resident_p50_clickhouse_s=figure("resident", "clickhouse_s", "p50"),
        resident_p95_clickhouse_s=figure("resident", "clickhouse_s", "p95"),
        cold_p50_first_batch_s=figure("cold", "first_batch_s", "p50"),
        cold_p50_clickhouse_s=figure("cold", "clickhouse_s", "p50"),
        exact=bool(series) and all(s["exact"] for s in series),
    )
    return out
