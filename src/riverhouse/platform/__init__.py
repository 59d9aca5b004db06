"""The Riverhouse engine: no Dagster imports in this package.

Spec model, Spark session, Kafka source, dedup batch logic, Delta staging and
the ClickHouse loader live here; Dagster assets and the CLI are thin layers on top.
"""
