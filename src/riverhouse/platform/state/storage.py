"""Object storage: one set of settings for Spark (Hadoop's S3A) and the driver's own reads.

delta-spark writes every table through Hadoop's S3A file system; the driver reads the Delta log
and the files a commit added through pyarrow, and delta-rs reads tables (change feed, file
statistics). All three take the same settings: `RIVERHOUSE_STORAGE_OPTIONS` (JSON, delta-rs style
keys: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL,
AWS_ALLOW_HTTP, AWS_VIRTUAL_HOSTED_STYLE_REQUEST), else the provider's usual chain (environment
AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, instance or pod role).

Spark gets `s3a://` paths (`s3://` is mapped: delta-spark reaches S3 only through S3A) and
`spark.hadoop.fs.s3a.*` settings without secrets; the keys reach Spark's JVM in its environment,
so they are in no Spark setting, plan or UI page. Spark itself copies AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN of the driver's environment into its Hadoop
configuration (SparkHadoopUtil), which travels with each task: a cluster's executors get them
from there, not from their own environment (tests/integration/test_object_storage.py runs a
standalone cluster whose workers have none). Spark redacts those Hadoop keys where it shows them
(runtime/spark.py REDACTION_CONF). An instance or pod role needs no key at all.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow.fs as pafs

# The environment variables S3A's default credential chain (EnvironmentVariableCredentialsProvider)
# and every AWS SDK read.
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# Delta's LogStore for S3 paths (its default, stated): S3 had no atomic put-if-absent when Delta
# chose it, so this store makes a commit atomic among the writers of ONE JVM only. Riverhouse's
# writers of a table are serialised by the pipeline's locks (checkpoints folder) and, under the
# engine, share one JVM; two hosts writing one pipeline's tables need one shared checkpoints volume
# (or S3DynamoDBLogStore through RIVERHOUSE_SPARK_CONF and its jar). See docs/deployment.md.
LOGSTORE_CONF = {
    "spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore",
    "spark.delta.logStore.s3.impl": "io.delta.storage.S3SingleDriverLogStore",
}


class StorageOptionsError(ValueError):
    """RIVERHOUSE_STORAGE_OPTIONS cannot be used; the message says why."""


def storage_options() -> dict[str, str]:
    raw = os.environ.get("RIVERHOUSE_STORAGE_OPTIONS")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise StorageOptionsError(
            'RIVERHOUSE_STORAGE_OPTIONS is not JSON: write an object such as {"AWS_REGION": "eu-west-1"}'
        ) from None
    return {str(k).upper(): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _setting(options: dict[str, str], *names: str) -> str | None:
    """The first of `names` in the storage options, else in the environment (delta-rs reads both)."""
    for name in names:
        if options.get(name):
            return options[name]
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    return None


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def spark_uri(path: str) -> str:
    """The path as Spark writes it: `s3://` becomes `s3a://` (Hadoop's S3 file system); others unchanged."""
    return "s3a://" + path[len("s3://") :] if path.startswith("s3://") else path


def s3a_conf() -> dict[str, str]:
    """`spark.hadoop.fs.s3a.*` settings from the storage settings delta-rs uses, and Delta's S3 LogStore.

    Endpoint, region and path-style access; never a key (see s3a_env).
    """
    options = storage_options()
    conf = dict(LOGSTORE_CONF)
    endpoint = _setting(options, "AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(not endpoint.startswith("http://")).lower()
        # delta-rs (object_store) addresses a custom endpoint path-style unless told otherwise;
        # S3-compatible servers (MinIO, Ceph, moto) mostly need it.
        virtual = _true(_setting(options, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST"))
        conf["spark.hadoop.fs.s3a.path.style.access"] = str(not virtual).lower()
    region = _setting(options, "AWS_REGION", "AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf


def s3a_env() -> dict[str, str]:
    """Credentials of RIVERHOUSE_STORAGE_OPTIONS as the environment variables S3A's chain reads.

    Given to Spark's JVM (the engine, a local session's driver) at its start; Spark hands them to
    its executors in the Hadoop configuration of each task. Without a key in the
    options nothing is given: the JVM inherits the environment's own AWS_* variables, if any.
    """
    options = storage_options()
    if not options.get("AWS_ACCESS_KEY_ID"):
        return {}
    return {name: options[name] for name in CREDENTIAL_ENV if options.get(name)}


def object_store(uri: str) -> tuple[pafs.FileSystem, str]:
    """(file system, path within it) for an `s3://` (or `s3a://`), `gs://`... URI."""
    options = storage_options()
    if uri.startswith("s3a://"):
        uri = "s3://" + uri[len("s3a://") :]
    if uri.startswith("s3://"):
        kwargs: dict[str, Any] = {}
        if "AWS_ACCESS_KEY_ID" in options:
            kwargs["access_key"] = options["AWS_ACCESS_KEY_ID"]
            kwargs["secret_key"] = options.get("AWS_SECRET_ACCESS_KEY", "")
            if "AWS_SESSION_TOKEN" in options:
                kwargs["session_token"] = options["AWS_SESSION_TOKEN"]
        region = _setting(options, "AWS_REGION", "AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        endpoint = _setting(options, "AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3")
        if endpoint:
            scheme, _, rest = endpoint.partition("://")
            kwargs["endpoint_override"] = rest or endpoint
            kwargs["scheme"] = scheme if rest else "https"
            kwargs["force_virtual_addressing"] = _true(_setting(options, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST"))
        bucket_and_path = uri[len("s3://") :]
        return pafs.S3FileSystem(**kwargs), bucket_and_path
    return pafs.FileSystem.from_uri(uri)
