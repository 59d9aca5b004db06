"""Sink: the ClickHouse loader (DDL, deterministic chunks and tokens, the ledger)."""
