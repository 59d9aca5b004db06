"""The import corpus: configs in the shapes users really have (tests/fixtures/migrate/corpus), each imported
and validated as `riverhouse import` + `riverhouse validate` do, with what it must map, say and refuse.

The fixtures are written for these tests in the shapes of public GlassFlow and KaflowSQL configs (nested
fields and join keys, maps and arrays, keys GlassFlow ignores, older version strings, filters over missing
values, untyped KaflowSQL inputs); no third-party file is copied.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from riverhouse.cli import app
from riverhouse.platform.importers.glassflow import import_glassflow
from riverhouse.platform.importers.kaflowsql import import_kaflowsql
from riverhouse.platform.importers.report import ImporterError, ImportResult
from riverhouse.platform.sink.clickhouse import expected_columns
from riverhouse.platform.spec import PipelineSpec, SpecError, load_spec

pytestmark = pytest.mark.unit

CORPUS = Path(__file__).parents[1] / "fixtures" / "migrate" / "corpus"


def imported(name: str, tmp_path: Path) -> tuple[ImportResult, PipelineSpec]:
    """Import a corpus file, write the spec beside the test, and load it as `riverhouse validate` does."""
    path = CORPUS / name
    result = import_kaflowsql(path) if name.startswith("kf_") else import_glassflow(path, tmp_path / "spec.yaml")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(result.to_yaml())
    return result, load_spec(spec_path)


def load_spec_text(text: str, tmp_path: Path) -> PipelineSpec:
    (tmp_path / "spec.yaml").write_text(text)
    return load_spec(tmp_path / "spec.yaml")


def fields_of(spec: PipelineSpec, source: str) -> dict[str, tuple[str, str]]:
    return {f.name: (f.type, f.path_text) for f in spec.sources[source].fields}


def notes(result: ImportResult) -> str:
    return "\n".join(result.notes)


def test_every_importable_corpus_config_imports_and_validates(tmp_path: Path) -> None:
    importable = sorted(p.name for p in CORPUS.iterdir() if p.name not in ("kf_select_star.yaml", "kf_group_by.yaml"))
    assert len(importable) == 9
    for name in importable:
        imported(name, tmp_path)


def test_nested_fields_arrays_and_maps_keep_every_column(tmp_path: Path) -> None:
    result, spec = imported("gf_v3_nested_dedup.json", tmp_path)
    assert result.unmapped == []
    # Nested names are paths; each field takes its sink column's name, so no SQL is needed to rename.
    assert fields_of(spec, "signups") == {
        "account_id": ("string", "account.id"),
        "event_id": ("string", "event_id"),
        "name": ("string", "account.profile.name"),
        "age": ("int", "account.profile.age"),
        "labels": ("array<string>", "labels"),
        "scores": ("array<double>", "scores"),
        "context": ("map<string,string>", "context"),
        "signed_up_at": ("timestamp", "signed_up_at"),
    }
    assert spec.query is None and spec.join is None
    signups = spec.sources["signups"]
    assert signups.key == ["account_id"] and signups.dedup is not None and signups.dedup.key == ["account_id"]
    columns = dict(expected_columns(spec))
    assert columns["labels"] == "Array(Nullable(String))" and columns["scores"] == "Array(Nullable(Float64))"
    assert columns["context"] == "Map(String, Nullable(String))"  # never Nullable(Map): missing loads as {}
    assert columns["account_id"] == "String" and columns["age"] == "Nullable(Int32)"


def test_nested_join_key_older_version_and_join_key_type(tmp_path: Path) -> None:
    result, spec = imported("gf_v2_nested_join.json", tmp_path)
    assert {u.setting for u in result.unmapped} == {"source.provider", "sink.provider"}
    assert "version '2.0.0': read as v2" in notes(result)
    assert fields_of(spec, "buyers") == {
        "buyer_id": ("string", "buyer.id"),  # the nested join key, declared by the join's join_key_type
        "buyer_name": ("string", "buyer.name"),
        "tiers": ("array<string>", "tiers"),
    }
    # The v2 filter names the rows to drop; a missing status is an ordinary value, so it is kept.
    assert spec.query is not None
    assert "WHERE NOT (purchases.status <=> 'cancelled')" in " ".join(spec.query.split())
    plan = spec.plan
    assert [(s.source, [(k.base_column, k.column) for k in s.keys]) for s in plan.steps] == [
        ("buyers", [("buyer_id", "buyer_id")])
    ]
    assert plan.output_names == ["purchase_id", "buyer_id", "amount", "status", "buyer_name", "tiers"]
    assert spec.sources["buyers"].dedup is not None and spec.sources["buyers"].dedup.key == ["buyer_id"]


def test_record_key_fallback_never_picks_a_map_or_array_and_says_which(tmp_path: Path) -> None:
    result, spec = imported("gf_v2_logs_maps.json", tmp_path)
    logs = spec.sources["app_logs"]
    assert logs.key == ["Timestamp"] and logs.dedup is None  # the maps mapped first are skipped
    assert "'Timestamp' (the first mapped field that is not an array or map) becomes the record key" in notes(result)
    assert fields_of(spec, "app_logs")["LogAttributes"] == ("map<string,string>", "Attributes")
    assert fields_of(spec, "app_logs")["Events_Attributes"] == ("array<map<string,string>>", "Events.Attributes")
    payload = logs.field("Payload")
    assert (payload.type, payload.allow_json_text) == ("string", True)  # an object into a String column: JSON text
    assert "column Events.Name is named Events_Name" in notes(result)


def test_keys_glassflow_ignores_are_accepted_mapped_or_named(tmp_path: Path) -> None:
    result, spec = imported("gf_v2_legacy_keys.json", tmp_path)
    # Only the key that means nothing is reported (and fails --strict); the others are mapped.
    assert [(u.setting, "ignores unknown keys" in u.reason) for u in result.unmapped] == [("ui_state", True)]
    assert spec.kafka.security is not None and spec.kafka.security.protocol == "SASL_SSL"  # sasl_tls_enable: true
    assert "sasl_tls_enable: true: TLS is on" in notes(result)
    assert spec.join is not None and (spec.join.on.left, spec.join.on.right) == (["session"], ["session_id"])
    assert "join.sources[0].key: read as the join key" in notes(result)
    assert spec.join.select == {
        "click_id": "clicks.click_id",
        "duration_ms": "clicks.ms",
        "country": "sessions.country",
    }
    assert "sink.source_id 'clicks': the sink loads the join's output" in notes(result)
    assert spec.sink.batch_size == 100_000  # max_batch_size 0: GlassFlow's unset value, the default applies

    runner = CliRunner()
    out = tmp_path / "strict.yaml"
    strict = runner.invoke(
        app, ["import", "glassflow", str(CORPUS / "gf_v2_legacy_keys.json"), "-o", str(out), "--strict"]
    )
    assert strict.exit_code == 1 and "ui_state" in strict.output and not out.exists()


def test_enterprise_schema_fields_and_registry(tmp_path: Path) -> None:
    result, spec = imported("gf_v3_enterprise_schema.yaml", tmp_path)
    assert {u.setting for u in result.unmapped} == {
        "sources[0].schema_registry",
        "sources[0].schema_version",
        "sources[0].connection_params.root_ca",  # not PEM
        "metadata.tags",
    }
    assert fields_of(spec, "payments") == {
        "payment_id": ("string", "payment_id"),
        "brand": ("string", "card.brand"),
        "amount": ("float", "amount"),  # float into Float32
        "paid_at": ("timestamp", "timestamp"),
    }
    assert spec.sources["payments"].dedup is not None
    assert spec.sources["payments"].dedup.window == timedelta(hours=2)


def test_an_avro_source_with_a_registry_becomes_an_avro_source(tmp_path: Path) -> None:
    result, spec = imported("gf_v3_avro_registry.yaml", tmp_path)
    assert {u.setting for u in result.unmapped} == {"sources[0].schema_version"}  # every version is read
    src = spec.sources["payments"]
    assert src.format == "avro"
    assert src.schema_registry is not None and src.schema_registry.url == "https://registry:8081"
    # The credentials become the pipeline's own secret references, never the values.
    assert src.schema_registry.auth is not None
    assert src.schema_registry.auth.password == "${env:RIVERHOUSE_SECRET_PAYMENTS_AVRO__REGISTRY_PASSWORD}"
    assert "SECRET-not-copied" not in result.to_yaml() and "KEY-not-copied" not in result.to_yaml()
    # The reader schema is the declared fields, every one optional, a dotted one as a nested record.
    reader = json.loads(str(src.avro_schema))
    assert [(f["name"], f["type"]) for f in reader["fields"]][:1] == [("payment_id", ["null", "string"])]
    card = next(f for f in reader["fields"] if f["name"] == "card")
    assert card["type"][1]["fields"] == [{"name": "brand", "type": ["null", "string"], "default": None}]
    assert fields_of(spec, "payments")["brand"] == ("string", "card.brand")
    assert spec.sources["payments"].dedup is not None


def test_an_avro_number_into_a_datetime_column_stays_a_number(tmp_path: Path) -> None:
    """An Avro time carries its unit in its schema (epoch_unit is for JSON): the number is loaded as it is."""
    config = yaml.safe_load((CORPUS / "gf_v3_avro_registry.yaml").read_text())
    config["sources"][0]["schema"]["fields"].append({"name": "settled", "type": "int64"})
    config["sink"]["mapping"].append({"name": "settled", "column_name": "settled", "column_type": "DateTime"})
    path = tmp_path / "avro_seconds.yaml"
    path.write_text(yaml.safe_dump(config))
    result = import_glassflow(path, tmp_path / "spec.yaml")
    spec = load_spec_text(result.to_yaml(), tmp_path)
    settled = next(f for f in spec.sources["payments"].fields if f.name == "settled")
    assert (settled.type, settled.epoch_unit) == ("long", None)
    assert any("'settled' holds Unix seconds: Riverhouse loads it as a number" in n for n in result.notes)


def test_filters_and_transforms_with_expr_lang_meaning(tmp_path: Path) -> None:
    result, spec = imported("gf_v3_filters_and_transforms.json", tmp_path)
    reasons = {u.setting: u.reason for u in result.unmapped}
    assert set(reasons) == {"transforms[2].config.transforms[2]", "transforms[2].config.transforms[3]"}
    assert "adds a string and a number" in reasons["transforms[2].config.transforms[2]"]
    assert "parseUserAgent() is a GlassFlow helper function" in reasons["transforms[2].config.transforms[3]"]
    query = " ".join((spec.query or "").split())
    # != keeps a missing status (null-safe), ** is power(), + of two strings is concat().
    assert "WHERE ((NOT (logins.status <=> 'failed')) AND (power(logins.attempts, 2) < 100))" in query
    assert "CAST(concat(concat(logins.user_first, ' '), logins.user_last) AS STRING) AS full_name" in query
    assert spec.plan.output_names == ["event_id", "status", "full_name"]


def test_kaflowsql_inputs_are_typed_from_the_query(tmp_path: Path) -> None:
    result, spec = imported("kf_untyped_inference.yaml", tmp_path)
    rides = {n: t for n, (t, _) in fields_of(spec, "rides").items()}
    assert rides == {
        "ride_id": "string",
        "rider_id": "long",  # output.schema
        "distance_km": "double",  # compared with 2
        "fare": "double",  # arithmetic
        "driver_id": "string",  # nothing says otherwise
        "surge": "boolean",  # a condition on its own
        "city": "string",  # compared with strings
    }
    drivers = {n: t for n, (t, _) in fields_of(spec, "drivers").items()}
    assert drivers == {"rating": "double", "active": "boolean", "driver_id": "string"}
    said = notes(result)
    assert "rides.distance_km double (compared with 2)" in said and "rides.fare double (used in `r.fare * 1.2`)" in said
    assert "typed string, nothing in the query says otherwise (check them): drivers.driver_id, rides.driver_id" in said


def test_kaflowsql_nested_columns_json_keys_and_any(tmp_path: Path) -> None:
    result, spec = imported("kf_nested_any.yaml", tmp_path)
    assert fields_of(spec, "orders") == {
        "order_id": ("string", "order_id"),
        "customer_id": ("string", "customer.id"),  # o.customer.id, also the join key
        "meta_channel": ("string", "meta.channel"),  # o.meta ->> 'channel'
        "tags": ("array<string>", "tags"),  # 'gift' = ANY(o.tags)
    }
    plan = spec.plan
    assert [(k.base_column, k.column) for k in plan.steps[0].keys] == [("customer_id", "customer_id")]
    assert plan.where is not None and "ARRAY_CONTAINS(`o__tags`, 'gift')" in plan.where
    assert "orders.tags array<string> (matched with = ANY(...))" in notes(result)


@pytest.mark.parametrize(
    ("name", "what", "hint"),
    [
        ("kf_select_star.yaml", "`SELECT *`: KaflowSQL passes every field through", "list the columns you want"),
        ("kf_group_by.yaml", "`GROUP BY v.user_id` (aggregation)", "aggregate in ClickHouse"),
    ],
)
def test_kaflowsql_queries_a_pipeline_cannot_run_say_what_to_do(name: str, what: str, hint: str) -> None:
    with pytest.raises(ImporterError) as err:
        import_kaflowsql(CORPUS / name)
    [(where, message, said_hint)] = err.value.problems
    assert where == "query" and message.startswith(what) and hint in said_hint


def test_kaflowsql_any_subquery_and_json_arrow_messages(tmp_path: Path) -> None:
    base = (CORPUS / "kf_nested_any.yaml").read_text()
    cases = {
        "WHERE 'gift' = ANY(SELECT t FROM gifts)": "subquery",
        "WHERE 'gift' > ANY(o.tags)": "a match against an array is read as `x = ANY(t.array_column)`",
        "WHERE o.meta -> 'channel' = 'web'": "(-> returns JSON)",
    }
    for where, message in cases.items():
        path = tmp_path / "pipeline.yaml"
        path.write_text(base.replace("WHERE 'gift' = ANY(o.tags)", where))
        with pytest.raises(ImporterError, match=message.replace("(", r"\(").replace(")", r"\)")):
            import_kaflowsql(path)


# ---------------------------------------------------------------------------- encodings
def encoded(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_utf8_bom_is_accepted_everywhere(tmp_path: Path) -> None:
    text = (CORPUS / "gf_v3_nested_dedup.json").read_text()
    config = encoded(tmp_path, "bom.json", b"\xef\xbb\xbf" + text.encode())
    result = import_glassflow(config)
    spec = encoded(tmp_path, "bom.yaml", b"\xef\xbb\xbf" + result.to_yaml().encode())
    assert load_spec(spec).name == "signups_dedup"
    kaflow = encoded(tmp_path, "bom_kf.yaml", b"\xef\xbb\xbf" + (CORPUS / "kf_nested_any.yaml").read_bytes())
    assert import_kaflowsql(kaflow).spec["name"] == "tagged_orders"


@pytest.mark.parametrize(
    ("data", "looks_like"),
    [
        ('{"pipeline_id": "caf\u00e9"}'.encode("latin-1"), "another encoding"),
        ('{"pipeline_id": "x"}'.encode("utf-16"), "UTF-16"),
    ],
)
def test_text_that_is_not_utf8_is_a_clear_error_not_a_traceback(tmp_path: Path, data: bytes, looks_like: str) -> None:
    config = encoded(tmp_path, "config.json", data)
    with pytest.raises(ImporterError, match=f"not UTF-8 text: byte 0x.. at line 1, column .*{looks_like}"):
        import_glassflow(config)
    with pytest.raises(ImporterError, match="not UTF-8 text"):
        import_kaflowsql(encoded(tmp_path, "pipeline.yaml", data))
    spec = encoded(tmp_path, "spec.yaml", data)
    with pytest.raises(SpecError, match="not UTF-8 text"):
        load_spec(spec)
    runner = CliRunner()
    for args in (["import", "glassflow", str(config)], ["validate", str(spec)]):
        out = runner.invoke(app, args)
        assert out.exit_code == 1 and "not UTF-8 text" in out.output and "Traceback" not in out.output


def test_latin1_error_names_the_line_and_column(tmp_path: Path) -> None:
    data = b'name: p\ndescription: "na\xefve"\n'
    with pytest.raises(SpecError, match="byte 0xef at line 2, column 17"):
        load_spec(encoded(tmp_path, "spec.yaml", data))


def test_record_key_from_the_schema_when_every_column_is_computed(tmp_path: Path) -> None:
    config = json.loads((CORPUS / "gf_v3_filters_and_transforms.json").read_text())
    config["transforms"] = [config["transforms"][2]]  # no filter, no dedup: only transforms
    config["sink"]["mapping"] = [m for m in config["sink"]["mapping"] if m["name"] in ("full_name", "device")]
    path = tmp_path / "computed.json"
    path.write_text(json.dumps(config))
    result = import_glassflow(path)
    assert "'event_id' (no mapped field can be a key: the first field of the schema" in notes(result)
    assert result.validate().plan.output_names == ["full_name"]


def test_a_described_but_disabled_join_says_how_to_import_it(tmp_path: Path) -> None:
    config = json.loads((CORPUS / "gf_v2_nested_join.json").read_text())
    config["join"]["enabled"] = False
    path = tmp_path / "disabled.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ImporterError, match=r"join\.enabled is false, though join describes the streams"):
        import_glassflow(path)
