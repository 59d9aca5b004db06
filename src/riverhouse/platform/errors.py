"""The errors a pipeline run raises to its caller, at the bottom floor: every layer may import them."""

from __future__ import annotations


class PipelineError(RuntimeError):
    """A pipeline run failed; the message says what and where, for a person to act on."""


class StreamStopped(RuntimeError):
    """Raised into a batch that starts after a clean stop was requested."""


class EngineUnavailable(PipelineError):
    """The Spark engine a run is configured to use cannot be reached; the message says how to start it."""
