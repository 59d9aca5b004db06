"""A GlassFlow Kafka connection as a spec's `kafka:` section, its security in `kafka.security`.

`kafka.security` is the one statement both Kafka clients get (Spark's Java client reads
the topics, librdkafka the offsets); `kafka.config` takes only client tuning from an
allow-list, no security setting. So everything GlassFlow's connection says about
security goes into `kafka.security`, or is reported as not carried over.

`kafka.security` names PEM files. GlassFlow carries certificates as text (base64 in v2):
they are public, and are written beside the spec file; the client's private key is a
secret and is never copied: the spec names the path where the user puts it.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path
from typing import Any

from riverhouse.platform.importers import glassflow_models as gf
from riverhouse.platform.importers.glassflow_read import Pipeline
from riverhouse.platform.importers.report import ImportResult, secret_ref
from riverhouse.platform.kafka.client import JAAS_MODULES
from riverhouse.platform.spec import SASL_PROTOCOLS, TLS_PROTOCOLS

# Beside `<stem>.yaml`: `<stem>.kafka-ca.pem`, `<stem>.kafka-client.pem` (written), `<stem>.kafka-client.key` (not).
CA_SUFFIX = ".kafka-ca.pem"
CERTIFICATE_SUFFIX = ".kafka-client.pem"
KEY_SUFFIX = ".kafka-client.key"
KERBEROS_SETTINGS = ("kerberos_service_name", "kerberos_keytab", "kerberos_realm", "kerberos_config")


def kafka_block(p: Pipeline, result: ImportResult, output: Path | None, pipeline: str) -> dict[str, Any]:
    """The spec's `kafka:` section from the first source's connection (a spec has one)."""
    first = p.sources[0]
    conn = first.connection
    assert conn is not None
    for s in p.sources[1:]:
        if s.connection != conn:
            result.drop(f"{s.path}.connection_params", f"differs from {first.path}'s: a spec has one Kafka connection")
        if s.offset != first.offset:
            result.drop(f"{s.path}.consumer_group_initial_offset", f"a spec starts every source at {first.offset}")
    where = f"{first.path}.connection_params" if p.version == "v3" else "source.connection_params"
    brokers = []
    for b in conn.brokers:
        bare = re.sub(r"^[a-z]+://", "", b.strip())
        if bare != b.strip():
            result.note(f"{where}.brokers: {b} written as {bare} (Kafka bootstrap servers carry no scheme)")
        brokers.append(bare)
    security = security_block(conn, where, result, output, pipeline)
    refs = sorted({v[len("${env:") : -1] for v in security.values() if v.startswith("${env:")})
    if refs:
        result.note(f"credentials are not copied: export {', '.join(refs)} before running")
    return {
        "bootstrap_servers": ",".join(brokers),
        "starting_offsets": first.offset,
        **({"security": security} if security != {"protocol": "PLAINTEXT"} else {}),
    }


def security_block(
    conn: gf.KafkaConnection, where: str, result: ImportResult, output: Path | None, pipeline: str
) -> dict[str, str]:
    """`kafka.security` for the connection; what it cannot state is dropped with the reason."""
    protocol = conn.protocol.upper()
    if conn.sasl_tls_enable and protocol not in TLS_PROTOCOLS:
        # Older exports: GlassFlow's consumer turned TLS on when this was true, whatever the protocol said.
        upgraded = "SASL_SSL" if protocol == "SASL_PLAINTEXT" else "SSL"
        result.note(f"{where}.sasl_tls_enable: true: TLS is on, so protocol {protocol} is written as {upgraded}")
        protocol = upgraded
    mechanism = (conn.mechanism or "").upper()
    authenticates = bool(mechanism) and mechanism != "NO_AUTH" and not conn.skip_auth
    security: dict[str, str] = {}
    if protocol in SASL_PROTOCOLS:
        without_sasl = "SSL" if protocol == "SASL_SSL" else "PLAINTEXT"
        if not authenticates:
            result.note(
                f"{where}.protocol: {protocol} without a SASL mechanism authenticates nothing: written as {without_sasl}"
            )
            protocol = without_sasl
        elif mechanism not in JAAS_MODULES:
            result.drop(
                f"{where}.mechanism",
                f"{mechanism}: kafka.security states {', '.join(JAAS_MODULES)} (for Spark's connector and "
                f"librdkafka alike); kafka.config takes no SASL settings. "
                f"Written as {without_sasl}: the broker will refuse the run until the spec states a supported login",
            )
            for name in ("username", "password"):
                if getattr(conn, name) is not None:
                    result.drop(f"{where}.{name}", f"belongs to the {mechanism} login, which is not carried over")
            protocol = without_sasl
        else:
            security |= {
                "mechanism": mechanism,
                "username": secret_ref(pipeline, "KAFKA_USERNAME"),
                "password": secret_ref(pipeline, "KAFKA_PASSWORD"),
            }
    elif authenticates:
        result.drop(f"{where}.mechanism", f"{mechanism} without a SASL protocol ({protocol}) authenticates nothing")
    for name in KERBEROS_SETTINGS:
        if getattr(conn, name):
            # The value (a keytab path, a realm) is not repeated: the report is printed and kept in the spec.
            result.drop(f"{where}.{name}", "Kerberos (GSSAPI) cannot be stated in kafka.security")
    if conn.skip_tls_verification:
        result.drop(
            f"{where}.skip_tls_verification",
            "kafka.security always verifies the broker's certificate: trust its CA with kafka.security.ca",
        )
    security = {"protocol": protocol, **security}
    security |= tls_files(conn, protocol, where, result, output)
    return security


def tls_files(
    conn: gf.KafkaConnection, protocol: str, where: str, result: ImportResult, output: Path | None
) -> dict[str, str]:
    """`ca`, `certificate` and `key` of kafka.security: certificates written beside the spec, the key only named."""
    out: dict[str, str] = {}
    for field, name, value, suffix in (
        ("ca", "root_ca", conn.root_ca, CA_SUFFIX),
        ("certificate", "client_cert", conn.client_cert, CERTIFICATE_SUFFIX),
    ):
        if not value:
            continue
        setting = f"{where}.{name}"
        text = pem_text(value)
        if protocol not in TLS_PROTOCOLS:
            result.drop(setting, f"protocol {protocol} does not use TLS")
        elif text is None:
            result.drop(setting, "not a PEM certificate (nor base64 of one)")
        elif output is None:
            result.drop(
                setting,
                f"kafka.security.{field} names a PEM file, and the spec was printed, not written: "
                f"import with -o FILE to write the certificate beside it",
            )
        else:
            path = beside(output, suffix)
            result.files[str(path)] = text + "\n"
            out[field] = str(path)
    if "certificate" in out:
        # The Java client's key store needs the key with the certificate; it is a secret, so the user puts it there.
        assert output is not None  # a certificate is only carried over into a written spec
        key = beside(output, KEY_SUFFIX)
        out["key"] = str(key)
        result.note(
            f"{where}.client_key: the client's private key is a secret and is not copied: put the client key "
            f"(PKCS#8 PEM) at {key} before running, and keep it out of version control (a PKCS#1 "
            f"`BEGIN RSA PRIVATE KEY` converts with `openssl pkcs8 -topk8 -nocrypt -in <key> -out {key}`)"
        )
    elif conn.client_key:
        result.drop(f"{where}.client_key", "not copied (a secret), and its client certificate is not carried over")
    return out


def beside(output: Path, suffix: str) -> Path:
    """`<dir>/<stem><suffix>` next to the spec, absolute: the Kafka clients open kafka.security's files
    relative to the working directory of the run (CLI, Dagster code server), not to the spec file."""
    spec = output.resolve()
    return spec.with_name(spec.stem + suffix)


def pem_text(value: str) -> str | None:
    """A certificate as PEM text, decoding GlassFlow v2's base64 form; None when it is neither."""
    text = value.strip()
    if text.startswith("-----BEGIN"):
        return text
    try:
        decoded = base64.b64decode(text, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.strip() if decoded.lstrip().startswith("-----BEGIN") else None
