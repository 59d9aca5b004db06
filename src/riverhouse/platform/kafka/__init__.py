"""Kafka: client settings and offsets, the local broker, its TLS material, lag and the event generator."""
