"""Avro schemas -> spec fields, Avro's resolution rules, and the spec's Avro settings (no registry needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from riverhouse.platform.avro.schema import AvroSchemaError, fields_of, resolution_problem
from riverhouse.platform.spec import parse_spec
from riverhouse.platform.spec_base import SpecError

pytestmark = pytest.mark.unit


def record(*fields: dict, name: str = "R") -> dict:
    return {"type": "record", "name": name, "fields": list(fields)}


def test_fields_of_maps_types_logical_types_nested_records_and_optional_values() -> None:
    schema = record(
        {"name": "id", "type": "string"},
        {"name": "n", "type": ["null", "long"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "scores", "type": {"type": "map", "values": "double"}},
        {"name": "user", "type": record({"name": "id", "type": "int"}, name="User")},
    )
    assert fields_of(schema) == [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "at", "type": "timestamp"},
        {"name": "day", "type": "date"},
        {"name": "price", "type": "decimal(10,2)"},
        {"name": "uid", "type": "string"},
        {"name": "kind", "type": "string"},
        {"name": "tags", "type": "array<string>"},
        {"name": "scores", "type": "map<string,double>"},
        {"name": "user_id", "type": "int", "path": "user.id"},
    ]


@pytest.mark.parametrize(
    ("typ", "message"),
    [
        (["null", "int", "string"], "union of several types"),
        ("bytes", "Avro type bytes"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}, "precision 40"),
        ({"type": "fixed", "name": "F", "size": 4}, "Avro type fixed"),
    ],
)
def test_fields_of_names_a_field_it_cannot_hold(typ: object, message: str) -> None:
    with pytest.raises(AvroSchemaError, match=f"field 'x'.*{message}"):
        fields_of(record({"name": "x", "type": typ}))


V1 = record({"name": "id", "type": "string"}, {"name": "n", "type": "int"})


@pytest.mark.parametrize(
    ("writer", "reader", "problem"),
    [
        (V1, V1, None),
        # a field added with a default reads old records; one without a default does not
        (V1, record(*V1["fields"], {"name": "c", "type": ["null", "string"], "default": None}), None),
        (
            V1,
            record(*V1["fields"], {"name": "c", "type": "string"}),
            "field 'c' is in the reader's schema without a default",
        ),
        # a field the writer has and the reader lacks is skipped
        (record(*V1["fields"], {"name": "extra", "type": "double"}), V1, None),
        # promotions: int -> long/double; not the other way
        (V1, record(V1["fields"][0], {"name": "n", "type": "long"}), None),
        (
            record(V1["fields"][0], {"name": "n", "type": "long"}),
            V1,
            "field 'n' is long in the writer's schema and int in the reader's",
        ),
        (
            record(V1["fields"][0], {"name": "n", "type": "string"}),
            V1,
            "field 'n' is string in the writer's schema and int",
        ),
        # a renamed field found through the reader's alias
        (V1, record(V1["fields"][0], {"name": "count", "type": "int", "aliases": ["n"]}), None),
        # unions: an optional reader field reads a plain writer one; a writer's null cannot become an int
        (V1, record(V1["fields"][0], {"name": "n", "type": ["null", "int"]}), None),
        (
            record(V1["fields"][0], {"name": "n", "type": ["null", "int"]}),
            V1,
            "field 'n' is null in the writer's schema",
        ),
        # enums: a symbol the reader lacks, unless the reader has a default
        (
            record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}),
            record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}),
            "symbols the reader's lacks (B)",
        ),
        (
            record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}),
            record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"], "default": "A"}}),
            None,
        ),
        # nested records by path
        (
            record({"name": "u", "type": record({"name": "id", "type": "int"}, name="U")}),
            record({"name": "u", "type": record({"name": "id", "type": "string"}, name="U")}),
            "field 'u.id' is int",
        ),
    ],
)
def test_resolution_follows_avros_rules(writer: dict, reader: dict, problem: str | None) -> None:
    found = resolution_problem(writer, reader)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def spec_data(**source: object) -> dict:
    return {
        "name": "av",
        "sources": {"s": {"topic": "t", "format": "avro", "key": ["id"], **source}},
        "sink": {"table": "av", "order_by": ["id"]},
    }


def test_an_inline_schema_gives_the_fields_and_listed_fields_are_checked_against_it() -> None:
    spec = parse_spec(spec_data(avro_schema=V1))
    assert [(f.name, f.type) for f in spec.sources["s"].fields] == [("id", "string"), ("n", "int")]
    assert json.loads(spec.sources["s"].avro_schema) == V1
    only_id = parse_spec(spec_data(avro_schema=json.dumps(V1), fields={"id": "string"}))  # JSON text works too
    assert [f.name for f in only_id.sources["s"].fields] == ["id"]
    with pytest.raises(SpecError, match="field 'missing' is not in the Avro schema"):
        parse_spec(spec_data(avro_schema=V1, fields={"id": "string", "missing": "int"}))
    with pytest.raises(SpecError, match="field 'n' is int in the Avro schema, not long"):
        parse_spec(spec_data(avro_schema=V1, fields={"id": "string", "n": "long"}))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({}, "format avro needs schema_registry"),
        ({"avro_schema": {"type": "string"}}, "must be an Avro record"),
        (
            {"avro_schema": {"type": "record", "name": "R", "fields": [{"name": "x", "type": "nope"}]}},
            "not a valid Avro schema",
        ),
        ({"avro_schema": V1, "schema_registry": {"url": "ftp://h/x"}}, "not an http"),
        ({"avro_schema": V1, "schema_registry": {"url": "http://user:pw@h:8081"}}, "may not hold credentials"),
        (
            {
                "avro_schema": V1,
                "schema_registry": {"url": "http://h:8081", "auth": {"username": "u", "password": "plain"}},
            },
            "password must be an environment reference",
        ),
        (
            {
                "avro_schema": V1,
                "schema_registry": {
                    "url": "http://h:8081",
                    "auth": {"username": "u", "password": "${env:RIVERHOUSE_SECRET_OTHER__PW}"},
                },
            },
            "RIVERHOUSE_SECRET_OTHER__PW",
        ),
    ],
)
def test_bad_avro_settings_are_named(source: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(spec_data(**source))


def test_registry_settings_on_a_json_source_are_refused() -> None:
    data = spec_data(avro_schema=json.dumps(V1), fields={"id": "string"})
    data["sources"]["s"]["format"] = "json"
    with pytest.raises(SpecError, match="schema_registry and avro_schema apply to format: avro"):
        parse_spec(data)


def test_a_schema_file_beside_the_spec_gives_the_reader_schema(tmp_path: Any) -> None:
    from riverhouse.platform.spec import load_spec

    (tmp_path / "orders.avsc").write_text(json.dumps(V1))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_data(avro_schema_file="orders.avsc")))
    spec = load_spec(tmp_path / "spec.yaml")  # relative to the spec's folder, whatever the cwd
    assert [f.name for f in spec.sources["s"].fields] == ["id", "n"]
    (tmp_path / "secrets.json").write_text('{"password": "hunter2"}')
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec_data(avro_schema_file="secrets.json")))
    with pytest.raises(SpecError, match=r"must be an Avro schema file \(\.avsc\)") as refused:
        load_spec(tmp_path / "bad.yaml")
    assert "hunter2" not in str(refused.value)
    with pytest.raises(SpecError, match="not both"):
        parse_spec(spec_data(avro_schema=V1, avro_schema_file=str(tmp_path / "orders.avsc")))


def test_validate_prints_an_avro_sources_resolved_fields(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from riverhouse.cli import app

    (tmp_path / "orders.avsc").write_text(
        json.dumps(record(*V1["fields"], {"name": "u", "type": record({"name": "id", "type": "long"}, name="U")}))
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_data(avro_schema_file="orders.avsc")))
    shown = CliRunner().invoke(app, ["validate", str(spec)])
    assert shown.exit_code == 0, shown.output
    assert "s: Avro (avro_schema), fields id string, n int, u_id long" in shown.output
    report = json.loads(CliRunner().invoke(app, ["validate", "--json", str(spec)]).output)
    assert report["files"][0]["avro_fields"]["s"][2] == {"name": "u_id", "type": "long", "path": "u.id"}


def test_registry_credentials_are_sent_only_when_they_are_the_pipelines_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a spec fetches the reader schema from its registry: with another pipeline's secret
    in `auth`, nothing is sent (a spec must not make `validate` post a secret to a URL it chose)."""
    import base64
    import http.server
    import threading

    seen: list[str | None] = []

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = json.dumps({"id": 1, "schema": json.dumps(V1)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("RIVERHOUSE_SECRET_OTHER__PW", "not-yours")
    monkeypatch.setenv("RIVERHOUSE_SECRET_AV__PW", "yours")
    try:
        other = {"url": url, "auth": {"username": "svc", "password": "${env:RIVERHOUSE_SECRET_OTHER__PW}"}}
        with pytest.raises(SpecError, match="RIVERHOUSE_SECRET_OTHER__PW"):
            parse_spec(spec_data(schema_registry=other))
        assert seen == []  # refused before any request
        own = {"url": url, "auth": {"username": "svc", "password": "${env:RIVERHOUSE_SECRET_AV__PW}"}}
        spec = parse_spec(spec_data(schema_registry=own))
        assert [f.name for f in spec.sources["s"].fields] == ["id", "n"]
        assert seen == ["Basic " + base64.b64encode(b"svc:yours").decode()]
    finally:
        server.shutdown()


def test_registry_credentials_follow_a_redirect_on_the_same_host_only() -> None:
    """A registry that redirects (a proxy, a moved endpoint, a hostile URL): the credentials go on
    to a path on the same host and port, not to another host ("localhost" is another host name to
    urllib than 127.0.0.1)."""
    import http.server
    import threading

    from riverhouse.platform.avro.registry import Registry

    seen: dict[str, str | None] = {}

    class Target(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen["target"] = self.headers.get("Authorization")
            body = json.dumps({"schema": json.dumps(V1)}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    target = http.server.HTTPServer(("127.0.0.1", 0), Target)

    class Redirecting(Target):
        def do_GET(self) -> None:
            if self.path.startswith("/moved/"):  # the same host and port
                seen["moved"] = self.headers.get("Authorization")
                super().do_GET()
                return
            seen["registry"] = self.headers.get("Authorization")
            self.send_response(307)
            where = f"http://localhost:{target.server_address[1]}" if "/ids/7" in self.path else "/moved"
            self.send_header("Location", f"{where}{self.path}")
            self.end_headers()

    registry = http.server.HTTPServer(("127.0.0.1", 0), Redirecting)
    for server in (target, registry):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Registry(f"http://127.0.0.1:{registry.server_address[1]}", username="svc", password="pw")
        assert json.loads(client.schema(7)) == V1  # to another host
        assert seen["registry"] is not None and seen["registry"].startswith("Basic ")
        assert seen["target"] is None
        assert json.loads(client.schema(8)) == V1  # to another path on the registry's host
        assert seen["moved"] == seen["registry"]
    finally:
        registry.shutdown()
        target.shutdown()


@pytest.mark.parametrize(("failures", "answered"), [(2, True), (3, False)])
def test_a_registry_blip_is_retried_then_named(monkeypatch: pytest.MonkeyPatch, failures: int, answered: bool) -> None:
    """A 503 (a registry restarting behind its proxy) is tried three times in all: a blip that
    ends in time is not an error; one that does not is named with the registry's answer."""
    import http.server
    import threading

    from riverhouse.platform.avro import registry as registry_module
    from riverhouse.platform.avro.registry import Registry, RegistryUnreachable

    monkeypatch.setattr(registry_module, "RETRY_PAUSES_S", (0.01, 0.01))
    calls: list[str] = []

    class Blipping(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            calls.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            if len(calls) <= failures:
                self.send_response(503)
                self.end_headers()
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"id": 42}')

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Blipping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Registry(f"http://127.0.0.1:{server.server_address[1]}")
        if answered:
            assert client.register("t-value", json.dumps(V1)) == 42
        else:
            with pytest.raises(RegistryUnreachable, match=r"answered HTTP 503 for subjects/t-value/versions"):
                client.register("t-value", json.dumps(V1))
        assert len(calls) == 3 and len(set(calls)) == 1  # the same registration each time
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("failure", "reason"),
    [("proxy_503", r"answered HTTP 503"), ("broken_answer", r"its answer broke off: IncompleteRead")],
)
def test_a_registry_behind_a_failing_proxy_counts_as_unreachable(
    monkeypatch: pytest.MonkeyPatch, failure: str, reason: str
) -> None:
    """A proxy answering 503 for a registry that is down, or an answer that breaks off mid-body, is
    the registry being unreachable: a source's batch keeps the schemas it already fetched (a
    backfill, which must read every version, fails naming it), never a bare HTTP error or a trace."""
    import http.server
    import threading

    from riverhouse.platform.avro import registry as registry_module
    from riverhouse.platform.avro.registry import RegistryUnreachable
    from riverhouse.platform.ingest.avro import WriterSchemas

    monkeypatch.setattr(registry_module, "RETRY_PAUSES_S", (0.01, 0.01))
    calls: list[str] = []

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            calls.append(self.path)
            if failure == "proxy_503":
                self.send_response(503)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"[1, 2")  # then the connection closes: 5 of the 100 bytes promised
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        src = parse_spec(spec_data(avro_schema=V1, schema_registry={"url": url})).sources["s"]
        client = src.schema_registry.client()  # type: ignore[union-attr]
        client.cache[7] = json.dumps(V1)  # fetched by an earlier batch of the run
        writers = WriterSchemas.fetch(src, client)
        assert (writers.complete, writers.schemas) == (False, {7: json.dumps(V1)})
        assert calls == ["/subjects/t-value/versions"] * 3  # tried three times, then the cache
        with pytest.raises(RegistryUnreachable, match=rf"cannot reach the schema registry at {url} \({reason}"):
            WriterSchemas.fetch(src, client, must_answer=True)
    finally:
        server.shutdown()
