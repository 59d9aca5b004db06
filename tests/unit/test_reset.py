"""`riverhouse reset PIPELINE` (issue 19 item 10): the command the error messages name exists and does
what they need: one pipeline's Delta tables, checkpoints, ClickHouse table and ledger rows go; nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from riverhouse.platform.sink.clickhouse import LEDGER_TABLE, ensure_schema, ledger_table, open_client
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.state.settings import Settings
from tests.conftest import REPO

pytestmark = pytest.mark.unit


def spec_data(name: str, table: str) -> dict:
    data = yaml.safe_load((REPO / "pipelines" / "orders_dedup.yaml").read_text())
    data["name"] = name
    data["sink"]["table"] = table
    return data


def reset_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERHOUSE_")}
    return subprocess.run(
        [sys.executable, "-m", "riverhouse.cli", "reset", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdin=subprocess.DEVNULL,
    )


def test_reset_removes_one_pipelines_state_and_nothing_else(tmp_path: Path) -> None:
    home = tmp_path / "home"
    settings = Settings.from_env(home)
    mine, other = parse_spec(spec_data("mine", "mine_orders")), parse_spec(spec_data("other", "other_orders"))
    spec_file = tmp_path / "mine.yaml"
    spec_file.write_text(yaml.safe_dump(spec_data("mine", "mine_orders")))
    kept: list[Path] = []
    for spec in (mine, other):
        for layer in ("bronze", "silver", "quarantine"):
            folder = Path(settings.warehouse) / layer / spec.name / "orders"
            folder.mkdir(parents=True)
            (folder / "part-0.parquet").write_bytes(b"x")
        ckpt = settings.checkpoints / spec.name / "orders" / "spark"
        ckpt.mkdir(parents=True)
        if spec is other:
            kept += [Path(settings.warehouse) / "silver" / "other", settings.checkpoints / "other"]
    with open_client(settings.clickhouse_dsn) as client:
        for spec in (mine, other):
            ensure_schema(client, spec)
            client.insert(
                ledger_table(spec),
                [[spec.name, spec.sink.table, "id", 0, 1, 1]],
                column_names=["pipeline", "target", "table_id", "delta_version", "rows", "chunks"],
            )

    # Not confirmed (no terminal, no --yes): nothing happens.
    refused = reset_cli(home, str(spec_file))
    assert refused.returncode == 1 and "--yes" in refused.stderr
    assert (Path(settings.warehouse) / "silver" / "mine").exists()

    done = reset_cli(home, str(spec_file), "--yes")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for layer in ("bronze", "silver", "quarantine"):
        assert not (Path(settings.warehouse) / layer / "mine").exists()
    assert not (settings.checkpoints / "mine").exists()
    assert all(path.exists() for path in kept)
    with open_client(settings.clickhouse_dsn) as client:
        tables = {r[0] for r in client.query("SHOW TABLES").result_rows}
        assert "mine_orders" not in tables and "other_orders" in tables
        ledger = client.query(f"SELECT pipeline FROM {LEDGER_TABLE} ORDER BY pipeline").result_rows
        assert [r[0] for r in ledger] == ["other"]


def test_reset_by_name_looks_in_the_pipelines_folder(tmp_path: Path) -> None:
    proc = reset_cli(tmp_path / "home", "no_such_pipeline", "--pipelines", str(REPO / "pipelines"))
    assert proc.returncode == 1 and "no valid spec named 'no_such_pipeline'" in proc.stderr
