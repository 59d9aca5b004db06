"""`kafka.config`: the Kafka client settings a spec may set, by name, with their types.

A spec's `kafka.config` was passed to librdkafka as it stood, and librdkafka settings can do
far more than tune a client: `plugin.library.paths` and `ssl.engine.location` load a shared
library into the process that evaluates the sensor (the code location serving every team),
`metadata.broker.list` replaces the bootstrap servers (the operator's RIVERHOUSE_KAFKA_BOOTSTRAP
included) and sends the spec's SASL credentials to the host it names (issue 27). So a spec
may set only the settings listed here, each with its type and range, and each reaches the
clients it is listed for: librdkafka (the lag sensor, the run's offset check, the generator,
the benchmarks) and/or the Java client of Spark's Kafka connector (as `kafka.<name>`).
Anything else is a validation error naming the setting.

Security is stated in `kafka.security`, once for both clients; the one credential setting
here (`ssl.key.password`, for an encrypted client key) takes its value only from the
environment (`${env:NAME}`, envrefs.py). No setting here holds a host, a URL or a file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

LIBRDKAFKA = "librdkafka"
JAVA = "java"
BOTH = (LIBRDKAFKA, JAVA)


@dataclass(frozen=True)
class ClientSetting:
    kind: str  # "int", "bool", "str" (a plain token), "enum", "secret" (only as ${env:NAME})
    clients: tuple[str, ...]
    low: int = 0
    high: int = 2**31 - 1
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "int":
            return f"an integer from {self.low} to {self.high}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "enum":
            return "one of " + ", ".join(self.choices)
        if self.kind == "secret":
            return "an environment reference like ${env:RIVERHOUSE_SECRET_<PIPELINE>__KEY_PASSWORD}"
        return "letters, digits, '.', '_' or '-' (at most 100)"


def _int(low: int, high: int, clients: tuple[str, ...] = BOTH) -> ClientSetting:
    return ClientSetting("int", clients, low, high)


HOUR_MS, DAY_MS = 3_600_000, 86_400_000
ALLOWED: dict[str, ClientSetting] = {
    # Both clients, one name.
    "client.id": ClientSetting("str", BOTH),
    "client.rack": ClientSetting("str", BOTH),
    "metadata.max.age.ms": _int(1_000, DAY_MS),
    "reconnect.backoff.ms": _int(0, HOUR_MS),
    "reconnect.backoff.max.ms": _int(0, HOUR_MS),
    "retry.backoff.ms": _int(1, 300_000),
    "connections.max.idle.ms": _int(0, DAY_MS),
    "socket.connection.setup.timeout.ms": _int(1_000, 300_000),
    # Ranges: the narrower of the two clients' (librdkafka's CONFIGURATION.md, the Java client's ConfigDef).
    "fetch.min.bytes": _int(1, 100_000_000),
    "fetch.max.bytes": _int(1, 2_147_483_135),
    "max.partition.fetch.bytes": _int(1, 1_000_000_000),
    "ssl.key.password": ClientSetting("secret", BOTH),
    # librdkafka only (the Java client names these differently, or has no such setting).
    "socket.timeout.ms": _int(10, 300_000, (LIBRDKAFKA,)),
    "socket.keepalive.enable": ClientSetting("bool", (LIBRDKAFKA,)),
    "socket.receive.buffer.bytes": _int(0, 100_000_000, (LIBRDKAFKA,)),
    "socket.send.buffer.bytes": _int(0, 100_000_000, (LIBRDKAFKA,)),
    "topic.metadata.refresh.interval.ms": _int(-1, HOUR_MS, (LIBRDKAFKA,)),
    "fetch.wait.max.ms": _int(0, 300_000, (LIBRDKAFKA,)),
    "message.max.bytes": _int(1_000, 1_000_000_000, (LIBRDKAFKA,)),
    "linger.ms": _int(0, 900_000, (LIBRDKAFKA,)),
    "batch.size": _int(1, 2**31 - 1, (LIBRDKAFKA,)),
    "batch.num.messages": _int(1, 1_000_000, (LIBRDKAFKA,)),
    "compression.type": ClientSetting("enum", (LIBRDKAFKA,), choices=("none", "gzip", "snappy", "lz4", "zstd")),
    "queue.buffering.max.messages": _int(1, 2**31 - 1, (LIBRDKAFKA,)),
    "queue.buffering.max.kbytes": _int(1, 2**31 - 1, (LIBRDKAFKA,)),
    # The Java client of Spark's connector only.
    "receive.buffer.bytes": _int(-1, 100_000_000, (JAVA,)),
    "send.buffer.bytes": _int(-1, 100_000_000, (JAVA,)),
    "fetch.max.wait.ms": _int(0, 300_000, (JAVA,)),
    "max.poll.records": _int(1, 1_000_000, (JAVA,)),
    "client.dns.lookup": ClientSetting(
        "enum", (JAVA,), choices=("use_all_dns_ips", "resolve_canonical_bootstrap_servers_only")
    ),
}
# Settings Riverhouse owns: correctness (deterministic replay from Spark's checkpoint) depends on them.
RESERVED = {"bootstrap.servers", "group.id", "enable.auto.commit", "auto.offset.reset", "enable.partition.eof"}
PLAIN_TOKEN_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")
PLAIN_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._]{0,79}")
ENV_REF_ONLY_RE = re.compile(r"\$\{env:[A-Za-z_][A-Za-z0-9_]*\}")
URL_HINTS = ("url", "uri", "endpoint", "server", "broker", "host", "proxy")
CREDENTIAL_HINTS = ("password", "secret", "token", "key", "credential", "jaas", "sasl.", "ssl.", "security.")


def config_problems(config: dict[Any, Any]) -> list[tuple[str, str]]:
    """(setting, why it may not be there) for each setting of `kafka.config` that may not; never repeats a
    secret value. The setting is "" when its name is not a plain name (the message shows it)."""
    problems: list[tuple[str, str]] = []
    for key, value in config.items():
        plain = isinstance(key, str) and PLAIN_NAME_RE.fullmatch(key) is not None
        place, shown = (key, "") if plain else ("", f"{str(key)[:80]!r}: ")
        if key in RESERVED:
            problems.append(
                (place, "managed by Riverhouse (offsets live in Spark's checkpoint); set kafka.bootstrap_servers")
            )
        elif key not in ALLOWED:
            security = isinstance(key, str) and any(h in key.lower() for h in CREDENTIAL_HINTS)
            why = SECURITY_HERE if security else UNKNOWN_SETTING
            if isinstance(value, str) and "${" in value and any(h in str(key).lower() for h in URL_HINTS):
                why = "${env:...} is never allowed in a setting that names a host or a URL; and " + why
            problems.append((place, shown + why))
        elif problem := _value_problem(ALLOWED[key], value):
            problems.append((place, problem))
    fetch_max, message_max = config.get("fetch.max.bytes"), config.get("message.max.bytes", 1_000_000)
    if isinstance(fetch_max, int) and isinstance(message_max, int) and fetch_max < message_max:
        problems.append(
            ("fetch.max.bytes", f"{fetch_max} is less than message.max.bytes ({message_max}); librdkafka refuses that")
        )
    return problems


SECURITY_HERE = (
    "security is not set in kafka.config: state it once in kafka.security (protocol, mechanism, username, "
    "password as ${env:RIVERHOUSE_SECRET_<PIPELINE>__KAFKA_PASSWORD}, ca, certificate, key), which both Kafka "
    "clients get"
)
UNKNOWN_SETTING = (
    "not a client setting kafka.config passes on (the allowed ones and their types: "
    "docs/pipeline-spec.md#kafka-client-settings)"
)


def _value_problem(setting: ClientSetting, value: Any) -> str | None:
    if setting.kind == "secret":
        if isinstance(value, str) and ENV_REF_ONLY_RE.fullmatch(value):
            return None
        return (
            "a secret: give an environment reference like ${env:RIVERHOUSE_SECRET_<PIPELINE>__KEY_PASSWORD}, "
            "never the secret itself (specs are kept in git)"
        )
    if isinstance(value, str) and "${" in value:
        return "${env:...} is allowed only in secret settings (ssl.key.password, kafka.security.password)"
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool) and setting.low <= value <= setting.high,
        "bool": isinstance(value, bool),
        "str": isinstance(value, str) and PLAIN_TOKEN_RE.fullmatch(value) is not None,
        "enum": value in setting.choices,
    }[setting.kind]
    return None if ok else f"should be {setting.describe()}, got {str(value)[:40]!r}"


def for_client(config: dict[str, Any], client: str) -> dict[str, Any]:
    """The settings of `config` that reach `client` (LIBRDKAFKA or JAVA)."""
    return {k: v for k, v in config.items() if k in ALLOWED and client in ALLOWED[k].clients}


def is_secret(key: str) -> bool:
    setting = ALLOWED.get(key)
    return setting is not None and setting.kind == "secret"


def java_value(value: Any) -> str:
    """A setting's value as the Java client's text (booleans lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
