"""Ingest: Kafka -> bronze / quarantine / silver, one Spark micro-batch at a time (parse, validate, dedup: anti-join + append)."""
