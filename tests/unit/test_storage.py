"""Object storage settings: one RIVERHOUSE_STORAGE_OPTIONS for Spark's S3A, pyarrow and delta-rs.

The end-to-end run on an S3 server is tests/integration/test_object_storage.py.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from riverhouse.platform.runtime import engine
from riverhouse.platform.runtime.spark import REDACTION_CONF, session_conf
from riverhouse.platform.state.delta_log import filesystem
from riverhouse.platform.state.storage import (
    StorageOptionsError,
    object_store,
    s3a_conf,
    s3a_env,
    spark_uri,
    storage_options,
)
from riverhouse.platform.state.tables import TableLayout

pytestmark = pytest.mark.unit

SECRET = "wJalrXUtnFEMI-test-secret"
OPTIONS = {
    "AWS_ACCESS_KEY_ID": "AKIATEST",
    "AWS_SECRET_ACCESS_KEY": SECRET,
    "AWS_SESSION_TOKEN": "session-token-value",
    "AWS_REGION": "eu-west-1",
    "AWS_ENDPOINT_URL": "http://minio:9000",
    "AWS_ALLOW_HTTP": "true",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "RIVERHOUSE_STORAGE_OPTIONS",
        "RIVERHOUSE_SPARK_CONF",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT",
        "AWS_ENDPOINT_URL_S3",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
        "RIVERHOUSE_SPARK_REMOTE",
    ):
        monkeypatch.delenv(name, raising=False)


def with_options(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    monkeypatch.setenv("RIVERHOUSE_STORAGE_OPTIONS", json.dumps({**OPTIONS, **extra}))


def test_spark_writes_s3_warehouses_through_s3a() -> None:
    assert spark_uri("s3://bucket/wh") == "s3a://bucket/wh"
    assert spark_uri("s3a://bucket/wh") == "s3a://bucket/wh"
    assert spark_uri("/data/wh") == "/data/wh"
    assert TableLayout("s3://bucket/wh/", "p").silver("orders") == "s3a://bucket/wh/silver/p/orders"
    assert TableLayout("/data/wh", "p").bronze("orders") == "/data/wh/bronze/p/orders"


def test_s3a_settings_follow_the_storage_options(monkeypatch: pytest.MonkeyPatch) -> None:
    with_options(monkeypatch)
    conf = s3a_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"  # as delta-rs addresses a custom endpoint
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.delta.logStore.s3a.impl"] == "io.delta.storage.S3SingleDriverLogStore"
    # The keys go to the JVM's environment, never into a setting.
    assert not any(SECRET in v or "AKIATEST" in v or "session-token" in v for v in conf.values())
    assert s3a_env() == {
        "AWS_ACCESS_KEY_ID": "AKIATEST",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": "session-token-value",
    }

    with_options(monkeypatch, AWS_ENDPOINT_URL="https://s3.example.com", AWS_VIRTUAL_HOSTED_STYLE_REQUEST="true")
    conf = s3a_conf()
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "false"


def test_no_options_means_the_providers_own_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    assert storage_options() == {} and s3a_env() == {}
    assert set(s3a_conf()) == {"spark.delta.logStore.s3a.impl", "spark.delta.logStore.s3.impl"}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://localhost:9000")  # delta-rs reads the environment too
    assert s3a_conf()["spark.hadoop.fs.s3a.endpoint"] == "http://localhost:9000"


def test_storage_options_that_are_not_json_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIVERHOUSE_STORAGE_OPTIONS", "AWS_REGION=eu-west-1")
    with pytest.raises(StorageOptionsError, match="RIVERHOUSE_STORAGE_OPTIONS is not JSON"):
        storage_options()


def test_sessions_and_the_engine_get_the_s3a_settings_and_keys_only_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with_options(monkeypatch)
    local = session_conf("local[2]")
    assert local["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert SECRET not in json.dumps(local)
    cluster = session_conf("spark://master:7077")  # executors get the keys from Spark's Hadoop conf
    assert cluster["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000" and SECRET not in json.dumps(cluster)
    monkeypatch.setenv("RIVERHOUSE_SPARK_CONF", json.dumps({"spark.hadoop.fs.s3a.path.style.access": "false"}))
    assert session_conf("local[2]")["spark.hadoop.fs.s3a.path.style.access"] == "false"  # the user's wins

    monkeypatch.delenv("RIVERHOUSE_SPARK_CONF")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    argv, env = engine.server_command(tmp_path, "local[2]", "1g", "127.0.0.1", 15556)
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRET and env["AWS_ACCESS_KEY_ID"] == "AKIATEST"
    conf_text = Path(argv[argv.index("--properties-file") + 1]).read_text()
    assert "spark.hadoop.fs.s3a.endpoint=http://minio:9000\n" in conf_text
    assert SECRET not in conf_text and SECRET not in " ".join(argv)


def test_the_drivers_reads_use_the_same_endpoint_for_s3_and_s3a(monkeypatch: pytest.MonkeyPatch) -> None:
    with_options(monkeypatch)
    for uri in ("s3://bucket/wh/silver/p/o", "s3a://bucket/wh/silver/p/o"):
        fs, path = filesystem(uri)
        assert isinstance(fs, pafs.S3FileSystem) and path == "bucket/wh/silver/p/o"
        assert fs.region == "eu-west-1"
    fs, path = object_store("s3a://bucket/x")
    assert path == "bucket/x"


def test_a_local_driver_jvm_starts_with_the_keys_and_this_process_keeps_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from riverhouse.platform.runtime.spark import _launch_env

    with_options(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-the-environment")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with _launch_env("local[2]"):  # pyspark starts the JVM with os.environ inside this block
        assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIATEST" and os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET
    assert os.environ["AWS_ACCESS_KEY_ID"] == "from-the-environment"
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ


def test_s3a_settings_that_hold_secrets_are_redacted() -> None:
    redact = re.compile(REDACTION_CONF["spark.redaction.regex"])
    for key in (
        "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.session.token",
        "spark.hadoop.fs.s3a.encryption.key",  # SSE-C: the customer's key itself
        "spark.hadoop.fs.s3a.bucket.riverhouse.secret.key",
    ):
        assert redact.search(key), key


def test_without_jvm_lib_ivy_fetches_hadoop_aws_without_the_sdk_bundle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from riverhouse.platform.runtime import jars

    monkeypatch.setenv("RIVERHOUSE_JARS", str(tmp_path))  # no spark/ folder: spark.jars.packages
    conf = jars.spark_conf()
    assert any(c.startswith("org.apache.hadoop:hadoop-aws:") for c in conf["spark.jars.packages"].split(","))
    assert conf["spark.jars.excludes"] == "software.amazon.awssdk:bundle"
