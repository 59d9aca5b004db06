"""Throwaway TLS material and SCRAM credentials for the local broker's secure listeners.

Made once per state folder (`<home>/kafka/secure/`, files mode 0600): a CA, the broker's
certificate for 127.0.0.1/localhost, a client certificate for the mTLS listener, and the
SCRAM-SHA-512 user's password. PEM throughout: the broker (Kafka's PEM key stores), the
Java client Spark uses and librdkafka all read it as is.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
from pathlib import Path

CA = "ca.pem"
SERVER_STORE = "server.pem"  # the broker's key + certificate chain (a PEM key store)
CLIENT_CERT = "client.pem"
CLIENT_KEY = "client.key"
CREDENTIALS = "credentials.json"
USERNAME = "riverhouse"


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def make_certificate(
    common_name: str, issuer: tuple[object, object] | None = None, server: bool = False, ca: bool = False
) -> tuple[object, object]:
    """(private key, certificate): self-signed when `issuer` is None, else signed by (key, cert)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    issuer_key, issuer_cert = issuer if issuer else (key, None)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_cert.subject if issuer_cert is not None else name)  # type: ignore[attr-defined]
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=825))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return key, builder.sign(issuer_key, hashes.SHA256())  # type: ignore[arg-type]


def pem(key: object | None = None, *certs: object) -> bytes:
    from cryptography.hazmat.primitives import serialization

    out = b""
    if key is not None:
        out += key.private_bytes(  # type: ignore[attr-defined]
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    for cert in certs:
        out += cert.public_bytes(serialization.Encoding.PEM)  # type: ignore[attr-defined]
    return out


def ensure_tls_material(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    if not (folder / CA).exists():
        ca_key, ca_cert = make_certificate("riverhouse local Kafka CA", ca=True)
        server_key, server_cert = make_certificate("localhost", (ca_key, ca_cert), server=True)
        client_key, client_cert = make_certificate("riverhouse-client", (ca_key, ca_cert))
        _write_private(folder / SERVER_STORE, pem(server_key, server_cert, ca_cert))
        _write_private(folder / CLIENT_KEY, pem(client_key))
        (folder / CLIENT_CERT).write_bytes(pem(None, client_cert))
        (folder / CA).write_bytes(pem(None, ca_cert))
    if not (folder / CREDENTIALS).exists():
        _write_private(
            folder / CREDENTIALS, json.dumps({"username": USERNAME, "password": secrets.token_urlsafe(24)}).encode()
        )


def credentials(folder: Path) -> dict[str, str]:
    return dict(json.loads((folder / CREDENTIALS).read_text()))


def broker_tls(folder: Path) -> dict[str, str]:
    """server.properties entries of the SASL_SSL (SCRAM-SHA-512) and SSL (mTLS) listeners."""
    props: dict[str, str] = {"sasl.enabled.mechanisms": "SCRAM-SHA-512"}
    for listener in ("sasl_ssl", "ssl"):
        prefix = f"listener.name.{listener}."
        props.update(
            {
                prefix + "ssl.keystore.type": "PEM",
                prefix + "ssl.keystore.location": str(folder / SERVER_STORE),
                prefix + "ssl.truststore.type": "PEM",
                prefix + "ssl.truststore.location": str(folder / CA),
            }
        )
    props["listener.name.ssl.ssl.client.auth"] = "required"
    props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"] = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    )
    return props


def client_files(folder: Path) -> dict[str, str]:
    """Paths a client needs: the CA, and the client certificate and key for mTLS."""
    return {"ca": str(folder / CA), "certificate": str(folder / CLIENT_CERT), "key": str(folder / CLIENT_KEY)}
