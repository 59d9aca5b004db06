"""The spec's `kafka:` section: the servers, the one statement of security, and client settings.

Part of the spec model (riverhouse.platform.spec re-exports it); its own module for size.
Secrets are `${env:NAME}` references only (envrefs.py); which variables a pipeline may read
is checked by the whole spec, which knows the pipeline's name (`PipelineSpec`). `config` is
an allow-list (kafka/client_settings.py).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from riverhouse.platform.envrefs import env_ref_problems, resolve_env_refs
from riverhouse.platform.kafka.client_settings import config_problems
from riverhouse.platform.kafka.client_settings import is_secret as is_secret_setting

ENV_REF_ONLY_RE = re.compile(r"^\$\{env:[A-Za-z_][A-Za-z0-9_]*\}$")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")


class KafkaSecurity(BaseModel):
    """One portable statement of Kafka security, mapped to the Java client (Spark) and librdkafka.

    Files are PEM paths that must exist wherever a client runs (driver and executors).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)  # as every spec model (spec.StrictModel)

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    username: str | None = None
    # Only as `${env:NAME}`: a password written in a spec file would end up in git.
    password: str | None = None
    ca: str | None = None
    certificate: str | None = None
    key: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        if self.password is not None and not ENV_REF_ONLY_RE.fullmatch(self.password):
            raise ValueError(
                "password must be an environment reference like ${env:RIVERHOUSE_SECRET_<PIPELINE>__KAFKA_PASSWORD}, not the secret"
            )
        for value in (self.username, self.password):
            if problems := env_ref_problems(value):
                raise ValueError("; ".join(problems))
        sasl = self.protocol in SASL_PROTOCOLS
        if sasl and not (self.mechanism and self.username and self.password):
            raise ValueError(f"protocol {self.protocol} needs mechanism, username and password")
        if not sasl and (self.mechanism or self.username or self.password):
            raise ValueError(f"mechanism, username and password need a SASL protocol, not {self.protocol}")
        if (self.certificate is None) != (self.key is None):
            raise ValueError("a client certificate needs its key (certificate and key together)")
        if self.protocol not in TLS_PROTOCOLS and (self.ca or self.certificate):
            raise ValueError(f"ca, certificate and key need protocol SSL or SASL_SSL, not {self.protocol}")
        return self


# Consumer group names: plain characters only (they reach Kafka's tools and ACLs as written).
GROUP_ID_PATTERN = r"^[A-Za-z0-9._-]{1,200}$"


class KafkaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # as every spec model (spec.StrictModel)

    # "local" means: the local Kafka started by `riverhouse kafka start`.
    bootstrap_servers: str = "local"
    # Security, stated once for both clients (kafka/client.py maps it); `config` is client
    # tuning from an allow-list (kafka/client_settings.py), each setting for the clients it names.
    security: KafkaSecurity | None = None
    config: dict[str, str | int | float | bool] = Field(default_factory=dict)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    max_offsets_per_trigger: int = Field(default=500_000, gt=0, le=2**31 - 1)
    # Records Kafka lost before they were read (retention, a recreated topic) stop the run;
    # false skips them (the run says how many).
    fail_on_data_loss: bool = True
    # Kafka's tooling (kafka-consumer-groups, Burrow, Kafka UI) sees a pipeline's lag through a
    # consumer group: after each batch commits, its end offsets are committed to this group
    # (default riverhouse-<pipeline>), for monitoring only: Spark's checkpoint stays the truth.
    consumer_group: str | None = Field(default=None, pattern=GROUP_ID_PATTERN)
    commit_offsets: bool = True
    # The prefix of the consumer groups Spark's Kafka source uses (its `groupIdPrefix`), for
    # clusters whose ACLs allow only named groups.
    group_id_prefix: str | None = Field(default=None, pattern=GROUP_ID_PATTERN)

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        if "${" in value:
            raise ValueError(
                "bootstrap_servers cannot take ${env:...}: a secret must never become a host name (the operator "
                "sets RIVERHOUSE_KAFKA_BOOTSTRAP to override the servers)"
            )
        return value

    @field_validator("config")
    @classmethod
    def _config_allowed(cls, value: dict[str, Any]) -> dict[str, Any]:
        found = config_problems(value)
        for key, item in value.items():
            found += [(str(key)[:80], problem) for problem in env_ref_problems(item)]
        if found:  # one line per setting: the spec's errors show each at its own place
            raise ValueError("\n".join(f"kafka.config{'.' + key if key else ''}: {why}" for key, why in found))
        return value

    @model_validator(mode="after")
    def _key_password_needs_a_key(self) -> KafkaSpec:
        if "ssl.key.password" in self.config and (self.security is None or self.security.key is None):
            raise ValueError("kafka.config.ssl.key.password decrypts kafka.security.key: give the key there too")
        return self

    def monitoring_group(self, pipeline: str) -> str | None:
        """The consumer group a pipeline's offsets are committed to, or None when that is off."""
        return (self.consumer_group or f"riverhouse-{pipeline}") if self.commit_offsets else None

    def resolved_config(self) -> dict[str, Any]:
        """The settings with `${env:NAME}` references resolved (never log the result)."""
        return {k: resolve_env_refs(v, f"kafka.config.{k}") for k, v in self.config.items()}

    def redacted_config(self) -> dict[str, Any]:
        return {k: ("***" if is_secret_setting(k) else v) for k, v in self.config.items()}

    def references(self) -> list[tuple[str, str]]:
        """(where, value) of every setting that may hold an `${env:NAME}` reference."""
        out = [(f"kafka.config.{k}", v) for k, v in self.config.items() if isinstance(v, str)]
        if self.security is not None:
            out += [(f"kafka.security.{n}", getattr(self.security, n)) for n in ("username", "password")]
        return [(where, value) for where, value in out if value]
