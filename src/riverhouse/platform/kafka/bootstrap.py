"""Which Kafka a pipeline reads: the operator's override, the spec's servers, or the running local broker."""

from __future__ import annotations

from riverhouse.platform.errors import PipelineError
from riverhouse.platform.kafka import local_kafka
from riverhouse.platform.spec import PipelineSpec
from riverhouse.platform.state.settings import Settings


def resolve_bootstrap(spec: PipelineSpec, settings: Settings) -> str:
    """Bootstrap servers: the settings override, the spec's, or the running local Kafka."""
    bootstrap = settings.kafka_bootstrap or spec.kafka.bootstrap_servers
    if bootstrap != "local":
        return bootstrap
    state = local_kafka.status(settings.kafka_state_dir)
    if state is None:
        raise PipelineError(
            f"pipeline {spec.name!r} reads the local Kafka, which is not running "
            f"(state dir {settings.kafka_state_dir}). Start it with `riverhouse kafka start`, "
            "or set kafka.bootstrap_servers in the spec / RIVERHOUSE_KAFKA_BOOTSTRAP."
        )
    return state.bootstrap
