"""GlassFlow pipeline configs, v2 and v3, as strict pydantic models.

Written from GlassFlow's published reference (docs.glassflow.dev "Pipeline
Configuration Reference", V3 and the deprecated V2 section), its Python SDK's
models (glassflow 3.x for v2, 4.x for v3) and the server's own v2 reader
(glassflow-api `pipelineJSONv2`, which also accepts the older v2 layout with a
per-topic `schema` and `sink.table_mapping`).

Why not the SDK's models: glassflow 4.x dropped v2 (its v2->v3 migration calls a
running GlassFlow server), importing it writes ~/.glassflow/clickhouse.conf and
sets up usage tracking, and its models ignore unknown keys silently.

GlassFlow's own decoder (Go's encoding/json) ignores keys it does not know, and real
exports carry some (`join_key_type`, `sasl_tls_enable`, ...). These models keep unknown
keys (`extra="allow"`) so that the importer can name each one as not carried over
(glassflow_read.unknown_settings) instead of refusing the config or dropping it silently.
Keys of older exports that still mean something are modelled here and mapped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _lower(value: Any) -> Any:
    # GlassFlow's enums are case-insensitive ("PLAINTEXT", "Earliest").
    return value.lower() if isinstance(value, str) else value


Offset = Annotated[Literal["earliest", "latest"], BeforeValidator(_lower)]


class Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class KafkaConnection(Model):
    brokers: list[str] = Field(min_length=1)
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    root_ca: str | None = None
    skip_tls_verification: bool = False
    kerberos_service_name: str | None = None
    kerberos_keytab: str | None = None
    kerberos_realm: str | None = None
    kerberos_config: str | None = None
    # v2 only (glassflow-api's v2 reader)
    skip_auth: bool | None = None
    client_cert: str | None = None
    client_key: str | None = None
    # Older exports: TLS on a SASL connection (GlassFlow's consumer enabled TLS when true).
    sasl_tls_enable: bool | None = None


class SchemaRegistry(Model):
    url: str
    api_key: str | None = None
    api_secret: str | None = None


class SchemaField(Model):
    name: str
    type: str


class SourceSchema(Model):
    """v3 `schema`: JSON `fields` (the Enterprise reference's form of schema_fields), or an Avro/Protobuf `file`."""

    fields: list[SchemaField] | None = None
    file: str | None = None
    message_type: str | None = None
    parsed_fields: list[Any] | None = None  # read-only in GlassFlow's API: ignored on create


class SinkConnection(Model):
    host: str
    port: str | int | None = None
    http_port: str | int | None = None
    database: str | None = None
    username: str | None = None
    password: str | None = None
    secure: bool = False
    skip_certificate_verification: bool = False


class SinkMapping(Model):
    name: str
    column_name: str
    column_type: str


class StatelessOutput(Model):
    expression: str
    output_name: str
    output_type: str


class Metadata(Model):
    tags: list[str] | None = None


# ---------------------------------------------------------------------------- v3
class SourceV3(Model):
    type: str = "kafka"
    source_id: str
    connection_params: KafkaConnection | None = None
    topic: str | None = None
    consumer_group_initial_offset: Offset = "latest"
    schema_fields: list[SchemaField] | None = None
    schema_registry: SchemaRegistry | None = None
    schema_version: str | None = None
    # Enterprise Edition: Avro/Protobuf sources, and `schema.fields` for JSON
    format: str | None = None
    schema_: SourceSchema | None = Field(default=None, alias="schema")


class DedupConfig(Model):
    key: str
    time_window: str


class FilterConfig(Model):
    expression: str


class StatelessConfig(Model):
    transforms: list[StatelessOutput] = Field(min_length=1)


class DedupTransform(Model):
    type: Literal["dedup"]
    source_id: str
    config: DedupConfig


class FilterTransform(Model):
    type: Literal["filter"]
    source_id: str
    config: FilterConfig


class StatelessTransform(Model):
    type: Literal["stateless"]
    source_id: str
    config: StatelessConfig


Transform = Annotated[DedupTransform | FilterTransform | StatelessTransform, Field(discriminator="type")]


class JoinSideV3(Model):
    source_id: str
    key: str
    time_window: str


class JoinOutputField(Model):
    source_id: str
    name: str
    output_name: str | None = None


class JoinV3(Model):
    enabled: bool = False
    type: str | None = None
    left_source: JoinSideV3 | None = None
    right_source: JoinSideV3 | None = None
    output_fields: list[JoinOutputField] | None = None


class SinkV3(Model):
    type: str = "clickhouse"
    connection_params: SinkConnection
    table: str
    max_batch_size: int | None = None
    max_delay_time: str | None = None
    mapping: list[SinkMapping] = Field(min_length=1)


class PipelineV3(Model):
    version: str = "v3"
    pipeline_id: str
    name: str | None = None
    sources: list[SourceV3] = Field(min_length=1)
    transforms: list[Transform] | None = None
    join: JoinV3 | None = None
    sink: SinkV3
    metadata: Metadata | None = None
    resources: dict[str, Any] | None = None


# ---------------------------------------------------------------------------- v2
class DedupV2(Model):
    enabled: bool = False
    id_field: str | None = None
    key: str | None = None  # the newest v2 exports say key, older ones id_field
    id_field_type: str | None = None
    time_window: str | None = None


class TopicSchemaV2(Model):
    type: str = "json"
    fields: list[SchemaField] = Field(default_factory=list)


class TopicV2(Model):
    name: str
    id: str | None = None
    consumer_group_initial_offset: Offset = "latest"
    replicas: int | None = None
    deduplication: DedupV2 | None = None
    schema_: TopicSchemaV2 | None = Field(default=None, alias="schema")
    schema_fields: list[SchemaField] | None = None
    schema_registry: SchemaRegistry | None = None
    schema_version: str | None = None


class SourceV2(Model):
    type: str = "kafka"
    provider: str | None = None
    connection_params: KafkaConnection
    topics: list[TopicV2] = Field(min_length=1)


class JoinSourceV2(Model):
    source_id: str
    join_key: str | None = None
    key: str | None = None  # some exports say key (GlassFlow's v2 reader reads join_key only)
    join_key_type: str | None = None  # older exports: the key's type, which its field declares too
    time_window: str
    orientation: Annotated[Literal["left", "right"], BeforeValidator(_lower)]


class JoinRuleV2(Model):
    """v2 `join.fields[]`: a joined field and its output name (glassflow-api models.JoinRule)."""

    source_id: str
    source_name: str
    output_name: str | None = None


class JoinV2(Model):
    enabled: bool = False
    type: str | None = None
    id: str | None = None
    sources: list[JoinSourceV2] | None = None
    fields: list[JoinRuleV2] | None = None


class FilterV2(Model):
    enabled: bool = False
    expression: str | None = None


class StatelessConfigV2(Model):
    transform: list[StatelessOutput] | None = None


class StatelessV2(Model):
    enabled: bool = False
    id: str | None = None
    type: str | None = None
    source_id: str | None = None
    config: StatelessConfigV2 | None = None


class SchemaFieldV2(Model):
    source_id: str
    name: str
    type: str
    column_name: str | None = None
    column_type: str | None = None


class SchemaV2(Model):
    fields: list[SchemaFieldV2] = Field(default_factory=list)


class TableMappingV2(Model):
    source_id: str
    field_name: str
    column_name: str
    column_type: str


class SinkV2(Model):
    type: str = "clickhouse"
    provider: str | None = None
    connection_params: SinkConnection | None = None
    # Flat connection fields: the v2 layout the docs show.
    host: str | None = None
    port: str | int | None = None
    http_port: str | int | None = None
    database: str | None = None
    username: str | None = None
    password: str | None = None
    secure: bool = False
    skip_certificate_verification: bool = False
    table: str
    max_batch_size: int | None = None
    max_delay_time: str | None = None
    source_id: str | None = None
    mapping: list[SinkMapping] | None = None
    table_mapping: list[TableMappingV2] | None = None


class PipelineV2(Model):
    version: str | None = None  # "v2", "2.0.0", or none (the first v2 exports)
    pipeline_id: str
    name: str | None = None
    source: SourceV2
    join: JoinV2 | None = None
    filter: FilterV2 | None = None
    stateless_transformation: StatelessV2 | None = None
    sink: SinkV2
    schema_: SchemaV2 | None = Field(default=None, alias="schema")
    metadata: Metadata | None = None
    pipeline_resources: dict[str, Any] | None = None
    exported_at: str | None = None
    exported_by: str | None = None
