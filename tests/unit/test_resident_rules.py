"""The rules of a resident query that need no engine: when Spark's commits cover a trigger's offsets,
what restarts the query, which specs may ask for one, and who may write a batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from riverhouse.platform.ingest.resident import covers, fingerprint
from riverhouse.platform.kafka.client import batch_offsets, committed_offsets
from riverhouse.platform.spec import SpecError, load_spec, parse_spec
from riverhouse.platform.state.checkpoints import BatchChannel
from riverhouse.platform.state.settings import Settings
from tests.conftest import orders_spec_data

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


def test_commits_cover_the_trigger_only_when_every_partition_reached_its_end() -> None:
    target = {"t": {"0": 10, "1": 0, "2": 5}}
    assert covers({"t": {"0": 10, "1": 0, "2": 5}}, target)
    assert covers({"t": {"0": 12, "2": 7}}, target)  # partition 1 holds nothing: nothing to wait for
    assert not covers({"t": {"0": 9, "1": 0, "2": 5}}, target)
    assert not covers({"t": {"0": 10}}, target)  # partition 2 never read
    assert not covers(None, target)
    assert covers(None, {"t": {}})  # an empty topic


def test_a_change_of_spec_paths_or_release_changes_the_fingerprint(tmp_path: Path, monkeypatch) -> None:
    import riverhouse

    spec = parse_spec(orders_spec_data("t1", name="res"))
    settings = Settings.from_env(tmp_path / "home")
    same = fingerprint(parse_spec(orders_spec_data("t1", name="res")), settings)
    assert fingerprint(spec, settings) == same
    assert fingerprint(parse_spec(orders_spec_data("t1", name="res", window="2h")), settings) != same
    assert fingerprint(spec, Settings.from_env(tmp_path / "other")) != same
    monkeypatch.setattr(riverhouse, "__version__", "9.9.9")
    assert fingerprint(spec, settings) != same


def test_join_pipelines_cannot_keep_a_resident_query() -> None:
    for name in ("orders_enriched.yaml", "orders_sql.yaml"):
        data = yaml.safe_load((PIPELINES / name).read_text())
        data.setdefault("orchestration", {})["resident_query"] = True
        with pytest.raises(SpecError, match="resident_query is for single-source pipelines, not joins"):
            parse_spec(data)
    single = yaml.safe_load((PIPELINES / "orders_dedup.yaml").read_text())
    single.setdefault("orchestration", {})["resident_query"] = True
    assert parse_spec(single).orchestration.resident_query
    assert not load_spec(PIPELINES / "orders_dedup.yaml").orchestration.resident_query  # off by default


def test_a_body_writes_only_while_its_run_owns_an_existing_checkpoint(tmp_path: Path) -> None:
    old, new = BatchChannel(tmp_path / "ckpt", run="old"), BatchChannel(tmp_path / "ckpt", run="new")
    assert not old.may_write()  # no owner marker: the checkpoint is gone (a reset), or never started
    old.take_over()
    assert old.may_write() and not new.may_write()
    new.take_over()
    assert new.may_write() and not old.may_write()
    new.request_stop()
    assert not new.may_write() and not old.may_write()


def test_the_offsets_of_a_batch_and_of_the_last_committed_one(tmp_path: Path) -> None:
    spark = tmp_path / "spark"
    (spark / "offsets").mkdir(parents=True)
    (spark / "commits").mkdir()
    for batch, end in ((0, 5), (1, 9), (2, 14)):
        meta = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'
        (spark / "offsets" / str(batch)).write_text(f'v1\n{meta}\n{{"t":{{"0":{end},"1":3}}}}\n')
    for batch in (0, 1):  # batch 2 is planned, not committed
        (spark / "commits" / str(batch)).write_text("v1\n{}\n")
    assert batch_offsets(spark, 2) == {"t": {"0": 14, "1": 3}}
    assert batch_offsets(spark, 7) is None
    assert committed_offsets(spark) == {"t": {"0": 9, "1": 3}}
