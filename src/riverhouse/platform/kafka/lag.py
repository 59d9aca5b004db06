"""Consumer lag: how far a pipeline's committed offsets trail the end of its Kafka topics.

The committed position is what Spark's checkpoint records for the last batch it
committed (`offsets/<n>` of the highest `commits/<n>`): the same offsets a
restart resumes from, so lag here is exactly the work the next run will do.

A pipeline with a resident query (`orchestration.resident_query`) reads Kafka between runs, so
its position is the last batch a run reported (`published.json`, ingest/resident.py): records
the query already wrote still count until a run has checked and loaded them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from riverhouse.platform.kafka.bootstrap import resolve_bootstrap
from riverhouse.platform.kafka.client import committed_offsets, librdkafka_config, watermarks
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.checkpoints import checkpoint_dir, read_published
from riverhouse.platform.state.settings import Settings

Offsets = dict[str, dict[str, int]]


@dataclass
class SourceLag:
    source: str
    topic: str
    end: dict[str, int]
    committed: dict[str, int]
    lag: int


@dataclass
class PipelineLag:
    pipeline: str
    sources: list[SourceLag] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(s.lag for s in self.sources)

    @property
    def end_offsets(self) -> dict[str, dict[str, int]]:
        return {s.topic: s.end for s in self.sources}

    def summary(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "lag": self.total,
            "sources": {
                s.source: {"topic": s.topic, "lag": s.lag, "end": s.end, "committed": s.committed} for s in self.sources
            },
        }


def pipeline_lag(
    spec: PipelineSpec, settings: Settings, sources: list[str] | None = None, closed_is_final: bool = False
) -> PipelineLag:
    """End offsets vs committed offsets for every source, or the given ones (raises if Kafka is unreachable).

    `closed_is_final`: a broker whose port refuses connections is unreachable after ~2 s, not
    after the whole metadata timeout (`kafka.client.topic_metadata`)."""
    config = librdkafka_config(spec.kafka, resolve_bootstrap(spec, settings))  # one for every source
    out = PipelineLag(spec.name)
    for name in sources or list(spec.sources):
        src = spec.sources[name]
        marks = watermarks(config, [src.topic], closed_is_final).get(src.topic, {})
        checkpoint = checkpoint_dir(settings, spec.name, name)
        published = read_published(checkpoint) if spec.orchestration.resident_query else None
        reached = published.get("offsets") if published else committed_offsets(checkpoint / "spark")
        committed = (reached or {}).get(src.topic, {})
        end = {str(p): hi for p, (_, hi) in marks.items()}
        lag = 0
        for p, (lo, hi) in marks.items():
            position = committed.get(str(p))
            if position is None:
                # Never read: earliest starts at the low watermark, latest at the end.
                position = lo if spec.kafka.starting_offsets == "earliest" else hi
            lag += max(0, hi - max(position, lo))
        out.sources.append(SourceLag(name, src.topic, end, committed, lag))
    return out
