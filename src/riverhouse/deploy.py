"""`riverhouse deploy-config`: the dagster.yaml and workspace.yaml of the production layout.

Production runs Dagster as separate processes sharing one instance: a code server
(`dagster code-server start -m riverhouse.definitions`) that launches each run in its own
process, the daemon (sensors, schedules, the run queue) and the webserver. Their shared
`dagster.yaml` keeps everything in PostgreSQL and queues runs; `workspace.yaml` points the
daemon and the webserver at the code server.

Nothing secret is written: the PostgreSQL connection and the code server's address are
`env:` references that Dagster resolves when it loads the file, so one pair of files
serves every environment (docker/compose.yaml, the tests/production tier, a VM).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from riverhouse.assets.orchestration import PIPELINE_TAG

# The environment variables the written files reference (docs/deployment.md lists them).
POSTGRES_ENV = {
    "hostname": "DAGSTER_POSTGRES_HOST",
    "port": "DAGSTER_POSTGRES_PORT",
    "username": "DAGSTER_POSTGRES_USER",
    "password": "DAGSTER_POSTGRES_PASSWORD",
    "db_name": "DAGSTER_POSTGRES_DB",
}
CODE_SERVER_ENV = {"host": "RIVERHOUSE_CODE_SERVER_HOST", "port": "RIVERHOUSE_CODE_SERVER_PORT"}
LOCATION_NAME = "riverhouse"
HEADER = (
    "# Written by `riverhouse deploy-config` ({what}); docs/deployment.md explains every entry.\n"
    "# Re-run the command rather than editing by hand, so upgrades keep the layout.\n"
)


class DeployConfigError(ValueError):
    """A deploy-config option is out of range; the message names it and the accepted values."""


@dataclass(frozen=True)
class DeployOptions:
    # Runs in progress at once across all pipelines (each is a Spark driver: size the host for it).
    max_concurrent_runs: int = 4
    # Runs of one pipeline at a time: 1, because a pipeline's runs share its checkpoint and lock.
    runs_per_pipeline: int = 1
    # Steps loading ClickHouse at once (the `clickhouse` pool). 1 for embedded chDB (one process per path).
    clickhouse_slots: int = 1
    # How often the daemon looks at the run queue.
    dequeue_interval_seconds: int = 2
    # A run that has not started after this long is marked failed by the daemon's run monitoring.
    start_timeout_seconds: int = 180
    # "grpc": daemon and webserver load the code server at RIVERHOUSE_CODE_SERVER_HOST/PORT;
    # "module": each loads riverhouse.definitions itself (a single host, no code server).
    workspace: str = "grpc"

    def problems(self) -> list[str]:
        out = []
        for name in ("max_concurrent_runs", "runs_per_pipeline", "clickhouse_slots", "dequeue_interval_seconds"):
            if getattr(self, name) < 1:
                out.append(f"--{name.replace('_', '-')} must be 1 or more, got {getattr(self, name)}")
        if self.start_timeout_seconds < 10:
            out.append(f"--start-timeout-seconds must be 10 or more, got {self.start_timeout_seconds}")
        if self.runs_per_pipeline > self.max_concurrent_runs:
            out.append("--runs-per-pipeline cannot exceed --max-concurrent-runs")
        if self.workspace not in ("grpc", "module"):
            out.append(f"--workspace must be grpc or module, got {self.workspace!r}")
        return out


def _env(name: str) -> dict[str, str]:
    return {"env": name}


def dagster_config(options: DeployOptions) -> dict[str, Any]:
    """The instance configuration (the content of dagster.yaml)."""
    return {
        "storage": {
            "postgres": {
                "postgres_db": {
                    **{key: _env(var) for key, var in POSTGRES_ENV.items()},
                    # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; the driver installed is psycopg2.
                    "scheme": "postgresql+psycopg2",
                }
            }
        },
        # One run per pipeline at a time: a sensor run, a scheduled run and a manual run of the
        # same pipeline queue instead of failing on the pipeline's lock.
        "run_coordinator": {
            "module": "dagster.core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": {"dequeue_interval_seconds": options.dequeue_interval_seconds},
        },
        "concurrency": {
            "runs": {
                "max_concurrent_runs": options.max_concurrent_runs,
                "tag_concurrency_limits": [
                    {
                        "key": PIPELINE_TAG,
                        "value": {"applyLimitPerUniqueValue": True},
                        "limit": options.runs_per_pipeline,
                    }
                ],
            },
            # The ClickHouse assets are the only pool users: this bounds concurrent loads.
            "pools": {"default_limit": options.clickhouse_slots},
        },
        # The run is a subprocess of the code server, which reports it failed if it dies;
        # monitoring also fails runs stuck starting (a launch lost with a killed daemon).
        "run_launcher": {"module": "dagster.core.launcher", "class": "DefaultRunLauncher"},
        "run_monitoring": {
            "enabled": True,
            "start_timeout_seconds": options.start_timeout_seconds,
            "poll_interval_seconds": 10,
        },
        "telemetry": {"enabled": False},
        # The ClickHouse and topic assets' freshness policies (from the sensor's max_delay) are
        # evaluated only when this is on.
        "freshness": {"enabled": True},
    }


def workspace_config(options: DeployOptions) -> dict[str, Any]:
    """The code locations (the content of workspace.yaml)."""
    if options.workspace == "module":
        return {
            "load_from": [{"python_module": {"module_name": "riverhouse.definitions", "location_name": LOCATION_NAME}}]
        }
    server: dict[str, Any] = {key: _env(var) for key, var in CODE_SERVER_ENV.items()}
    return {"load_from": [{"grpc_server": {**server, "location_name": LOCATION_NAME}}]}


def write_deploy_config(folder: Path, options: DeployOptions) -> list[Path]:
    """Write dagster.yaml and workspace.yaml into `folder` (DAGSTER_HOME); returns their paths."""
    if problems := options.problems():
        raise DeployConfigError("; ".join(problems))
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in (
        ("dagster.yaml", dagster_config(options)),
        ("workspace.yaml", workspace_config(options)),
    ):
        path = folder / name
        text = HEADER.format(what=name) + yaml.safe_dump(content, sort_keys=False)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    return written


def required_env(options: DeployOptions) -> list[str]:
    """Variables the daemon, webserver and code server need set for these files to load."""
    names = list(POSTGRES_ENV.values())
    if options.workspace == "grpc":
        names += list(CODE_SERVER_ENV.values())
    return names


WARM_RUN_LAUNCHER = {"module": "riverhouse.launcher", "class": "WarmRunLauncher"}


def local_dagster_home(path: Path) -> Path:
    """The DAGSTER_HOME of `riverhouse ui` and `riverhouse demo` under a Riverhouse home.

    Telemetry off, and the same run and pool limits as production (`dagster_config`): one
    ClickHouse step at a time (chDB is single-process), one run per pipeline at a time
    (sensor, schedule and manual runs queue up); storage is `dagster dev`'s SQLite there.
    Runs start warm (`riverhouse.launcher.WarmRunLauncher`): on one machine the daemon and the
    code location share one installation, which is what that launcher forks runs from.
    """
    path.mkdir(parents=True, exist_ok=True)
    config = path / "dagster.yaml"
    generated = "# written by riverhouse; delete this line to keep your own edits\n"
    if not config.exists() or config.read_text().startswith(("# written by riverhouse", generated)):
        production = dagster_config(DeployOptions())
        local = {
            "telemetry": {"enabled": False},
            "concurrency": production["concurrency"],
            "freshness": production["freshness"],
            "run_launcher": WARM_RUN_LAUNCHER,
        }
        config.write_text(generated + yaml.safe_dump(local, sort_keys=False))
    return path
