"""Riverhouse: Kafka -> deduplicated Delta tables -> ClickHouse, exactly once."""

__version__ = "0.1.0"
