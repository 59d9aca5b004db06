"""Kafka's tooling sees a pipeline's lag: each run commits the offsets Spark committed to the
consumer group `riverhouse-<pipeline>` (kafka.consumer_group), read back here with Kafka's own
consumer API, as kafka-consumer-groups does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from riverhouse.platform.kafka.client import commit_group_offsets, watermarks
from riverhouse.platform.kafka.generator import GeneratorConfig, orders
from riverhouse.platform.pipeline import Pipeline
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.state.settings import Settings
from tests.conftest import orders_spec_data, produce

pytestmark = [pytest.mark.integration]


def group_offsets(bootstrap: str, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """The group's committed offset per partition (negative: none), as Kafka stores it."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=15)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def test_a_run_commits_its_end_offsets_to_its_consumer_group(
    spark: Any, kafka: str, topic: str, tmp_path: Path
) -> None:
    records, _ = orders(GeneratorConfig(count=400, duplicate_rate=0.1, malformed=2, seed=5))
    produce(kafka, topic, list(records))
    high = {int(p): hi for p, (_, hi) in watermarks({"bootstrap.servers": kafka}, [topic])[topic].items()}
    partitions = sorted(high)

    data = orders_spec_data(topic, name="grouped", max_offsets=150)  # several batches
    summary = Pipeline(parse_spec(data), Settings.from_env(tmp_path / "a").with_(kafka_bootstrap=kafka),
                       spark=spark, log=lambda m: None).run()  # fmt: skip
    assert summary["batches"] >= 2
    assert group_offsets(kafka, "riverhouse-grouped", topic, partitions) == high  # lag 0 after the run

    # A group named in the spec; and none at all when commit_offsets is off.
    data = orders_spec_data(topic, name="named", max_offsets=150)
    data["kafka"] |= {"consumer_group": "analytics.orders-rh", "group_id_prefix": "acme-riverhouse"}
    Pipeline(parse_spec(data), Settings.from_env(tmp_path / "b").with_(kafka_bootstrap=kafka),
             spark=spark, log=lambda m: None).run()  # fmt: skip
    assert group_offsets(kafka, "analytics.orders-rh", topic, partitions) == high
    assert all(o < 0 for o in group_offsets(kafka, "riverhouse-named", topic, partitions).values())

    data = orders_spec_data(topic, name="quiet", max_offsets=500)
    data["kafka"] |= {"commit_offsets": False}
    Pipeline(parse_spec(data), Settings.from_env(tmp_path / "c").with_(kafka_bootstrap=kafka),
             spark=spark, log=lambda m: None).run()  # fmt: skip
    assert all(o < 0 for o in group_offsets(kafka, "riverhouse-quiet", topic, partitions).values())


def test_group_names_are_plain_and_the_prefix_reaches_the_connector() -> None:
    from riverhouse.platform.kafka.client import connector_options
    from riverhouse.platform.spec import SpecError

    data = orders_spec_data("t", name="p")
    data["kafka"] |= {"group_id_prefix": "acme-rh"}
    spec = parse_spec(data)
    assert connector_options(spec.kafka, "b:9092", ["t"])["groupIdPrefix"] == "acme-rh"
    assert "groupIdPrefix" not in connector_options(parse_spec(orders_spec_data("t")).kafka, "b:9092", ["t"])
    assert spec.kafka.monitoring_group("p") == "riverhouse-p"
    for bad in ("a b", "x;y", "", "g" * 201, "${env:GROUP}"):
        data["kafka"] |= {"consumer_group": bad}
        with pytest.raises(SpecError) as caught:
            parse_spec(data)
        assert "consumer_group" in str(caught.value)


def test_a_commit_to_a_broker_that_is_gone_fails_within_its_timeout() -> None:
    """A run reports its offsets after each batch: with the broker stopped mid-run, the report
    must fail (then a warning), not wait for the group's coordinator for ever and hang the run."""
    import threading

    from confluent_kafka import KafkaException

    from riverhouse.platform.runtime.processes import free_port

    outcome: list[BaseException | None] = []

    def commit() -> None:
        try:
            commit_group_offsets(
                {"bootstrap.servers": f"127.0.0.1:{free_port()}", "log_level": 0}, "g", {"t": {"0": 5}}, timeout_s=5
            )
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=commit, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the commit still waits for a broker that is gone"
    assert isinstance(outcome[0], KafkaException), outcome
