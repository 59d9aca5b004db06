"""Issue 31, item 2: the ClickHouse DSN's scheme decides the transport.

clickhouse-connect's DSN parser drops the scheme, so `https://user:pass@host/db` went out as plain
HTTP on 8123 with the password in clear. `client_args` reads scheme, port and query itself; the
transport tests below start a local socket and look at the first bytes the client sends.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from pathlib import Path

import pytest

from riverhouse.platform.sink.clickhouse import ClickHouseLoadError, check_dsn, client_args, open_client

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("dsn", "interface", "secure", "port"),
    [
        ("https://u:p@ch.example.com/db", "https", True, 8443),
        ("clickhouses://u:p@ch.example.com/db", "https", True, 8443),
        ("http://u:p@ch.example.com/db", "http", False, 8123),
        ("clickhouse://u:p@ch.example.com/db", "http", False, 8123),
        ("https://u:p@ch.example.com:443/db", "https", True, 443),
        ("https://u:p@ch.example.com:8123/db", "https", True, 8123),  # an explicit port is kept
        ("http://u:p@ch.example.com:8443/db", "http", False, 8443),  # and the scheme still decides TLS
        ("HTTPS://u:p@ch.example.com/db", "https", True, 8443),
    ],
)
def test_the_scheme_decides_interface_tls_and_default_port(dsn: str, interface: str, secure: bool, port: int) -> None:
    args = client_args(dsn)
    assert (args["interface"], args["secure"], args["host"], args["port"]) == (
        interface,
        secure,
        "ch.example.com",
        port,
    )
    assert (args["username"], args["password"], args["database"]) == ("u", "p", "db")


def test_credentials_database_and_options_are_read_as_written() -> None:
    args = client_args("https://al%40ice:pa%2Fss@ch.example.com:8443/my%20db?verify=false&compress=lz4&secure=true")
    assert args == {
        "interface": "https",
        "secure": True,
        "host": "ch.example.com",
        "port": 8443,
        "username": "al@ice",
        "password": "pa/ss",
        "database": "my db",
        "verify": "false",
        "compress": "lz4",
    }
    assert client_args("http://ch.example.com?database=analytics&interface=http&secure=0") == {
        "interface": "http",
        "secure": False,
        "host": "ch.example.com",
        "port": 8123,
        "username": None,
        "password": "",
        "database": "analytics",
    }


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        ("clickhouse://u:s3cret@ch.example.com:9000/db", "port 9000 is ClickHouse's native protocol"),
        ("http://u:s3cret@ch.example.com:9000/db", "port 9000 is ClickHouse's native protocol"),
        ("clickhouses://u:s3cret@ch.example.com:9440/db", "port 9440 is ClickHouse's native protocol over TLS"),
        ("https://u:s3cret@ch.example.com/db?secure=false", "?secure= contradicts the scheme https://"),
        ("http://u:s3cret@ch.example.com/db?secure=true", "?secure= contradicts the scheme http://"),
        ("http://u:s3cret@ch.example.com/db?secure=maybe", "?secure= contradicts the scheme http://"),
        ("http://u:s3cret@ch.example.com/db?interface=https", "?interface= contradicts the scheme http://"),
        ("https://u:s3cret@ch.example.com/db?interface=http", "?interface= contradicts the scheme https://"),
        ("https://ch.example.com/db?password=s3cret", "?password= is not taken"),
        ("https://u:s3cret@ch.example.com/db?port=8443", "?port= is not taken"),
        ("tcp://u:s3cret@ch.example.com/db", "unsupported ClickHouse DSN"),
        ("https://u:s3cret@ch.example.com/db?user=v", "names its user twice"),
    ],
)
def test_misleading_dsns_are_refused_by_name_without_the_password(dsn: str, said: str) -> None:
    with pytest.raises(ClickHouseLoadError) as info:
        check_dsn(dsn)
    assert said in str(info.value)
    assert "s3cret" not in str(info.value) and "ch.example.com" in str(info.value)
    if "native" in said:
        assert "8123" in str(info.value) and "8443" in str(info.value)


def test_a_user_given_only_as_a_query_value_is_left_to_the_driver() -> None:
    assert client_args("https://ch.example.com/db?user=alice")["user"] == "alice"  # clickhouse-connect reads it


def test_chdb_dsns_are_left_to_the_embedded_engine() -> None:
    check_dsn("chdb:///var/lib/riverhouse/clickhouse")  # no host, no port: still fine


# ------------------------------------------------------------------ the transport itself
@pytest.fixture(scope="module")
def server_tls(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    """A server TLS context with a throwaway self-signed certificate for 127.0.0.1."""
    from cryptography import x509  # a dependency of riverhouse (the local broker's certificates)
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_file, key_file = Path(folder, "cert.pem"), Path(folder, "key.pem")
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context


class OneConnection:
    """Listens on a port, takes one connection and records what the client did on it:
    `first` (the first bytes, unread by the handshake) and, for TLS, the HTTP request line it
    sent inside the encrypted channel. Then it hangs up: there is no ClickHouse behind it."""

    def __init__(self, context: ssl.SSLContext, port: int = 0) -> None:
        self.context = context
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.first = b""
        self.request_line = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(20)
        conn, _ = self.listener.accept()
        self.listener.close()  # a retry by the client is refused, not left waiting in the backlog
        with conn:
            conn.settimeout(10)
            self.first = conn.recv(5, socket.MSG_PEEK)
            if self.first[:1] == b"\x16":  # a TLS handshake record: finish it, read the request
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    self.request_line = tls.recv(4096).split(b"\r\n")[0]

    def close(self) -> None:
        self.thread.join(timeout=20)
        self.listener.close()


def _connect(dsn: str) -> None:
    dsn += ("&" if "?" in dsn else "?") + "send_receive_timeout=5"
    with pytest.raises(ClickHouseLoadError), open_client(dsn, attempts=1):
        pass


def test_an_https_dsn_speaks_tls_to_the_given_port(server_tls: ssl.SSLContext) -> None:
    server = OneConnection(server_tls)
    try:
        _connect(f"https://u:s3cret@127.0.0.1:{server.port}/db?verify=false")
    finally:
        server.close()
    assert server.first[:1] == b"\x16"  # a TLS ClientHello, not HTTP
    assert server.request_line.startswith((b"GET ", b"POST ")) and server.request_line.endswith(b"HTTP/1.1")


@pytest.mark.parametrize("scheme", ["http", "clickhouse"])
def test_an_http_dsn_to_the_same_kind_of_port_sends_plain_http(server_tls: ssl.SSLContext, scheme: str) -> None:
    server = OneConnection(server_tls)
    try:
        _connect(f"{scheme}://u:s3cret@127.0.0.1:{server.port}/db")
    finally:
        server.close()
    assert server.first[:4] in (b"GET ", b"POST")
    assert server.request_line == b""


def test_an_https_dsn_without_a_port_speaks_tls_on_8443(server_tls: ssl.SSLContext) -> None:
    try:
        server = OneConnection(server_tls, port=8443)
    except OSError:
        pytest.skip("port 8443 is taken on this machine")
    try:
        _connect("clickhouses://u:s3cret@127.0.0.1/db?verify=false")
    finally:
        server.close()
    assert server.first[:1] == b"\x16"
    assert server.request_line.startswith((b"GET ", b"POST "))
