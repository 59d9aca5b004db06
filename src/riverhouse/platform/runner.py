"""Former home of the run functions, kept importable while callers move to `Pipeline`.

Everything here delegates to `riverhouse.platform.pipeline.Pipeline` (runs) and
`riverhouse.platform.sink.loader` (loads); new code calls those.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from riverhouse.platform.ingest.stream import BatchMetrics
from riverhouse.platform.pipeline import PUBLISH_POLL_S, Pipeline
from riverhouse.platform.sink.loader import SinkLoader, load_sink
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.settings import Settings

__all__ = ["PUBLISH_POLL_S", "SinkLoader", "load_sink", "run_continuous", "run_once"]


def run_once(
    spec: PipelineSpec,
    settings: Settings,
    load: bool = True,
    log: Callable[[str], None] = print,
    spark: Any = None,
    drain: bool = False,
) -> dict[str, Any]:
    """`Pipeline(spec, settings, spark, log).run(load, drain)`."""
    return Pipeline(spec, settings, spark=spark, log=log).run(load=load, drain=drain)


def run_continuous(
    spec: PipelineSpec,
    settings: Settings,
    stop: threading.Event,
    load: bool = True,
    log: Callable[[str], None] = print,
    spark: Any = None,
    observe: Callable[[BatchMetrics], None] | None = None,
) -> dict[str, Any]:
    """`Pipeline(spec, settings, spark, log).continuous(stop, load, observe)`."""
    return Pipeline(spec, settings, spark=spark, log=log).continuous(stop, load=load, observe=observe)
