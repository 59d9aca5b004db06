"""Avro records: schemas, the schema registry, the local registry process."""
