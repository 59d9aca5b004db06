"""Kafka for Riverhouse: options for Spark's Kafka connector, and librdkafka for offsets.

The pipeline reads Kafka with Spark's own connector (`spark.readStream.format("kafka")`,
`spark-sql-kafka-0-10`, pinned in jvm/pom.xml); `connector_options` turns a spec into
its options. Offsets live only in Spark's checkpoint: nothing is committed to a consumer
group.

A spec states security once (`kafka.security`); it is mapped here to the Java client
(`kafka.security.protocol`, `kafka.sasl.jaas.config`, PEM trust and key stores) and to
librdkafka (`security.protocol`, `sasl.*`, `ssl.*.location`). `${env:NAME}` references
are resolved on the driver only; the options that then hold a secret are named by
`SECRET_OPTIONS_REGEX`, which the session's redaction settings use (spark.py), so they
never appear in a plan, the query's progress or the Spark UI.

librdkafka (confluent-kafka) stays for what needs no JVM: the watermarks behind the lag
sensor, the generator and the benchmarks, and the check a run makes before it starts,
which names the records Kafka lost since the checkpoint (retention, a recreated topic).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from riverhouse.platform.envrefs import resolve_env_refs
from riverhouse.platform.kafka.client_settings import JAVA, LIBRDKAFKA, for_client, java_value

METADATA_TIMEOUT_S = 15.0
# Beside Spark's checkpoint of a source: the Kafka topic ids its offsets belong to.
TOPIC_IDS_FILE = "kafka_topic_ids.json"
# Java client options that carry a secret once `${env:...}` is resolved (jaas: the password;
# keystore.key: the client's private key). Spark redacts options whose key or value matches.
SECRET_OPTIONS_REGEX = r"(?i)jaas|password|secret|token|keystore\.key|ssl\.key"
JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}

Offsets = dict[str, dict[str, int]]


class KafkaSourceError(RuntimeError):
    pass


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_security(security: Any) -> dict[str, str]:
    """`kafka.security` as Java client settings (no `kafka.` prefix); secrets resolved."""
    if security is None:
        return {}
    out = {"security.protocol": security.protocol}
    if security.mechanism:
        username = resolve_env_refs(security.username, "kafka.security.username")
        password = resolve_env_refs(security.password, "kafka.security.password")
        out["sasl.mechanism"] = security.mechanism
        out["sasl.jaas.config"] = (
            f"{JAAS_MODULES[security.mechanism]} required "
            f"username={_jaas_quote(username)} password={_jaas_quote(password)};"
        )
    if security.ca:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = security.ca
    if security.certificate and security.key:
        # The Java client's PEM key store takes the certificate chain and the (PKCS#8) key
        # as text; read on the driver, they travel in the options, which Spark redacts.
        out["ssl.keystore.type"] = "PEM"
        out["ssl.keystore.certificate.chain"] = _read_pem(security.certificate, "kafka.security.certificate")
        out["ssl.keystore.key"] = _read_pem(security.key, "kafka.security.key")
    return out


def librdkafka_security(security: Any) -> dict[str, str]:
    """`kafka.security` as librdkafka settings; secrets resolved."""
    if security is None:
        return {}
    out = {"security.protocol": security.protocol}
    if security.mechanism:
        out["sasl.mechanism"] = security.mechanism
        out["sasl.username"] = resolve_env_refs(security.username, "kafka.security.username")
        out["sasl.password"] = resolve_env_refs(security.password, "kafka.security.password")
    if security.ca:
        out["ssl.ca.location"] = security.ca
    if security.certificate and security.key:
        out["ssl.certificate.location"] = security.certificate
        out["ssl.key.location"] = security.key
    return out


def _read_pem(path: str, where: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise KafkaSourceError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None


def librdkafka_config(kafka: Any, bootstrap: str) -> dict[str, Any]:
    """librdkafka settings for a spec's Kafka (its allowed `config` settings + its security); never log them."""
    # librdkafka's own log would repeat a down broker many times a second on stderr; its
    # errors reach the user once, through error_cb, in the message of the error raised.
    config: dict[str, Any] = {"log_level": 0}
    config.update(for_client(kafka.resolved_config(), LIBRDKAFKA))
    config.update(librdkafka_security(kafka.security))
    # Set last: no spec setting may replace the servers (the spec's model refuses them too).
    config["bootstrap.servers"] = bootstrap
    return config


# The Java client settings Riverhouse changes for speed (a spec's `kafka.config` may set others):
# - fetch.max.wait.ms: the broker holds a fetch that finds no new record for up to this (Java's
#   default 500): each Spark task of a batch paid that once after reading its range, 2 s of a
#   7,000-record batch over 8 partitions on 2 cores. Executors only fetch ranges the driver has
#   already seen in Kafka, so a short wait costs no idle polling.
# - max.poll.records: Spark's connector seeks before every poll and, after it, asks the broker for
#   the partition's first and last offsets (two ListOffsets requests, and the seeks drop what the
#   consumer had buffered). With Java's default of 500 records a poll, a task read each 1 MB fetch
#   in pieces of 500 and fetched it again after each piece. 10,000 takes a typical fetch in one
#   poll: a Spark read of 550,010 bench records 1.74 -> 1.44 JVM CPU s, the broker's CPU
#   0.35 -> 0.15 s, 1.16 -> 0.86 s wall (bench/analysis.md). The records a poll holds stay
#   bounded by the fetch's size (max.partition.fetch.bytes, left at Java's 1 MB: 16 MB ran a
#   2 GB driver out of memory).
SPEED_OPTIONS = {"kafka.fetch.max.wait.ms": "10", "kafka.max.poll.records": "10000"}


def connector_options(kafka: Any, bootstrap: str, topics: list[str]) -> dict[str, str]:
    """Options for `spark.readStream.format("kafka")` from a spec's `kafka:` section."""
    options = {
        **SPEED_OPTIONS,  # the spec's `kafka.config` may set other values
        # The spec's allowed settings for the Java client next: Riverhouse's own below win.
        **{f"kafka.{k}": java_value(v) for k, v in for_client(kafka.resolved_config(), JAVA).items()},
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": ",".join(topics),
        "startingOffsets": kafka.starting_offsets,
        "failOnDataLoss": str(kafka.fail_on_data_loss).lower(),
        "maxOffsetsPerTrigger": str(kafka.max_offsets_per_trigger),
        # Batches end at the last stable offset: no record of an aborted transaction.
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
        # A broker that is gone fails the run within about a minute, not Spark's 2 minutes x retries.
        "kafka.default.api.timeout.ms": "15000",
        "kafka.request.timeout.ms": "15000",
        "kafkaConsumer.pollTimeoutMs": "60000",
        "fetchOffset.numRetries": "2",
    }
    if kafka.group_id_prefix:
        options["groupIdPrefix"] = kafka.group_id_prefix
    for key, value in java_security(kafka.security).items():
        options[f"kafka.{key}"] = value
    return options


def require_reachable(config: dict[str, Any], timeout_s: float = METADATA_TIMEOUT_S) -> None:
    """One metadata request; KafkaSourceError naming the address and librdkafka's reason unless Kafka answers."""
    reasons: list[str] = []
    consumer = collecting_consumer(config, "riverhouse-meta", reasons)
    try:
        topic_metadata(consumer, reasons, config, None, "", timeout_s)
    finally:
        consumer.close()


def topic_metadata(
    consumer: Any,
    reasons: list[str],
    config: dict[str, Any],
    topic: str | None,
    doing: str,
    timeout_s: float = METADATA_TIMEOUT_S,
    closed_is_final: bool = False,
) -> Any:
    """The cluster's metadata (of `topic` only, if given), or KafkaSourceError: "cannot reach Kafka at X {doing}: why".

    `reasons` is what the consumer's error_cb collected: librdkafka reports why a broker cannot be
    used (refused, authentication, TLS) only there; the metadata call itself just times out with
    "transport failure". `closed_is_final`: a port that refuses connections for REFUSED_FOR_S is
    an answer too (for a caller that asks again soon, as a sensor's next tick does); otherwise
    it is waited for until the timeout, as a restarting broker's is.
    """
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    first_refusal: float | None = None
    while True:
        try:
            return consumer.list_topics(topic, timeout=max(0.05, min(REFUSED_CHECK_S, deadline - time.monotonic())))
        except KafkaException as exc:
            consumer.poll(0.2)  # serves error_cb: the reason, if librdkafka knows one
            refused = _refused_for_good(reasons, closed_is_final)
            if refused is not None and first_refusal is None:
                first_refusal = time.monotonic()
            settled = first_refusal is not None and time.monotonic() - first_refusal >= REFUSED_FOR_S
            if not settled and time.monotonic() < deadline:
                continue
            reason = refused or _best_reason(reasons) or exc.args[0].str()
            waited = "" if refused else f" (no answer within {timeout_s:g}s)"
            doing = f" {doing}" if doing else ""
            raise KafkaSourceError(
                f"cannot reach Kafka at {config['bootstrap.servers']}{doing}{waited}: {reason}"
            ) from None


# How often a metadata request that gets no answer looks at why: a broker that refuses this
# client's credentials or certificates (SASL, TLS) for REFUSED_FOR_S will not accept them later
# in the timeout (librdkafka retries every ~0.35 s; the grace covers a user the broker has just
# been given), so the caller hears of it then instead of after the whole timeout. Any other
# failure (a broker that is not listening, or restarting) is waited for until the timeout.
REFUSED_CHECK_S = 0.5
REFUSED_FOR_S = 2.0
_REFUSALS = (
    "SASL authentication error",
    "certificate verify failed",
    "alert bad certificate",
    "alert unknown ca",
    "alert certificate",
)


# A port nothing listens on (librdkafka: "Connect to ipv4#127.0.0.1:9 failed: Connection refused").
_CLOSED = "Connection refused"


def _refused_for_good(reasons: list[str], closed_is_final: bool = False) -> str | None:
    """The first error saying the broker refused this client's credentials or TLS (or, if
    `closed_is_final`, its connection), if any."""
    words = (*_REFUSALS, _CLOSED) if closed_is_final else _REFUSALS
    return next((reason for reason in reasons if any(word in reason for word in words)), None)


def collecting_consumer(config: dict[str, Any], group_prefix: str, reasons: list[str], **extra: Any) -> Any:
    """A consumer that commits nothing (its group id is unique) and collects librdkafka's errors in `reasons`."""
    from confluent_kafka import Consumer

    return Consumer(
        {
            **config,
            "group.id": f"{group_prefix}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "error_cb": lambda err: reasons.append(err.str()),
            **extra,
        }
    )


def watermarks(
    config: dict[str, Any], topics: list[str], closed_is_final: bool = False
) -> dict[str, dict[int, tuple[int, int]]]:
    """(low, high) offsets of every partition of the topics; a missing topic has none.

    `closed_is_final`: see `topic_metadata`."""
    from confluent_kafka import KafkaException, TopicPartition

    reasons: list[str] = []
    consumer = collecting_consumer(config, "riverhouse-meta", reasons)
    try:
        out: dict[str, dict[int, tuple[int, int]]] = {}
        for topic in topics:
            doing = f"to list topic {topic!r}"
            metadata = topic_metadata(consumer, reasons, config, topic, doing, closed_is_final=closed_is_final)
            info = metadata.topics.get(topic)
            if info is None or info.error is not None or not info.partitions:
                out[topic] = {}
                continue
            try:
                out[topic] = {p: _watermark(consumer, TopicPartition(topic, p)) for p in sorted(info.partitions)}
            except KafkaException as exc:  # the broker went away between the two calls
                consumer.poll(0.2)
                raise KafkaSourceError(
                    f"cannot reach Kafka at {config['bootstrap.servers']} to read the offsets of topic {topic!r}: "
                    f"{_best_reason(reasons) or exc.args[0].str()}"
                ) from None
        return out
    finally:
        consumer.close()


def _watermark(consumer: Any, partition: Any) -> tuple[int, int]:
    """(low, high) of one partition, retrying what Kafka says is transient (a leader being elected)."""
    from confluent_kafka import KafkaError, KafkaException

    # librdkafka does not flag these retriable here, but they pass once the partition has a leader
    # again (right after a broker restart, every partition answers NOT_LEADER for a moment).
    electing = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
    deadline = time.monotonic() + METADATA_TIMEOUT_S
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            transient = error.retriable() or error.code() in electing
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _best_reason(reasons: list[str]) -> str:
    """The error that explains a failed connection: authentication or TLS first, then the latest."""
    for word in ("SASL", "uthentication", "SSL", "certificate"):
        for reason in reversed(reasons):
            if word in reason:
                return reason
    return reasons[-1] if reasons else ""


def lost_offsets(
    start: Offsets, low: Offsets, high: Offsets, skipping: bool = False, recreated: frozenset[str] = frozenset()
) -> list[str]:
    """What Kafka no longer holds of what the checkpoint says comes next, one line per partition.

    Records deleted by retention (the next offset is below the low watermark), partitions that
    disappeared and offsets that went backwards (the topic was deleted or recreated).
    `skipping` (fail_on_data_loss false) adds what Spark's connector will also pass over: a
    partition whose offsets went backwards resumes at its end when the batch is planned
    (`KafkaOffsetReader` drops a range whose end is below its start), so the records the
    recreated partition already holds are not read either. `recreated` names topics whose
    Kafka topic id changed since the checkpoint was written: their offsets belong to another
    topic even where they still look in range.
    """
    lost = []
    for topic, parts in sorted(start.items()):
        for partition, offset in sorted(parts.items(), key=lambda kv: int(kv[0])):
            name = f"{topic}[{partition}]"
            if topic in recreated and partition in high.get(topic, {}) and offset <= high[topic][partition]:
                first = low[topic][partition]
                line = (
                    f"{name}: the topic was deleted and recreated since the last batch (its Kafka topic id "
                    f"changed), so the next offset to read ({offset}) belongs to the old topic"
                )
                if skipping and offset > first:
                    line += (
                        f"; the connector reads on from offset {offset}, so the new topic's records "
                        f"{first}..{offset - 1} ({offset - first} records) are skipped"
                    )
                lost.append(line)
            elif partition not in high.get(topic, {}):
                lost.append(f"{name}: the partition no longer exists (the topic was deleted or recreated with fewer)")
            elif offset > high[topic][partition]:
                end, first = high[topic][partition], low[topic][partition]
                line = (
                    f"{name}: Kafka's offsets end at {end}, before the next offset to read ({offset}): "
                    "the topic was deleted and recreated"
                )
                if skipping and end > first:
                    line += (
                        f"; the connector resumes it at offset {end}, so its records {first}..{end - 1} "
                        f"({end - first} records) are skipped too"
                    )
                lost.append(line)
            elif offset < low[topic][partition]:
                lost.append(
                    f"{name}: offsets {offset}..{low[topic][partition] - 1} "
                    f"({low[topic][partition] - offset} records) were deleted by retention before they were read"
                )
    return lost


def committed_offsets(spark_checkpoint: Path) -> Offsets | None:
    """The source offsets of the last batch Spark committed, or None before the first batch."""
    commits = spark_checkpoint / "commits"
    if not commits.is_dir():
        return None
    done = sorted((int(p.name) for p in commits.iterdir() if p.name.isdigit()), reverse=True)
    for batch in done:
        if (offsets := batch_offsets(spark_checkpoint, batch)) is not None:
            return offsets
    return None


def batch_offsets(spark_checkpoint: Path, batch_id: int) -> Offsets | None:
    """The source end offsets Spark recorded for batch `batch_id` (None if it has none).

    Spark's Kafka source writes `offsets/<n>`: a version line, the batch metadata, then
    one line of `{topic: {partition: offset}}` per source.
    """
    try:
        lines = (spark_checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    except OSError:
        return None
    if len(lines) >= 3 and lines[2].strip().startswith("{"):
        return _offsets_line(lines[2])
    return None


def _offsets_line(line: str) -> Offsets:
    """A checkpoint's line of source offsets, `{topic: {partition: offset}}`, with partitions as text."""
    return {t: {str(p): int(o) for p, o in parts.items()} for t, parts in json.loads(line).items()}


def batch_records(spark_checkpoint: Path, batch_id: int) -> int | None:
    """How many Kafka offsets batch `batch_id` spans, from what Spark wrote in the checkpoint before
    it ran the batch: its end offsets (`offsets/<n>`) minus the batch before's, or, for the first
    batch, the source's first offsets (`sources/0/0`). None when that cannot be read. Offsets, not
    records: aborted transactions' records and markers count too (an upper bound)."""
    end = batch_offsets(spark_checkpoint, batch_id)
    start = batch_offsets(spark_checkpoint, batch_id - 1) if batch_id > 0 else _initial_offsets(spark_checkpoint)
    if end is None or start is None:
        return None
    return sum(max(0, o - start.get(t, {}).get(p, o)) for t, parts in end.items() for p, o in parts.items())


def _initial_offsets(spark_checkpoint: Path) -> Offsets | None:
    """The Kafka source's first offsets (`sources/0/0`: a version line, then `{topic: {partition: offset}}`)."""
    try:
        lines = (spark_checkpoint / "sources" / "0" / "0").read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [line for line in lines if line.strip().startswith("{")]
    try:
        return _offsets_line(found[0])
    except (IndexError, ValueError, AttributeError):
        return None


def commit_group_offsets(
    config: dict[str, Any], group: str, offsets: Offsets, timeout_s: float = METADATA_TIMEOUT_S
) -> None:
    """Commit `offsets` ({topic: {partition: next offset}}) to consumer group `group`.

    For monitoring only (Spark's checkpoint is what the pipeline reads from): Kafka's tools
    show the group's lag. The group never has members, so this is the admin API's offset
    change, bounded by `timeout_s`: a consumer's synchronous commit would wait for the
    group's coordinator for ever when the broker is gone, and hang the run it reports on.
    Raises on failure (a KafkaSourceError, or a timeout).
    """
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    partitions = [TopicPartition(t, int(p), o) for t, parts in offsets.items() for p, o in parts.items()]
    admin = AdminClient(config)
    request = [ConsumerGroupTopicPartitions(group, partitions)]
    for future in admin.alter_consumer_group_offsets(request, request_timeout=timeout_s).values():
        done = future.result(timeout=timeout_s + 5)
        failed = [tp for tp in done.topic_partitions or [] if tp.error is not None]
        if failed:
            raise KafkaSourceError(
                f"consumer group {group}: {failed[0].topic}[{failed[0].partition}]: {failed[0].error}"
            )


def check_data_loss(config: dict[str, Any], topics: list[str], spark_checkpoint: Path, fail: bool) -> list[str]:
    """Before a run: can Kafka be reached, and what did it lose of what the checkpoint says comes next?

    Raises (KafkaSourceError) when Kafka cannot be reached, and for lost records unless `fail` is False.

    Spark's connector also notices (failOnDataLoss), but its message names offsets, not
    causes; this one says which records are gone and why, and what to do. With `fail`
    False the connector skips them and this prints how many (on stderr).
    """
    # Always asked, even before a first batch: an unreachable broker, a wrong password or an
    # untrusted certificate is named here in one line, within METADATA_TIMEOUT_S, rather
    # than by a Java client's trace minutes later.
    marks = watermarks(config, topics)
    ids_file = spark_checkpoint.parent / TOPIC_IDS_FILE
    ids_now = topic_ids(config, topics)
    start = committed_offsets(spark_checkpoint)
    if not start:
        _save_topic_ids(ids_file, ids_now)
        return []
    ids_before = _load_topic_ids(ids_file)
    recreated = frozenset(t for t, i in ids_now.items() if ids_before.get(t) not in (None, i))
    low = {t: {str(p): lo for p, (lo, _) in parts.items()} for t, parts in marks.items()}
    high = {t: {str(p): hi for p, (_, hi) in parts.items()} for t, parts in marks.items()}
    lost = lost_offsets(
        {t: parts for t, parts in start.items() if t in topics}, low, high, skipping=not fail, recreated=recreated
    )
    if not lost:
        _save_topic_ids(ids_file, ids_now)
        return []
    if fail:
        raise KafkaSourceError(
            "records the pipeline has not read are no longer in Kafka: "
            + "; ".join(lost)
            + ". Nothing was written for them. To skip what was lost and go on, set "
            "kafka.fail_on_data_loss: false in the spec and run again."
        )
    print("riverhouse: skipping records lost in Kafka (fail_on_data_loss is false): " + "; ".join(lost),
          file=sys.stderr, flush=True)  # fmt: skip
    _save_topic_ids(ids_file, ids_now)  # the skip is decided: from here on the new topic is the one read
    return lost


def topic_ids(config: dict[str, Any], topics: list[str]) -> dict[str, str]:
    """Kafka's id of each existing topic. Offsets cannot tell a recreated topic that has grown past
    the checkpoint's offsets from the old one; its id can (Kafka gives every topic a new UUID)."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(config)
    out: dict[str, str] = {}
    for name, future in admin.describe_topics(TopicCollection(topics), request_timeout=METADATA_TIMEOUT_S).items():
        try:
            out[name] = str(future.result().topic_id)
        except KafkaException:
            continue  # a missing topic: the watermarks already said what there is
    return out


def _load_topic_ids(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # a checkpoint from before the ids were kept: offsets are all there is to compare
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _save_topic_ids(path: Path, ids: dict[str, str]) -> None:
    if ids and ids != _load_topic_ids(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(ids, sort_keys=True))
        tmp.replace(path)
