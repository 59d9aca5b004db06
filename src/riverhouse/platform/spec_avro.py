"""A source's Avro settings: `format: avro` with `schema_registry:` and/or `avro_schema:`.

Part of the spec model (spec.SourceSpec uses it); its own module for size.

- `schema_registry: {url, subject, auth}`: records are in the Confluent wire format (a zero byte,
  the 4-byte schema id, the Avro body); each is decoded with the schema its id names in the
  registry. The reader schema (the columns) is `avro_schema` when given, else the subject's
  latest version when the spec is loaded.
- `avro_schema` alone: records are plain Avro bodies, all written with that schema.
  `avro_schema_file: orders.avsc` reads it from a file (relative to the spec's folder).
- `fields` may be left out: every leaf of the reader schema becomes a field (nested records as
  dotted paths); `riverhouse validate` prints them.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import field_validator, model_validator

from riverhouse.platform.envrefs import env_ref_problems, resolve_env_refs
from riverhouse.platform.spec_base import StrictModel

ENV_REF_ONLY_RE = re.compile(r"^\$\{env:[A-Za-z_][A-Za-z0-9_]*\}$")


class RegistryAuth(StrictModel):
    """HTTP basic credentials; the password only as `${env:NAME}` (like Kafka's)."""

    username: str
    password: str

    @model_validator(mode="after")
    def _secret_is_a_reference(self) -> RegistryAuth:
        if not ENV_REF_ONLY_RE.fullmatch(self.password):
            raise ValueError(
                "password must be an environment reference like "
                "${env:RIVERHOUSE_SECRET_<PIPELINE>__REGISTRY_PASSWORD}, not the secret"
            )
        for value in (self.username, self.password):
            if problems := env_ref_problems(value):
                raise ValueError("; ".join(problems))
        return self


class SchemaRegistrySpec(StrictModel):
    # The Confluent-compatible API's base: http://host:8081 (Confluent), .../apis/ccompat/v7 (Apicurio).
    url: str
    subject: str | None = None  # default: <topic>-value (the topic name strategy)
    auth: RegistryAuth | None = None

    @field_validator("url")
    @classmethod
    def _plain_http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value[:80]!r} is not an http(s) URL of a schema registry")
        if parts.username or parts.password or "${" in value:
            raise ValueError("the registry URL may not hold credentials: use schema_registry.auth")
        if parts.query or parts.fragment:
            raise ValueError("the registry URL is the API's base: no ?query or #fragment")
        return value.rstrip("/")

    def client(self, cache: dict[int, str] | None = None) -> Any:
        """A registry client with the credentials resolved (never log it)."""
        from riverhouse.platform.avro.registry import Registry

        username = password = None
        if self.auth is not None:
            username = resolve_env_refs(self.auth.username, "schema_registry.auth.username")
            password = resolve_env_refs(self.auth.password, "schema_registry.auth.password")
        return Registry(self.url, username, password, dict(cache or {}))

    def subject_for(self, topic: str) -> str:
        """The subject a source's schemas are under: the spec's, or `<topic>-value` (the
        TopicNameStrategy of Confluent's serializers)."""
        return self.subject or f"{topic}-value"

    def references(self) -> list[tuple[str, str]]:
        if self.auth is None:
            return []
        return [
            ("schema_registry.auth.username", self.auth.username),
            ("schema_registry.auth.password", self.auth.password),
        ]


def registry_reader_schemas(data: Any) -> Any:
    """A pipeline's raw settings with each registry source's reader schema (`avro_schema`) fetched:
    the subject's latest version, when the spec gives none.

    Here, where the pipeline's name is known, and not per source: the registry's credentials are
    sent only when they are this pipeline's own (`envrefs.scope_problems`), so a spec cannot make
    `riverhouse validate` send another pipeline's secret to a URL of its choosing.
    """
    sources = data.get("sources") if isinstance(data, dict) else None
    if not isinstance(sources, dict):
        return data
    name = data.get("name") if isinstance(data.get("name"), str) else ""
    fetched = {}
    for key, src in sources.items():
        wanted = isinstance(src, dict) and src.get("format") == "avro" and isinstance(src.get("schema_registry"), dict)
        if wanted and src.get("avro_schema") is None and src.get("avro_schema_file") is None:
            fetched[key] = {**src, "avro_schema": _latest_schema(str(key), src, name)}
    return {**data, "sources": {**sources, **fetched}} if fetched else data


def _latest_schema(key: str, src: dict[str, Any], pipeline: str) -> str:
    from pydantic import ValidationError

    from riverhouse.platform.avro.registry import RegistryError
    from riverhouse.platform.envrefs import scope_problems

    try:
        registry = SchemaRegistrySpec.model_validate(src["schema_registry"])
    except ValidationError as exc:
        raise ValueError(f"sources.{key}.schema_registry: {exc.errors()[0]['msg']}") from None
    for where, value in registry.references():
        if problems := scope_problems(value, pipeline):
            raise ValueError(f"sources.{key}.{where}: {'; '.join(problems)}")
    try:
        return str(registry.client().latest(registry.subject_for(str(src.get("topic"))))[1])
    except RegistryError as exc:
        raise ValueError(f"sources.{key}: {exc}") from None


def avro_source(data: Any) -> Any:
    """A source's raw settings with `avro_schema` as JSON text (the reader schema: the spec's, its
    file's, or the registry's latest, fetched by `registry_reader_schemas`) and `fields` derived
    from it when left out."""
    if not isinstance(data, dict) or data.get("format") != "avro":
        return data
    from riverhouse.platform.avro.schema import AvroSchemaError, fields_of, parse

    data = dict(data)
    if (path := data.pop("avro_schema_file", None)) is not None:
        if data.get("avro_schema") is not None:
            raise ValueError("give avro_schema or avro_schema_file, not both")
        data["avro_schema"] = _schema_file(path)
    schema = data.get("avro_schema")
    if schema is None:  # a pipeline's registry sources got it from the registry (registry_reader_schemas)
        raise ValueError("format avro needs schema_registry (records in the Confluent wire format) or avro_schema")
    try:
        parsed = parse(schema)
    except AvroSchemaError as exc:
        raise ValueError(str(exc)) from None
    data["avro_schema"] = json.dumps(parsed, separators=(",", ":"))
    if "fields" not in data:
        try:
            data["fields"] = fields_of(parsed)
        except AvroSchemaError as exc:
            raise ValueError(f"{exc}; list the fields to read in `fields`") from None
    return data


MAX_SCHEMA_FILE_BYTES = 1_000_000


def _schema_file(path: Any) -> str:
    """An `.avsc` file's text (relative paths are the spec file's: spec.load_spec resolves them).

    Only `.avsc`: a spec is untrusted input, and a schema's parse error may quote the file.
    """
    from pathlib import Path

    from riverhouse.platform.spec_base import NotUtf8Error, read_utf8

    file = Path(str(path))
    if file.suffix != ".avsc":
        raise ValueError(f"avro_schema_file {str(path)[:120]!r} must be an Avro schema file (.avsc)")
    try:
        if file.stat().st_size > MAX_SCHEMA_FILE_BYTES:
            raise ValueError(f"avro_schema_file {file} is larger than {MAX_SCHEMA_FILE_BYTES:,} bytes")
        return read_utf8(file)
    except (OSError, NotUtf8Error) as exc:
        raise ValueError(f"cannot read avro_schema_file {file}: {getattr(exc, 'strerror', None) or exc}") from None


def check_fields_in_schema(fields: list[Any], schema_text: str) -> None:
    """Every spec field is a leaf of the reader schema, with the type the schema gives it."""
    from riverhouse.platform.avro.schema import fields_of

    found = {tuple((f.get("path") or f["name"]).split(".")): f["type"] for f in fields_of(json.loads(schema_text))}
    for field in fields:
        typ = found.get(field.segments)
        if typ is None:
            raise ValueError(f"field {field.label} is not in the Avro schema (its fields: {_listing(found)})")
        if typ != field.type:
            raise ValueError(f"field {field.label} is {typ} in the Avro schema, not {field.type}")


def _listing(found: dict[tuple[str, ...], str]) -> str:
    names = [".".join(path) for path in found]
    return ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
