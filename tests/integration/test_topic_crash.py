"""A Kafka sink under crashes: SIGKILL `riverhouse run` around its transactions, re-run, read the topic back.

The crashed run is a `riverhouse run` process killed by its own crash point (RIVERHOUSE_CRASH_AT):
the sink produces in the run's process, beside an engine or not; the re-run is `Pipeline.run` in
the test's Spark session (as tests/integration/test_crash.py does).
A plain confluent-kafka consumer with isolation.level=read_committed must then read exactly the
order ids the generator produced, each once. Where the crash leaves records sent but not
committed, a read_uncommitted consumer proves they are in the log, so the test is not passing
because nothing was sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.kafka.generator import GeneratorConfig, orders
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.sink.topic_ledger import read_progress
from riverhouse.platform.spec import load_spec
from riverhouse.platform.state.settings import Settings
from tests.conftest import orders_spec_data, produce
from tests.integration.test_crash import assert_crashed, run_cli
from tests.integration.test_topic_sink import committed_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def setup(tmp_path: Path, bootstrap: str, topic: str) -> tuple[Path, str, list[str]]:
    """Orders with duplicates in `topic`; a spec whose only sink is a topic, in transactions of 40 rows.

    A micro-batch holds up to 150 records, so a Delta version (~100 new orders) takes several
    transactions: a crash between two of them leaves a version half in the topic."""
    cfg = GeneratorConfig(count=400, duplicate_rate=0.25, malformed=6, out_of_order=0.1, seed=28)
    records, stats = orders(cfg)
    records = list(records)
    produce(bootstrap, topic, records)
    expected = sorted({json.loads(v)["order_id"] for _, v in records if v and v.startswith(b'{"order_id":"o-')})
    assert len(expected) == stats.expected_unique == 400
    data = orders_spec_data(topic, name="crashtopic", max_offsets=150)
    out = f"{topic}_out"
    data["sink"] = {"kind": "kafka", "topic": out, "key": ["order_id"], "transaction_rows": 40}
    path = tmp_path / "crashtopic.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, out, expected


def ids(records: list[Any]) -> list[str]:
    return sorted(json.loads(r.value())["order_id"] for r in records)


def rerun(spec_path: Path, settings: Settings, spark: Any) -> dict[str, Any]:
    return Pipeline(load_spec(spec_path), settings, spark=spark, log=lambda m: None).run()


@pytest.mark.parametrize(
    ("point", "visit"),
    [
        ("before_topic_transaction", "1"),  # silver committed, nothing in the topic yet
        ("during_topic_transaction", "3"),  # two transactions in; the third's rows sent, not committed
        ("after_topic_commit", "2"),  # a transaction committed, the next not begun
    ],
)
def test_sigkill_around_the_topic_transactions(
    tmp_path: Path, kafka: str, topic: str, settings: Settings, spark: Any, point: str, visit: str
) -> None:
    spec_path, out, expected = setup(tmp_path, kafka, topic)
    crashed = run_cli(spec_path, settings, RIVERHOUSE_CRASH_AT=point, RIVERHOUSE_CRASH_ON=visit)
    assert_crashed(crashed, point)  # the sink produces in the run's own process: SIGKILLed there

    before = committed_records(kafka, out)
    committed_before = {"before_topic_transaction": 0, "during_topic_transaction": 2, "after_topic_commit": 2}
    assert len(set(ids(before))) == len(before)  # what is committed holds no order twice
    assert len(before) <= committed_before[point] * 40 and (len(before) > 0) == (committed_before[point] > 0)
    if point == "after_topic_commit":
        # the ledger says the crash came in the middle of a version: the re-run resumes at its next chunk
        sink = load_spec(spec_path).topic_sinks[0]
        progress = read_progress({"bootstrap.servers": kafka, "log_level": 0}, sink.ledger, "crashtopic")
        assert progress is not None and not progress.complete and progress.chunks >= 1
        assert progress.rows == len(before)
    if point == "during_topic_transaction":
        sent = committed_records(kafka, out, isolation="read_uncommitted")
        assert len(sent) > len(before)  # the third transaction's rows are in the log, uncommitted

    summary = rerun(spec_path, settings, spark)

    after = committed_records(kafka, out)
    assert ids(after) == expected  # every order once: no loss, no duplicate
    assert summary["topic_rows_produced"] == len(expected) - len(before)
    if point == "during_topic_transaction":
        # the aborted rows are still in the log; read_committed consumers never see them
        assert len(committed_records(kafka, out, isolation="read_uncommitted")) > len(after)
    assert rerun(spec_path, settings, spark)["topic_rows_produced"] == 0


def test_broker_restart_between_a_crash_and_the_rerun(
    tmp_path: Path, topic: str, tmp_path_factory: pytest.TempPathFactory, spark: Any
) -> None:
    """The crashed run's open transaction survives a broker restart; the re-run's producer aborts it."""
    state_dir = tmp_path_factory.mktemp("restarted_kafka")
    bootstrap = local_kafka.start(state_dir).bootstrap
    try:
        settings = Settings.from_env(tmp_path / "home").with_(kafka_bootstrap=bootstrap)
        spec_path, out, expected = setup(tmp_path, bootstrap, topic)
        crashed = run_cli(spec_path, settings, RIVERHOUSE_CRASH_AT="during_topic_transaction", RIVERHOUSE_CRASH_ON="2")
        assert_crashed(crashed, "during_topic_transaction")
        before = committed_records(bootstrap, out)
        assert 0 < len(before) <= 40

        local_kafka.stop(state_dir)
        assert local_kafka.start(state_dir).bootstrap == bootstrap  # same ports, same data

        rerun(spec_path, settings, spark)
        assert ids(committed_records(bootstrap, out)) == expected
    finally:
        local_kafka.stop(state_dir)
