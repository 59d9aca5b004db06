"""Issue 19 in Dagster: no secret in the repository snapshot; a broken spec does not take the others down."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest
import yaml

from riverhouse.definitions import SPEC_ERRORS_GROUP, build_definitions
from riverhouse.platform.spec import load_spec
from riverhouse.platform.state.settings import Settings
from riverhouse.resources import resources_from_settings
from tests.conftest import REPO
from tests.hostile_files import HOSTILE_FILES

pytestmark = pytest.mark.dagster

DSN = "https://alice:s3cret@ch.example.com:8443/analytics"


def snapshot_text(defs: dg.Definitions) -> str:
    """The repository snapshot the webserver gets from the code server (the UI's Resources page reads it).

    Internal Dagster API on purpose: the test must look at exactly what leaves the code location.
    """
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._serdes import serialize_value

    return serialize_value(RepositorySnap.from_def(defs.get_repository_def()))


def test_clickhouse_password_is_not_in_the_repository_snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RIVERHOUSE_CLICKHOUSE_DSN", DSN)
    settings = Settings.from_env(tmp_path)
    defs = build_definitions([load_spec(REPO / "pipelines" / "orders_dedup.yaml")], settings)
    text = snapshot_text(defs)
    assert "s3cret" not in text
    assert "RIVERHOUSE_CLICKHOUSE_DSN" in text  # shown as the variable's name
    # At run time the resource still gets the real value.
    with dg.build_resources({"riverhouse": resources_from_settings(settings)["riverhouse"]}) as built:
        assert built.riverhouse.clickhouse_dsn == DSN
        assert built.riverhouse.settings().clickhouse_dsn == DSN


def test_a_dsn_with_a_password_that_is_not_from_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RIVERHOUSE_CLICKHOUSE_DSN", raising=False)
    settings = Settings.from_env(tmp_path).with_(clickhouse_dsn=DSN)
    with pytest.raises(ValueError, match="set it in RIVERHOUSE_CLICKHOUSE_DSN") as info:
        resources_from_settings(settings)
    assert "s3cret" not in str(info.value)


def test_a_broken_spec_is_a_placeholder_and_the_others_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "pipelines"
    folder.mkdir()
    good = yaml.safe_load((REPO / "pipelines" / "orders_dedup.yaml").read_text())
    (folder / "a_good.yaml").write_text(yaml.safe_dump(good))
    broken = {**good, "name": "h4\n"}
    (folder / "broken-spec.yaml").write_text(yaml.safe_dump(broken))
    (folder / "not_yaml.yaml").write_text("name: [unclosed\n")
    clash = {**good, "name": "pipe_c", "sources": {"orders": {**good["sources"]["orders"], "topic": "other"}}}
    (folder / "pipe_c.yaml").write_text(yaml.safe_dump(clash))
    monkeypatch.setenv("RIVERHOUSE_PIPELINES", str(folder))
    with caplog.at_level("ERROR", logger="riverhouse.definitions"):
        defs = build_definitions(settings=Settings.from_env(tmp_path))
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey(["silver", "orders_dedup", "orders"]) in graph.get_all_asset_keys()
    assert defs.resolve_sensor_def("orders_dedup_kafka_lag_sensor") is not None
    placeholders = {key for key in graph.get_all_asset_keys() if key.path[0] == SPEC_ERRORS_GROUP}
    assert placeholders == {
        dg.AssetKey([SPEC_ERRORS_GROUP, "broken_spec"]),
        dg.AssetKey([SPEC_ERRORS_GROUP, "not_yaml"]),
        dg.AssetKey([SPEC_ERRORS_GROUP, "pipe_c"]),
    }
    broken_node = graph.get(dg.AssetKey([SPEC_ERRORS_GROUP, "broken_spec"]))
    assert "broken-spec.yaml" in (broken_node.description or "") and "not a safe SQL identifier" in (
        broken_node.description or ""
    )
    assert "already loaded by" in (graph.get(dg.AssetKey([SPEC_ERRORS_GROUP, "pipe_c"])).description or "")
    assert "broken-spec.yaml" in caplog.text and "not_yaml.yaml" in caplog.text


def test_files_that_once_crashed_the_code_location_are_placeholders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 27: a window too large for a timedelta, parentheses and YAML nested thousands deep, bytes
    that are not UTF-8 (in the file and in its name), a key given twice: each is its file's placeholder."""
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "a_good.yaml").write_bytes((REPO / "pipelines" / "orders_dedup.yaml").read_bytes())
    for name, raw in HOSTILE_FILES.items():
        (folder / name).write_bytes(raw)
    (folder / "twice.yaml").write_bytes(b"name: twice\nname: again\n")
    Path(os.fsdecode(os.fsencode(folder) + b"/bad\xffname.yaml")).write_bytes(b"name: x\n")
    monkeypatch.setenv("RIVERHOUSE_PIPELINES", str(folder))
    defs = build_definitions(settings=Settings.from_env(tmp_path))
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey(["silver", "orders_dedup", "orders"]) in graph.get_all_asset_keys()
    placeholders = {key.path[1] for key in graph.get_all_asset_keys() if key.path[0] == SPEC_ERRORS_GROUP}
    assert placeholders == {
        "huge_window",
        "deep_query",
        "deep_yaml",
        "not_utf8",
        "control_char",
        "bad_date",
        "twice",
        "bad_udcffname",
    }  # the byte shown escaped
    assert "not UTF-8 text" in (graph.get(dg.AssetKey([SPEC_ERRORS_GROUP, "not_utf8"])).description or "")
    assert "given twice" in (graph.get(dg.AssetKey([SPEC_ERRORS_GROUP, "twice"])).description or "")
    assert snapshot_text(defs)  # the whole repository serializes, odd file name included
