"""Consumer lag: how far a pipeline's committed offsets trail the end of its Kafka topics.

The committed position is what Spark's checkpoint records for the last batch it
committed (`offsets/<n>` of the highest `commits/<n>`): the same offsets a
restart resumes from, so lag here is exactly the work the next run will do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from riverhouse.platform.kafka_source import _client_config, source_options, watermarks
from riverhouse.platform.pipeline import checkpoint_dir, resolve_bootstrap
from riverhouse.platform.settings import Settings
from riverhouse.platform.spec import PipelineSpec

Offsets = dict[str, dict[str, int]]


def committed_offsets(spark_checkpoint: Path) -> Offsets | None:
    """The source offsets of the last committed batch, or None before the first batch."""
    commits = spark_checkpoint / "commits"
    if not commits.is_dir():
        return None
    done = sorted((int(p.name) for p in commits.iterdir() if p.name.isdigit()), reverse=True)
    for batch in done:
        offsets_file = spark_checkpoint / "offsets" / str(batch)
        try:
            lines = offsets_file.read_text().splitlines()
        except OSError:
            continue
        # v1, then the batch metadata, then one line per source.
        if len(lines) >= 3 and lines[2].strip().startswith("{"):
            return {t: {str(p): int(o) for p, o in parts.items()} for t, parts in json.loads(lines[2]).items()}
    return None


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


def pipeline_lag(spec: PipelineSpec, settings: Settings, sources: list[str] | None = None) -> PipelineLag:
    """End offsets vs committed offsets for every source, or the given ones (raises if Kafka is unreachable)."""
    bootstrap = resolve_bootstrap(spec, settings)
    out = PipelineLag(spec.name)
    for name in sources or list(spec.sources):
        src = spec.sources[name]
        options = source_options(
            bootstrap, [src.topic], spec.kafka.config, spec.kafka.starting_offsets, spec.kafka.max_offsets_per_trigger
        )
        marks = watermarks(_client_config(options), [src.topic]).get(src.topic, {})
        committed = (committed_offsets(checkpoint_dir(settings, spec.name, name) / "spark") or {}).get(src.topic, {})
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
