"""KaflowSQL's global config.yaml, read beside a pipeline: its brokers and its Avro input.

KaflowSQL keeps the Kafka connection in one engine-wide file (`kafka.brokers`,
`kafka.schemaRegistry`, `kafka.useAvro`), not in the pipelines. Given to `riverhouse import
kaflowsql --config`, its brokers become the spec's `kafka.bootstrap_servers`, and with
`useAvro: true` every source reads Avro through its `schemaRegistry` (importers/avro_source.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from riverhouse.platform.importers.avro_source import avro_settings
from riverhouse.platform.importers.report import ImporterError, ImportResult
from riverhouse.platform.spec_base import NotUtf8Error, read_utf8


def read_engine_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(read_utf8(path))
    except OSError as exc:
        raise ImporterError(str(path), [("", f"cannot read file: {exc.strerror}", "check the path")]) from None
    except (NotUtf8Error, yaml.YAMLError) as exc:
        raise ImporterError(str(path), [("", f"not a YAML file: {exc}", "")]) from None
    if not isinstance(data, dict) or not isinstance(data.get("kafka"), dict):
        raise ImporterError(str(path), [("kafka", "KaflowSQL's config.yaml has a kafka: section", "")])
    return data["kafka"]


def apply_engine_config(spec: dict[str, Any], kafka: dict[str, Any], result: ImportResult) -> None:
    brokers = kafka.get("brokers")
    if isinstance(brokers, list) and brokers and all(isinstance(b, str) for b in brokers):
        spec["kafka"]["bootstrap_servers"] = ",".join(brokers)
        result.note("kafka.bootstrap_servers: config.yaml's kafka.brokers")
    url = kafka.get("schemaRegistry")
    # KaflowSQL's engine writes its output as Avro when useAvro is set (whatever output.format says).
    spec["sink"].pop("format", None)
    if kafka.get("useAvro") and isinstance(url, str) and url:
        spec["sink"] |= {"format": "avro", "schema_registry": {"url": url}}
        result.note(f"kafka.useAvro: the output's schema is registered at {url} under <topic>-value, as KaflowSQL does")
    if not kafka.get("useAvro"):
        return
    if not isinstance(url, str) or not url:
        result.drop(
            "config.yaml kafka.useAvro", "true without kafka.schemaRegistry: Riverhouse reads Avro through a registry"
        )
        return
    for name, source in spec["sources"].items():
        source |= avro_settings(spec["name"], url, source["fields"], f"sources.{name}", result)
    for key in sorted(set(kafka) - {"brokers", "schemaRegistry", "useAvro"}):
        result.drop(f"config.yaml kafka.{key}", "a setting of KaflowSQL's consumer: Spark's Kafka source has its own")
