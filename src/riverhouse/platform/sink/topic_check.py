"""A Kafka sink's check: the rows a `read_committed` consumer sees per Delta version = the version's rows.

After a sink pass, the topic is read from where the pass began (each partition's end offset
before it) to its end, and the records are counted by their `riverhouse.version` header. The
Delta side is counted apart from the sink's own code path: the files each commit added, their
row counts from the Parquet footers (join pipelines: their rows with `_status = emitted`). A
version the pass began in the middle of (a crashed run had committed part of it) expects the
rest. A record of a version the pass did not produce is a duplicate.
"""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from riverhouse.platform.kafka.tail import count_by_header, read_committed
from riverhouse.platform.sink.clickhouse import sink_table_path
from riverhouse.platform.sink.topic import VERSION_HEADER, ProduceResult, TopicSink
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.delta_log import DeltaLog
from riverhouse.platform.state.settings import Settings


def delta_rows(delta: DeltaLog, version: int, emitted_only: bool) -> int:
    """Rows Delta version `version` added (join pipelines: emitted rows)."""
    total = 0
    for added in delta.added_files(delta.commit(version)):
        with delta.fs.open_input_file(added.path) as handle:
            parquet = pq.ParquetFile(handle)
            if not emitted_only:
                total += parquet.metadata.num_rows
                continue
            status = parquet.read(columns=["_status"]).column("_status")
            total += pc.sum(pc.equal(status, "emitted")).as_py() or 0
    return total


def topic_matches_delta(spec: PipelineSpec, settings: Settings, produced: ProduceResult) -> tuple[bool, dict[str, Any]]:
    """(passed, metadata): per version of the pass, rows in the topic vs rows in Delta."""
    sink = next(s for s in spec.topic_sinks if s.topic == produced.topic)
    if (
        produced.first_version is None
        or produced.last_version is None
        or produced.last_version < produced.first_version
    ):
        return True, {"versions_checked": 0, "rows_in_topic": 0, "mismatches": []}
    config = TopicSink(spec, sink, settings).config
    counts = count_by_header(read_committed(config, sink.topic, produced.start_offsets), VERSION_HEADER)
    in_topic = sum(counts.values())
    delta = DeltaLog(sink_table_path(spec, settings.warehouse))
    emitted_only = spec.is_join
    mismatches = []
    expected_total = 0
    versions = range(produced.first_version, produced.last_version + 1)
    for version in versions:
        expected = delta_rows(delta, version, emitted_only)
        if version == produced.first_version:
            expected -= produced.rows_before
        expected_total += expected
        found = counts.pop(str(version), 0)
        if found != expected:
            mismatches.append({"version": version, "rows_in_delta": expected, "rows_in_topic": found})
    for other, found in sorted(counts.items()):  # records of versions this pass did not produce
        mismatches.append({"version": other or "(no header)", "rows_in_delta": 0, "rows_in_topic": found})
    metadata = {
        "versions_checked": len(versions),
        "first_version": produced.first_version,
        "last_version": produced.last_version,
        "rows_expected": expected_total,
        "rows_in_topic": in_topic,
        "mismatches": mismatches[:20],
    }
    return not mismatches, metadata
