"""`riverhouse deploy-config`: the written files load with Dagster's own instance and workspace loaders.

These loaders are what `dagster-daemon` and `dagster-webserver` run on start-up; Dagster has no
public function that validates an instance without connecting to its database, so the test calls
them directly (the production tier then loads the same files against a real PostgreSQL).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance
from dagster._config import process_config
from dagster._core.instance.ref import InstanceRef
from dagster._core.workspace.config_schema import ensure_workspace_config
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import pg_url_from_config
from typer.testing import CliRunner

from riverhouse.assets.orchestration import build_orchestration
from riverhouse.cli import app
from riverhouse.deploy import DeployOptions, write_deploy_config
from tests.conftest import orders_spec

pytestmark = pytest.mark.unit

PG_ENV = {
    "DAGSTER_POSTGRES_HOST": "db.example",
    "DAGSTER_POSTGRES_PORT": "6543",
    "DAGSTER_POSTGRES_USER": "dagster",
    "DAGSTER_POSTGRES_PASSWORD": "s3cret",
    "DAGSTER_POSTGRES_DB": "dagster_prod",
}


@pytest.fixture
def pg_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in PG_ENV.items():
        monkeypatch.setenv(name, value)


def test_cli_writes_an_instance_dagster_loads_with_postgres_storage(tmp_path: Path, pg_env: None) -> None:
    home = tmp_path / "dagster"
    result = CliRunner().invoke(app, ["deploy-config", "--out", str(home), "--clickhouse-slots", "3"])
    assert result.exit_code == 0, result.output
    assert "DAGSTER_POSTGRES_PASSWORD" in result.output
    # The password lives in the environment only, never in the file.
    assert "s3cret" not in (home / "dagster.yaml").read_text()

    ref = InstanceRef.from_dir(str(home))
    assert (ref.storage_data.module_name, ref.storage_data.class_name) == ("dagster_postgres", "DagsterPostgresStorage")
    resolved = process_config(DagsterPostgresStorage.config_type(), ref.storage_data.config_dict)
    assert resolved.success, resolved.errors
    assert pg_url_from_config(resolved.value) == "postgresql+psycopg2://dagster:s3cret@db.example:6543/dagster_prod"

    coordinator = ref.run_coordinator
    assert type(coordinator).__name__ == "QueuedRunCoordinator"
    concurrency = ref.settings["concurrency"]
    assert concurrency["runs"]["max_concurrent_runs"] == 4
    assert concurrency["runs"]["tag_concurrency_limits"] == [
        {"key": "riverhouse/pipeline", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
    ]
    assert concurrency["pools"] == {"default_limit": 3}
    assert ref.settings["run_monitoring"]["enabled"] is True


def test_the_concurrency_limit_keys_on_the_tag_every_pipeline_run_carries(tmp_path: Path) -> None:
    write_deploy_config(tmp_path, DeployOptions())
    limits = yaml.safe_load((tmp_path / "dagster.yaml").read_text())["concurrency"]["runs"]["tag_concurrency_limits"]
    jobs, _, _ = build_orchestration(orders_spec("orders", name="p1"))
    for job in jobs:
        assert job.tags.get(limits[0]["key"]) == "p1", job.name


def test_missing_database_variable_is_named_when_dagster_loads_the_instance(
    tmp_path: Path, pg_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_deploy_config(tmp_path, DeployOptions())
    monkeypatch.delenv("DAGSTER_POSTGRES_HOST")
    # The storage block is resolved when the storage is built, as the daemon does on start-up.
    resolved = process_config(
        DagsterPostgresStorage.config_type(), InstanceRef.from_dir(str(tmp_path)).storage_data.config_dict
    )
    assert not resolved.success
    assert "DAGSTER_POSTGRES_HOST" in " ".join(e.message for e in resolved.errors)


def test_workspace_points_at_the_code_server_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIVERHOUSE_CODE_SERVER_HOST", "riverhouse-code")
    monkeypatch.setenv("RIVERHOUSE_CODE_SERVER_PORT", "4000")
    write_deploy_config(tmp_path, DeployOptions())
    path = tmp_path / "workspace.yaml"
    loaded = ensure_workspace_config(yaml.safe_load(path.read_text()), str(path))
    assert loaded["load_from"] == [
        {"grpc_server": {"host": "riverhouse-code", "port": 4000, "location_name": "riverhouse"}}
    ]

    write_deploy_config(tmp_path, DeployOptions(workspace="module"))
    loaded = ensure_workspace_config(yaml.safe_load(path.read_text()), str(path))
    assert loaded["load_from"][0]["python_module"]["module_name"] == "riverhouse.definitions"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-concurrent-runs", "0"], "--max-concurrent-runs must be 1 or more"),
        (["--runs-per-pipeline", "5", "--max-concurrent-runs", "2"], "cannot exceed --max-concurrent-runs"),
        (["--workspace", "k8s"], "--workspace must be grpc or module"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["deploy-config", "--out", str(tmp_path / "d"), *args])
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "d" / "dagster.yaml").exists()


def test_the_local_ui_instance_has_the_production_run_and_pool_limits(tmp_path: Path) -> None:
    from riverhouse.deploy import local_dagster_home

    home = local_dagster_home(tmp_path / "ui")
    ref = InstanceRef.from_dir(str(home))  # loads as `dagster dev` loads it (SQLite storage)
    assert (
        ref.settings["concurrency"]
        == yaml.safe_load((write_deploy_config(tmp_path / "prod", DeployOptions())[0]).read_text())["concurrency"]
    )
    assert ref.settings["telemetry"] == {"enabled": False}
    # Runs launched from the UI, a sensor or a schedule start warm (riverhouse/launcher.py).
    instance = DagsterInstance.from_ref(ref)
    try:
        assert type(instance.run_launcher).__name__ == "WarmRunLauncher"
    finally:
        instance.dispose()
