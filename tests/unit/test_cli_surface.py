"""The command line's surface (issue 31): --version, generate without a broker, validate --json, kafka status --json.

No broker is started here: a closed port and state files stand for the cases; tests/integration/test_cli.py
runs `kafka status --json` and `generate` against the real local broker.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from riverhouse.cli import app
from riverhouse.platform.runtime.processes import free_port
from riverhouse.platform.spec import SpecError, load_spec
from tests.conftest import REPO, riverhouse_cmd

pytestmark = pytest.mark.unit

DEDUP_SPEC = REPO / "pipelines" / "orders_dedup.yaml"


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the operator's RIVERHOUSE_* settings (a developer's shell may have them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIVERHOUSE_")}
    return env | extra


def test_version_prints_the_installed_version_and_exits_0() -> None:
    installed = importlib.metadata.version("riverhouse")
    # The metadata comes from pyproject.toml: the printed version is the project's, not a copy of it.
    assert installed == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"riverhouse {installed}"
    # As a user runs it (the console script's main()), and before any command's own checks.
    proc = subprocess.run([*riverhouse_cmd(), "--version"], capture_output=True, text=True, env=clean_env())
    assert (proc.returncode, proc.stdout.strip()) == (0, f"riverhouse {installed}"), proc.stderr
    assert "--version" in CliRunner().invoke(app, ["--help"]).stdout


def _fake_local_state(home: Path, bootstrap: str, pid: int, listeners: dict[str, str] | None = None) -> None:
    """The state file `riverhouse kafka start` leaves: pid and addresses of the broker."""
    state_dir = home / "kafka"
    state_dir.mkdir(parents=True)
    listeners = listeners or {"PLAINTEXT": bootstrap}
    state = {"pid": pid, "bootstrap": bootstrap, "started_at": time.time() - 42, "listeners": listeners}
    (state_dir / "state.json").write_text(json.dumps(state))


def test_generate_without_a_broker_says_which_address_and_what_to_do(tmp_path: Path) -> None:
    """Each source of the address gets its hint; the message is never empty, and no traceback."""
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there: connections are refused
    local_home = tmp_path / "local"
    # A state file naming a live process (this test's) whose port answers nothing: a hung broker.
    _fake_local_state(local_home, closed, os.getpid())
    generate = [*riverhouse_cmd(), "generate", "--count", "10", "--malformed", "0"]
    cases = {
        "option": ([*generate, "--bootstrap", closed, "--home", str(tmp_path / "a")], clean_env()),
        "env": ([*generate, "--home", str(tmp_path / "b")], clean_env(RIVERHOUSE_KAFKA_BOOTSTRAP=closed)),
        "local": ([*generate, "--home", str(local_home)], clean_env()),
    }
    # Side by side: each waits for its metadata request's timeout.
    running = {
        name: subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, (argv, env) in cases.items()
    }
    results = {name: (proc.communicate(timeout=120)[1], proc.returncode) for name, proc in running.items()}
    hints = {
        "option": "start it with `riverhouse kafka start` and leave out --bootstrap",
        "env": "RIVERHOUSE_KAFKA_BOOTSTRAP names it",
        "local": f"does not answer: see its logs in {local_home / 'kafka' / 'logs'}",
    }
    for name, (stderr, code) in results.items():
        text = " ".join(stderr.split())  # the console may wrap long lines
        assert code == 1, (name, stderr)
        assert "Traceback" not in stderr, (name, stderr)
        # The quick metadata check answered, not the topic creation's timeout (whose message was empty).
        assert f"cannot reach Kafka at {closed} (no answer within" in text, (name, stderr)
        assert "Connection refused" in text, (name, stderr)
        assert hints[name] in text, (name, stderr)


def test_generate_without_a_local_kafka_names_every_way_to_give_one(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*riverhouse_cmd(), "generate", "--home", str(tmp_path)], capture_output=True, text=True, env=clean_env()
    )
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "the local Kafka is not running: start it with `riverhouse kafka start`" in text
    assert "RIVERHOUSE_KAFKA_BOOTSTRAP" in text


def test_validate_json_reports_each_file_with_its_pipeline_or_its_problems(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    data = yaml.safe_load(DEDUP_SPEC.read_text())
    data["name"] = "other_name"
    data["sources"]["orders"]["key"] = ["no_such_field"]
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as loading:
        load_spec(bad)
    missing = tmp_path / "missing.yaml"
    # Valid, broken, a clash with the first (same name, same table), unreadable.
    files = [DEDUP_SPEC, bad, DEDUP_SPEC, missing]
    result = CliRunner().invoke(app, ["validate", "--json", *map(str, files)])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert [f["file"] for f in report["files"]] == [str(f) for f in files]
    assert [f["valid"] for f in report["files"]] == [True, False, False, False]
    first = report["files"][0]
    assert first["pipeline"] == "orders_dedup" and first["sources"] == {"orders": "orders"}
    assert first["sinks"] == [{"kind": "clickhouse", "database": None, "table": "orders"}]
    assert "problems" not in first
    # Every problem of the loader, as (field path, message, hint).
    broken = [(p["field"], p["message"], p["hint"] or "") for p in report["files"][1]["problems"]]
    assert broken == loading.value.problems
    assert broken[0][0] == "sources.orders" and "no_such_field" in broken[0][1]
    clash = {p["field"]: p for p in report["files"][2]["problems"]}
    assert set(clash) == {"name", "sink.table"}
    assert clash["name"]["hint"] == "give each pipeline its own name"
    assert report["files"][3]["problems"] == [
        {"field": "", "message": "cannot read file: No such file or directory", "hint": "check the path"}
    ]

    every = sorted((REPO / "pipelines").glob("*.yaml"))
    ok = CliRunner().invoke(app, ["validate", "--json", *map(str, every)])
    assert ok.exit_code == 0, ok.output
    valid = json.loads(ok.stdout)
    assert valid["valid"] is True and len(valid["files"]) == len(every) >= 2
    assert all(f["valid"] and f["pipeline"] for f in valid["files"])


def test_kafka_status_json_follows_the_engine_status_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIVERHOUSE_SPARK_REMOTE", raising=False)
    runner = CliRunner()
    nothing = runner.invoke(app, ["kafka", "status", "--json", "--home", str(tmp_path / "none")])
    assert nothing.exit_code == 1  # as without --json
    assert json.loads(nothing.stdout) == {
        "bootstrap": None,
        "source": "local",
        "running": False,
        "state_dir": str(tmp_path / "none" / "kafka"),
    }
    engine = runner.invoke(app, ["engine", "status", "--json", "--home", str(tmp_path / "none")])
    assert {"source", "running"} <= set(json.loads(engine.stdout))  # the keys both statuses share

    # A state file whose process is gone (a broker killed with -9): not running either.
    dead_home = tmp_path / "dead"
    gone = subprocess.Popen(["true"])
    gone.wait()
    _fake_local_state(dead_home, "127.0.0.1:9", gone.pid)
    dead = runner.invoke(app, ["kafka", "status", "--json", "--home", str(dead_home)])
    assert dead.exit_code == 1 and json.loads(dead.stdout)["running"] is False

    # The state file of a running secure broker (this process stands for it: status checks the pid).
    home = tmp_path / "running"
    listeners = {"PLAINTEXT": "127.0.0.1:9092", "SASL_SSL": "127.0.0.1:9093", "SSL": "127.0.0.1:9094"}
    _fake_local_state(home, "127.0.0.1:9092", os.getpid(), listeners)
    status = runner.invoke(app, ["kafka", "status", "--json", "--home", str(home)])
    assert status.exit_code == 0, status.output
    report = json.loads(status.stdout)
    assert (report["bootstrap"], report["running"], report["pid"]) == ("127.0.0.1:9092", True, os.getpid())
    assert report["listeners"] == listeners and 40 <= report["uptime_s"] <= 600
    secure = home / "kafka" / "secure"
    assert report["secure_files"]["ca"] == str(secure / "ca.pem")
    assert report["secure_files"]["client_key"] == str(secure / "client.key")
    text = runner.invoke(app, ["kafka", "status", "--home", str(home)])
    assert text.exit_code == 0 and "local Kafka running: bootstrap 127.0.0.1:9092" in text.stdout
